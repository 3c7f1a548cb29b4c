"""Mixed-precision specs: which weight gets which format, by projection kind and by layer.

A spec is a comma-separated list. One bare item is the default format of every matmul weight; each
``SELECTOR=FORMAT`` item overrides it, later items winning over earlier ones::

    int8                                  every matmul weight int8 per-channel
    int4-g32,embed=int8                   int4 everywhere, the (tied) embedding / LM head int8
    int4-g64-asym+a8,ffn_down=int8,attn@0-2+17=fp16
    native,ffn@0-5=int8                   only the FFNs of layers 0..5 re-quantized

Selectors: a weight kind (``attn_q attn_k attn_v attn_output ffn_gate ffn_up ffn_down token_embd output``),
a group (``attn``, ``ffn``, ``embed`` = token_embd and output), optionally ``@LAYERS``; or ``@LAYERS`` alone
(every layer weight of those layers). LAYERS: ``N``, ``N-M``, joined by ``+``. ``native`` keeps the
model's own storage. Formats: see :mod:`workbench.quant.planar`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .planar import FormatError, PlanarFormat, parse_format

LAYER_KINDS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
GLOBAL_KINDS = ("token_embd", "output")
GROUPS = {
    "attn": ("attn_q", "attn_k", "attn_v", "attn_output"),
    "ffn": ("ffn_gate", "ffn_up", "ffn_down"),
    "embed": GLOBAL_KINDS,
}
NATIVE = "native"
_WEIGHT = re.compile(r"^(?:blk\.(\d+)\.)?([a-z_]+)\.weight$")


class SpecError(ValueError):
    """A quantization spec that cannot be applied (unknown names, bad layers, bad formats)."""


@dataclass(frozen=True)
class Rule:
    kinds: tuple[str, ...]  # weight kinds this rule selects (all when empty)
    layers: frozenset[int] | None  # None: any layer (and the global weights)
    format: PlanarFormat | None  # None: native

    def matches(self, kind: str, layer: int | None) -> bool:
        if self.kinds and kind not in self.kinds:
            return False
        return self.layers is None or (layer is not None and layer in self.layers)


@dataclass(frozen=True)
class QuantSpec:
    """A parsed spec: the ordered rules (the default first); :meth:`format_for` resolves one weight."""

    text: str
    rules: tuple[Rule, ...]

    def format_for(self, weight_name: str) -> PlanarFormat | None:
        """The format of ``weight_name`` (None: keep it native); norms and unknown tensors stay native."""
        m = _WEIGHT.match(weight_name)
        if not m or m.group(2) not in (*LAYER_KINDS, *GLOBAL_KINDS):
            return None
        layer = int(m.group(1)) if m.group(1) is not None else None
        fmt = None
        for rule in self.rules:
            if rule.matches(m.group(2), layer):
                fmt = rule.format
        return fmt

    @property
    def is_native(self) -> bool:
        return all(r.format is None for r in self.rules)


def parse_layers(text: str, n_layers: int | None, item: str) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split("+"):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not m:
            raise SpecError(f"quant spec item {item!r}: layers must be N, N-M, joined by '+', got {text!r}")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise SpecError(f"quant spec item {item!r}: layer range {part!r} is empty")
        if n_layers is not None and hi >= n_layers:
            raise SpecError(f"quant spec item {item!r}: layer {hi} does not exist (the model has {n_layers})")
        out.update(range(lo, hi + 1))
    return frozenset(out)


def _format(text: str, item: str) -> PlanarFormat | None:
    if text.strip().lower() == NATIVE:
        return None
    try:
        return parse_format(text)
    except FormatError as e:
        raise SpecError(f"quant spec item {item!r}: {e}") from None


def parse_spec(text: str, n_layers: int | None = None) -> QuantSpec:
    """Parse a spec (see the module docstring); ``n_layers`` checks layer numbers when given."""
    items = [s.strip() for s in (text or "").split(",") if s.strip()]
    if not items:
        raise SpecError("empty quant spec: give a format (e.g. int8) or 'native'")
    rules: list[Rule] = []
    defaults = [i for i in items if "=" not in i]
    if len(defaults) > 1:
        raise SpecError(f"quant spec {text!r}: more than one default format ({', '.join(defaults)})")
    rules.append(Rule((), None, _format(defaults[0], defaults[0]) if defaults else None))
    for item in items:
        if "=" not in item:
            continue
        sel, _, fmt_text = item.partition("=")
        target, _, layer_text = sel.strip().partition("@")
        target = target.strip()
        if target:
            kinds = GROUPS.get(target, (target,))
            unknown = [k for k in kinds if k not in (*LAYER_KINDS, *GLOBAL_KINDS)]
            if unknown:
                known = ", ".join([*LAYER_KINDS, *GLOBAL_KINDS, *GROUPS])
                raise SpecError(f"quant spec item {item!r}: unknown weight {target!r} (known: {known})")
        else:
            kinds = LAYER_KINDS
            if not layer_text:
                raise SpecError(f"quant spec item {item!r}: give a weight kind, @LAYERS, or both")
        layers = parse_layers(layer_text, n_layers, item) if layer_text else None
        if layers is not None and set(kinds) <= set(GLOBAL_KINDS):
            raise SpecError(f"quant spec item {item!r}: {target} is not a per-layer weight")
        rules.append(Rule(tuple(kinds), layers, _format(fmt_text, item)))
    return QuantSpec(text, tuple(rules))
