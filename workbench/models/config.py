"""Model configuration: one dataclass for Gemma 3 and Gemma 3n, built from GGUF metadata, a Hugging Face
config.json (``hf_config``, ``gemma3n_hf``), or a named preset (270M to 27B) for synthetic models and
projections."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from .errors import UnsupportedModelError

SUPPORTED_ARCHITECTURES = ("gemma3", "gemma3n")


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and hyper-parameters of a Gemma 3 or Gemma 3n text model.

    ``layer_types`` is derived from ``sliding_window_pattern`` unless given: layer ``i`` is global
    (full attention) when ``(i + 1) % pattern == 0``.

    The Gemma 3n fields (``arch == "gemma3n"``, see docs/gemma3n.md) are zero or empty for Gemma 3:
    ``altup_inputs`` AltUp streams (4), ``laurel_rank``, ``ple_dim`` (width of each layer's per-layer
    embedding) and ``ple_vocab_size`` (rows of the per-layer embedding table, which may be fewer than the
    vocabulary), ``kv_shared_layers`` (the last layers, which attend over the cache of an earlier layer:
    :meth:`kv_layer`) and ``activation_sparsity`` (per layer, the Gaussian top-k's target sparsity; 0:
    dense). Gemma 3n scores attention unscaled, which ``query_pre_attn_scalar = 1`` expresses.
    """

    name: str
    n_layers: int
    hidden: int
    ffn: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int = 32768
    rms_eps: float = 1e-6
    rope_base_global: float = 1_000_000.0
    rope_base_local: float = 10_000.0
    rope_scale_global: float = 1.0  # linear RoPE scaling factor of the global layers
    sliding_window: int = 512
    sliding_window_pattern: int = 6
    query_pre_attn_scalar: float = 256.0
    final_logit_softcap: float | None = None
    tie_embeddings: bool = True
    arch: str = "gemma3"
    layer_types: tuple[str, ...] = field(default=())
    altup_inputs: int = 0
    laurel_rank: int = 0
    ple_dim: int = 0
    ple_vocab_size: int = 0
    kv_shared_layers: int = 0
    activation_sparsity: tuple[float, ...] = field(default=())

    def __post_init__(self) -> None:
        for f in (
            "n_layers",
            "hidden",
            "ffn",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "vocab_size",
            "context_length",
        ):
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise UnsupportedModelError(f"model config: {f} must be a positive integer, got {v!r}")
        if self.n_heads % self.n_kv_heads:
            raise UnsupportedModelError(
                f"model config: {self.n_heads} query heads is not a multiple of {self.n_kv_heads} KV heads"
            )
        if self.head_dim % 2:
            raise UnsupportedModelError(f"model config: head_dim {self.head_dim} must be even for RoPE")
        if not self.layer_types:
            p = self.sliding_window_pattern
            types = tuple("global" if p <= 1 or (i + 1) % p == 0 else "sliding" for i in range(self.n_layers))
            object.__setattr__(self, "layer_types", types)
        elif len(self.layer_types) != self.n_layers or set(self.layer_types) - {"global", "sliding"}:
            raise UnsupportedModelError(
                "model config: layer_types must list 'global'/'sliding' for every layer"
            )
        if self.arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"model config: arch {self.arch!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        if self.arch == "gemma3n":
            self._check_gemma3n()

    def _check_gemma3n(self) -> None:
        """The Gemma 3n fields: the sizes positive, one sparsity a layer, a cache for every shared layer."""
        for f in ("altup_inputs", "laurel_rank", "ple_dim", "ple_vocab_size"):
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise UnsupportedModelError(f"model config: {f} must be a positive integer, got {v!r}")
        if self.altup_inputs != 4:
            raise UnsupportedModelError(
                f"model config: altup_inputs is {self.altup_inputs}; Gemma 3n runs 4 AltUp streams"
            )
        if not isinstance(self.kv_shared_layers, int) or not 0 <= self.kv_shared_layers < self.n_layers:
            raise UnsupportedModelError(
                f"model config: kv_shared_layers must be 0..{self.n_layers - 1}, got {self.kv_shared_layers!r}"
            )
        if not self.activation_sparsity:
            object.__setattr__(self, "activation_sparsity", (0.0,) * self.n_layers)
        s = self.activation_sparsity
        if len(s) != self.n_layers or not all(isinstance(v, (int, float)) and 0 <= v < 1 for v in s):
            raise UnsupportedModelError(
                f"model config: activation_sparsity must give a sparsity in [0, 1) for each of the "
                f"{self.n_layers} layers, got {list(s)!r}"
            )
        object.__setattr__(self, "activation_sparsity", tuple(float(v) for v in s))
        first = self.n_layers - self.kv_shared_layers
        owners = set(self.layer_types[:first])
        for i in range(first, self.n_layers):
            if self.layer_types[i] not in owners:
                raise UnsupportedModelError(
                    f"model config: layer {i} shares the KV cache of an earlier {self.layer_types[i]} layer "
                    f"(kv_shared_layers {self.kv_shared_layers}), but layers 0..{first - 1} have none"
                )

    # -- derived ---------------------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.hidden)

    @property
    def attn_scale(self) -> float:
        return self.query_pre_attn_scalar**-0.5

    def is_sliding(self, layer: int) -> bool:
        return self.layer_types[layer] == "sliding"

    def rope_base(self, layer: int) -> float:
        return self.rope_base_local if self.is_sliding(layer) else self.rope_base_global

    def rope_scale(self, layer: int) -> float:
        return 1.0 if self.is_sliding(layer) else self.rope_scale_global

    def kv_layer(self, layer: int) -> int:
        """The layer whose KV cache ``layer`` attends over: its own, or for the last ``kv_shared_layers``
        layers (Gemma 3n) that of the last layer before them of the same type (sliding or global)."""
        first = self.n_layers - self.kv_shared_layers
        if layer < first:
            return layer
        kind = self.layer_types[layer]
        return max(i for i in range(first) if self.layer_types[i] == kind)

    def owns_kv(self, layer: int) -> bool:
        """Whether ``layer`` computes keys and values (and has a KV cache of its own)."""
        return self.kv_layer(layer) == layer

    def n_params(self) -> int:
        """Parameter count (tied embedding counted once; Gemma 3n's per-layer embedding table included)."""
        h = self.hidden
        attn = h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h + 2 * self.head_dim
        mlp = 3 * h * self.ffn
        norms = 4 * h
        per_layer = attn + mlp + norms
        head = 0 if self.tie_embeddings else self.vocab_size * h
        total = self.n_layers * per_layer + self.vocab_size * h + h + head
        if self.arch == "gemma3n":
            n, lp = self.altup_inputs, self.n_layers * self.ple_dim
            shared = self.n_layers - sum(self.owns_kv(i) for i in range(self.n_layers))
            total -= shared * (2 * h * self.kv_dim + self.head_dim)  # no K/V projections, no k_norm
            altup = h * n + n * n * n + n * n + 2 * h  # router, coefficients, correct scale, router norm
            laurel = 2 * h * self.laurel_rank + h
            ple = 2 * h * self.ple_dim + h
            total += self.n_layers * (altup + laurel + ple)
            total += self.ple_vocab_size * lp + h * lp + self.ple_dim + 2 * (n - 1) * h * h
        return total

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layer_types"] = list(self.layer_types)
        d["activation_sparsity"] = list(self.activation_sparsity)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        for key in ("layer_types", "activation_sparsity"):
            if key in kw:
                kw[key] = tuple(kw[key])
        return cls(**kw)

    def to_hf_config(self) -> dict[str, Any]:
        """A ``config.json`` for this model as transformers' ``Gemma3ForCausalLM`` reads it."""
        rope_scaling = (
            {"rope_type": "linear", "factor": self.rope_scale_global} if self.rope_scale_global != 1 else None
        )
        return {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "hidden_size": self.hidden,
            "intermediate_size": self.ffn,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.context_length,
            "rms_norm_eps": self.rms_eps,
            "rope_theta": self.rope_base_global,
            "rope_local_base_freq": self.rope_base_local,
            "rope_scaling": rope_scaling,
            "sliding_window": self.sliding_window,
            "layer_types": [
                "sliding_attention" if t == "sliding" else "full_attention" for t in self.layer_types
            ],
            "query_pre_attn_scalar": self.query_pre_attn_scalar,
            "final_logit_softcapping": self.final_logit_softcap,
            "attn_logit_softcapping": None,
            "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": self.tie_embeddings,
            "torch_dtype": "float32",
            "bos_token_id": 2,
            "eos_token_id": [1, 106],
            "pad_token_id": 0,
        }

    def with_(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (derived layer types recomputed unless given)."""
        if "layer_types" not in changes and {"n_layers", "sliding_window_pattern"} & set(changes):
            changes["layer_types"] = ()
        return replace(self, **changes)


def _preset(
    name, n_layers, hidden, ffn, n_heads, n_kv, head_dim, window, ctx, scale, qpas, vocab
) -> ModelConfig:
    return ModelConfig(
        name=name,
        n_layers=n_layers,
        hidden=hidden,
        ffn=ffn,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        vocab_size=vocab,
        context_length=ctx,
        sliding_window=window,
        rope_scale_global=scale,
        query_pre_attn_scalar=qpas,
    )


# Published Gemma 3 text configurations (Hugging Face config.json of each size).
PRESETS: dict[str, ModelConfig] = {
    "gemma3-270m": _preset("gemma3-270m", 18, 640, 2048, 4, 1, 256, 512, 32768, 1.0, 256, 262144),
    "gemma3-1b": _preset("gemma3-1b", 26, 1152, 6912, 4, 1, 256, 512, 32768, 1.0, 256, 262144),
    "gemma3-4b": _preset("gemma3-4b", 34, 2560, 10240, 8, 4, 256, 1024, 131072, 8.0, 256, 262208),
    "gemma3-12b": _preset("gemma3-12b", 48, 3840, 15360, 16, 8, 256, 1024, 131072, 8.0, 256, 262208),
    "gemma3-27b": _preset("gemma3-27b", 62, 5376, 21504, 32, 16, 128, 1024, 131072, 8.0, 168, 262208),
}


def _gemma3n_preset(name: str, n_layers: int, ffn: int, kv_shared: int) -> ModelConfig:
    """Gemma 3n E2B/E4B as llama.cpp's GGUF describes them: the per-layer table padded to the 262,400-token
    vocabulary (transformers' table has 262,144 rows; the converter pads it), sparsity 0.95 on layers 0-9."""
    return ModelConfig(
        name=name,
        arch="gemma3n",
        n_layers=n_layers,
        hidden=2048,
        ffn=ffn,
        n_heads=8,
        n_kv_heads=2,
        head_dim=256,
        vocab_size=262400,
        sliding_window=512,
        sliding_window_pattern=5,
        query_pre_attn_scalar=1.0,
        final_logit_softcap=30.0,
        altup_inputs=4,
        laurel_rank=64,
        ple_dim=256,
        ple_vocab_size=262400,
        kv_shared_layers=kv_shared,
        activation_sparsity=(0.95,) * 10 + (0.0,) * (n_layers - 10),
    )


# Gemma 3n text decoders (transformers' Gemma3nTextConfig of E2B and E4B; docs/gemma3n.md).
PRESETS["gemma3n-e2b"] = _gemma3n_preset("gemma3n-e2b", 30, 8192, 10)
PRESETS["gemma3n-e4b"] = _gemma3n_preset("gemma3n-e4b", 35, 16384, 15)


def preset(name: str) -> ModelConfig:
    """A named preset, e.g. ``gemma3-27b``; the error lists the known names."""
    key = name.lower()
    if key not in PRESETS:
        raise UnsupportedModelError(f"unknown model config {name!r} (known: {', '.join(PRESETS)})")
    return PRESETS[key]
