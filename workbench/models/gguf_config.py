"""GGUF metadata -> :class:`ModelConfig` for Gemma 3, completed with the facts GGUF files do not store.

Every key is read through :class:`~.validate.Fields` (type and range), then the sizes are checked
against the tensor index: a block count beyond the layers the file holds, a tensor whose shape the
metadata contradict, or one the config has no place for (llama.cpp refuses those too) is a
:class:`ModelFormatError` naming the file, the key and the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import gemma3n_gguf
from .config import SUPPORTED_ARCHITECTURES, ModelConfig
from .errors import UnsupportedModelError
from .gemma3 import weight_shapes
from .validate import MAX_LAYERS, Fields, Shapes, check_expected, check_layer_count, check_shapes

DEFAULT_VOCAB = 262_144
ROPE_SCALINGS = ("none", "linear")


def architecture(meta: Mapping[str, Any], source: str) -> str:
    """``general.architecture``, which must be one this engine runs."""
    arch = Fields(meta, source).text("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{source}: unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return arch


def _layer_types(f: Fields, key: str, n_layers: int) -> tuple[tuple[str, ...], int]:
    """(per-layer types, pattern) of ``sliding_window_pattern``: a period, or one flag a layer (true:
    sliding), as llama.cpp writes it for Gemma 3."""
    value = f.raw(key, 6)
    if isinstance(value, np.ndarray) and value.dtype.kind in "biu":
        if len(value) != n_layers:
            f.fail(key, value, f"has {len(value)} flags for {n_layers} layers")
        return tuple("sliding" if v else "global" for v in value.tolist()), 6
    return (), f.integer(key, 6)


def config_from_gguf(meta: Mapping[str, Any], shapes: Shapes, source: str, name: str = "") -> ModelConfig:
    """The config of a Gemma 3 (or Gemma 3n: :mod:`.gemma3n_gguf`) GGUF file's metadata; ``shapes`` maps
    tensor names to (name, shape)."""
    arch = architecture(meta, source)
    if arch == gemma3n_gguf.ARCH:
        return gemma3n_gguf.config_from_gguf(meta, shapes, source, name)
    f = Fields(meta, source)

    def key(k: str) -> str:
        return f"{arch}.{k}"

    n_heads = f.integer(key("attention.head_count"))
    hidden = f.integer(key("embedding_length"))
    if not f.has(key("attention.key_length")) and hidden % n_heads:
        f.fail(key("attention.head_count"), n_heads, f"does not divide embedding_length {hidden}")
    head_dim = f.integer(key("attention.key_length"), hidden // n_heads)
    if head_dim % 2:
        f.fail(key("attention.key_length"), head_dim, "odd: RoPE rotates pairs of values")
    value_length = f.integer(key("attention.value_length"), head_dim)
    if value_length != head_dim:
        f.unsupported(key("attention.value_length"), value_length, f"not key_length {head_dim}")
    n_kv = f.integer(key("attention.head_count_kv"), n_heads)
    if n_heads % n_kv:
        f.fail(key("attention.head_count_kv"), n_kv, f"does not divide head_count {n_heads}")
    n_layers = f.integer(key("block_count"), hi=MAX_LAYERS)
    check_layer_count(n_layers, shapes, key("block_count"), source)
    tokens = f.strings("tokenizer.ggml.tokens", None)
    if tokens is not None and not len(tokens):
        f.fail("tokenizer.ggml.tokens", tokens, "empty")
    vocab = len(tokens) if tokens is not None else f.integer(key("vocab_size"), DEFAULT_VOCAB)
    scaling = f.choice(key("rope.scaling.type"), "none", ROPE_SCALINGS)
    layer_types, pattern = _layer_types(f, key("attention.sliding_window_pattern"), n_layers)
    # Gemma 3 27B scales queries by hidden/heads; every other size by head_dim (as llama.cpp does).
    qpas = hidden / n_heads if (n_layers, hidden) == (62, 5376) else head_dim
    config = ModelConfig(
        name=name or f.text("general.name", "gemma3"),
        n_layers=n_layers,
        hidden=hidden,
        ffn=f.integer(key("feed_forward_length")),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        vocab_size=vocab,
        context_length=f.integer(key("context_length"), 32768),
        rms_eps=f.number(key("attention.layer_norm_rms_epsilon"), 1e-6),
        rope_base_global=f.number(key("rope.freq_base"), 1_000_000.0),
        rope_scale_global=f.number(key("rope.scaling.factor"), 1.0) if scaling == "linear" else 1.0,
        sliding_window=f.integer(key("attention.sliding_window"), 512),
        query_pre_attn_scalar=float(qpas),
        final_logit_softcap=f.number(key("final_logit_softcapping"), None),
        sliding_window_pattern=pattern,
        layer_types=layer_types,
        tie_embeddings="output.weight" not in shapes,  # as llama.cpp: the LM head if present, else tied
    )
    expected = weight_shapes(config)
    check_shapes(expected, shapes, source)
    check_expected(expected, shapes, source)
    return config


__all__ = ["ROPE_SCALINGS", "architecture", "config_from_gguf"]
