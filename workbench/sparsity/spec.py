"""Sparsity specs: what to make sparse, how much, and in which layers.

Comma-separated items (``none`` for nothing)::

    ffn-topk=0.9          FFN activation top-k: keep the 10% largest |gelu(gate)| per token, every layer
    ffn-stat=0.95@0-9     Gemma 3n statistical top-k on layers 0..9: keep gate > mean + k*std, k = Phi^-1(0.95)
    nm=2:4                N:M magnitude pruning of the layer weights (2 of every 4 along the input dim)
    nm=2:4@ffn            ... of the FFN weights only (also attn, or one kind such as ffn_down)
    ffn-down=int8         how the sparse FFN stores the ffn_down columns it reads (transposed): fp32 (exact,
                          default), fp16, or int8 with one scale per column (a re-quantization of ffn_down)
    attn-window=128       every attention layer local with a 128-token window (global layers included)
    attn-blocks=64:1:4    block-sparse attention: keys in blocks of 64 tokens; a query sees the first 1 block
                          (sink) and the last 4 blocks up to its own; ``64:1:4:8`` also every 8th block;
                          ``@5+11+17`` on those layers only

Targets are fractions in [0, 1); layer lists as in quant specs (``N``, ``N-M`` joined by ``+``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..quant.spec import GROUPS, LAYER_KINDS, SpecError, parse_layers

FFN_METHODS = ("topk", "stat")
DOWN_FORMATS = ("fp32", "fp16", "int8")


@dataclass(frozen=True)
class FfnSparsity:
    method: str  # topk | stat
    target: float  # fraction of FFN activations set to zero
    layers: frozenset[int] | None  # None: every layer
    down: str = "fp32"  # storage of the transposed ffn_down columns (DOWN_FORMATS)

    def applies(self, layer: int) -> bool:
        return self.layers is None or layer in self.layers


@dataclass(frozen=True)
class AttnBlocks:
    """Block-sparse attention: key block ``kb = position // block`` is visible to a query in block ``qb``
    when ``kb < sink``, ``qb - local < kb <= qb``, or (``stride`` > 0) ``kb % stride == 0`` (always with
    causality and the layer's own window)."""

    block: int
    sink: int
    local: int
    stride: int = 0
    layers: frozenset[int] | None = None

    def applies(self, layer: int) -> bool:
        return self.layers is None or layer in self.layers

    @property
    def text(self) -> str:
        return f"{self.block}:{self.sink}:{self.local}" + (f":{self.stride}" if self.stride else "")


@dataclass(frozen=True)
class NMSparsity:
    n: int
    m: int
    kinds: tuple[str, ...]
    layers: frozenset[int] | None


@dataclass(frozen=True)
class SparsitySpec:
    text: str
    ffn: FfnSparsity | None = None
    nm: NMSparsity | None = None
    attn_window: int = 0
    attn_blocks: AttnBlocks | None = None

    @property
    def is_dense(self) -> bool:
        return self.ffn is None and self.nm is None and not self.attn_window and self.attn_blocks is None


def check_fraction(value: float, what: str) -> float:
    if not 0.0 <= value < 1.0:
        raise SpecError(f"{what}: sparsity {value} is outside [0, 1)")
    return value


def parse_sparsity(text: str | None, n_layers: int | None = None) -> SparsitySpec:
    """Parse a sparsity spec (see the module docstring); ``n_layers`` checks layer numbers when given."""
    text = (text or "none").strip()
    items = [s.strip() for s in text.split(",") if s.strip()]
    if items in ([], ["none"]):
        return SparsitySpec("none")
    ffn = nm = blocks = None
    window = 0
    down = None
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SpecError(
                f"sparsity item {item!r} is not NAME=VALUE (e.g. ffn-topk=0.9, nm=2:4, attn-window=128)"
            )
        value, _, layer_text = value.partition("@")
        key = key.strip()
        if key == "ffn-down":
            if value.strip() not in DOWN_FORMATS:
                raise SpecError(f"sparsity item {item!r}: ffn-down takes one of {', '.join(DOWN_FORMATS)}")
            if layer_text:
                raise SpecError(
                    f"sparsity item {item!r}: ffn-down follows the FFN item's layers (no @LAYERS)"
                )
            down = value.strip()
        elif key.startswith("ffn-"):
            method = key[4:]
            if method not in FFN_METHODS:
                raise SpecError(
                    f"sparsity item {item!r}: unknown FFN method {method!r} (use ffn-topk, ffn-stat or ffn-down)"
                )
            try:
                target = float(value)
            except ValueError:
                raise SpecError(f"sparsity item {item!r}: {value!r} is not a number") from None
            layers = parse_layers(layer_text, n_layers, item) if layer_text else None
            ffn = FfnSparsity(method, check_fraction(target, f"sparsity item {item!r}"), layers)
        elif key == "nm":
            m = re.fullmatch(r"(\d+):(\d+)", value.strip())
            if not m or not 0 < int(m.group(1)) < int(m.group(2)):
                raise SpecError(f"sparsity item {item!r}: N:M needs 0 < N < M, e.g. nm=2:4")
            kinds, layers = LAYER_KINDS, None
            first, _, rest = layer_text.partition("@")
            if re.fullmatch(r"[\d+\-]+", first):
                layers = parse_layers(first, n_layers, item)
            elif first:
                kinds = GROUPS.get(first, (first,))
                if any(k not in LAYER_KINDS for k in kinds):
                    raise SpecError(
                        f"sparsity item {item!r}: unknown weights {first!r} (attn, ffn or a layer weight)"
                    )
                layers = parse_layers(rest, n_layers, item) if rest else None
            nm = NMSparsity(int(m.group(1)), int(m.group(2)), tuple(kinds), layers)
        elif key == "attn-blocks":
            blocks = _parse_blocks(
                item, value, parse_layers(layer_text, n_layers, item) if layer_text else None
            )
        elif key == "attn-window":
            try:
                window = int(value)
            except ValueError:
                raise SpecError(
                    f"sparsity item {item!r}: the window must be a whole number of tokens"
                ) from None
            if window < 1:
                raise SpecError(f"sparsity item {item!r}: the window must be >= 1 token")
        else:
            raise SpecError(
                f"unknown sparsity item {item!r} (use ffn-topk, ffn-stat, ffn-down, nm, attn-window, attn-blocks)"
            )
    if down is not None:
        if ffn is None:
            raise SpecError(f"sparsity {text!r}: ffn-down needs an FFN item (ffn-topk or ffn-stat)")
        ffn = replace(ffn, down=down)
    return SparsitySpec(text, ffn, nm, window, blocks)


def _parse_blocks(item: str, value: str, layers: frozenset[int] | None) -> AttnBlocks:
    """``B:sink:local[:stride]``: whole numbers, B >= 1, sink >= 0, local >= 1, stride 0 (none) or >= 2."""
    parts = value.strip().split(":")
    if len(parts) not in (3, 4) or not all(re.fullmatch(r"\d+", p) for p in parts):
        raise SpecError(
            f"sparsity item {item!r}: attn-blocks takes BLOCK:SINK:LOCAL[:STRIDE] in whole numbers, e.g. 64:1:4"
        )
    block, sink, local, stride = (*map(int, parts), 0)[:4]
    if block < 1:
        raise SpecError(f"sparsity item {item!r}: the block size must be >= 1 token")
    if local < 1:
        raise SpecError(f"sparsity item {item!r}: LOCAL must be >= 1 (a query's own block is always visible)")
    if stride == 1:
        raise SpecError(f"sparsity item {item!r}: STRIDE 1 keeps every block (dense); use 0 or >= 2")
    return AttnBlocks(block, sink, local, stride, layers)
