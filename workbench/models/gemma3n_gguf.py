"""GGUF metadata of a Gemma 3n file (llama.cpp's ``gemma3n`` architecture) -> :class:`ModelConfig`.

The keys are those llama.cpp's converter writes (``convert_hf_to_gguf.py``, ``Gemma3NModel``): the standard
ones, ``feed_forward_length`` as one value per layer, ``altup.num_inputs``/``altup.active_idx``,
``embedding_length_per_layer_input``, ``attention.shared_kv_layers``, ``activation_sparsity_scale`` (the
Gaussian top-k's std multiplier per layer: Phi^-1(sparsity), -inf on dense layers) and
``attention.sliding_window_pattern`` (true: sliding). The LAuReL rank and the tables' sizes come from the
tensors. Norm weights are stored as used (the converter adds nothing for Gemma 3n). The per-layer table
must have a row for every token (the converter pads it to the vocabulary), and the K/V tensors a converter
may write for the layers that share another's cache are allowed but not loaded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from statistics import NormalDist
from typing import Any

import numpy as np

from .config import ModelConfig
from .errors import ModelFormatError
from .gemma3n import KV_WEIGHTS, required_weights, weight_shapes
from .validate import MAX_LAYERS, Fields, Shapes, check_expected, check_layer_count, check_shapes

ARCH = "gemma3n"
SLIDING_PATTERN = 5  # layer types when the file has no pattern: layer i is global when (i + 1) % 5 == 0


def _key(k: str) -> str:
    return f"{ARCH}.{k}"


def _ffn(f: Fields, n_layers: int) -> int:
    """``feed_forward_length``: one size, or one per layer (all equal: the engine runs one size)."""
    key = _key("feed_forward_length")
    if isinstance(f.raw(key), np.ndarray):
        sizes = f.numbers(key, n_layers, integers=True)
        if len(set(sizes.tolist())) > 1 or sizes[0] < 1:
            f.unsupported(key, sizes, "FFN sizes that differ between layers, or not positive")
        return int(sizes[0])
    return f.integer(key)


def _sparsity(f: Fields, n_layers: int) -> tuple[float, ...]:
    """Per layer, the sparsity whose Phi^-1 is ``activation_sparsity_scale`` (-inf: dense, 0)."""
    key = _key("activation_sparsity_scale")
    value = f.raw(key, None)
    if value is None:
        return (0.0,) * n_layers
    if not isinstance(value, np.ndarray) or value.dtype.kind != "f" or len(value) != n_layers:
        f.fail(key, value, f"not an array of {n_layers} numbers")
    out = []
    for k in value.astype(np.float64).tolist():
        if k == -math.inf:
            out.append(0.0)
        elif math.isfinite(k):
            out.append(NormalDist().cdf(k))
        else:
            f.fail(key, value, "holds +inf or NaN (a dense layer is -inf)")
    return tuple(out)


def _layer_types(f: Fields, n_layers: int) -> tuple[str, ...]:
    key = _key("attention.sliding_window_pattern")
    value = f.raw(key, None)
    if value is None:
        return tuple("global" if (i + 1) % SLIDING_PATTERN == 0 else "sliding" for i in range(n_layers))
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biu" or len(value) != n_layers:
        f.fail(key, value, f"not {n_layers} flags (true: sliding)")
    return tuple("sliding" if v else "global" for v in value.tolist())


def _rows(shapes: Shapes, name: str) -> int | None:
    entry = shapes.get(name)
    return entry[1][0] if entry and entry[1] else None


def config_from_gguf(meta: Mapping[str, Any], shapes: Shapes, source: str, name: str = "") -> ModelConfig:
    """The config of a Gemma 3n GGUF file; ``shapes`` maps tensor names to (name, shape)."""
    f = Fields(meta, source)
    altup = f.integer(_key("altup.num_inputs"), 4)
    if altup != 4:
        f.unsupported(
            _key("altup.num_inputs"), altup, "this engine runs Gemma 3n's 4 AltUp streams (as llama.cpp)"
        )
    active = f.integer(_key("altup.active_idx"), 0, lo=0)
    if active != 0:
        f.unsupported(_key("altup.active_idx"), active, "this engine runs stream 0 as the active one")
    n_layers = f.integer(_key("block_count"), hi=MAX_LAYERS)
    check_layer_count(n_layers, shapes, _key("block_count"), source)
    hidden = f.integer(_key("embedding_length"))
    n_heads = f.integer(_key("attention.head_count"))
    head_dim = f.integer(_key("attention.key_length"), hidden // n_heads or 1)
    if f.integer(_key("attention.value_length"), head_dim) != head_dim:
        f.unsupported(_key("attention.value_length"), meta[_key("attention.value_length")], "not key_length")
    n_kv = f.integer(_key("attention.head_count_kv"), n_heads)
    shared = f.integer(_key("attention.shared_kv_layers"), lo=0)
    if shared >= n_layers:
        f.fail(_key("attention.shared_kv_layers"), shared, f"not below block_count {n_layers}")
    tokens = f.strings("tokenizer.ggml.tokens", None)
    vocab = len(tokens) if tokens else _rows(shapes, "token_embd.weight") or 0
    ple_rows = _rows(shapes, "per_layer_token_embd.weight")
    if ple_rows is not None and ple_rows < vocab:
        raise ModelFormatError(
            f"{source}: the per-layer embedding table 'per_layer_token_embd.weight' has {ple_rows} rows, "
            f"fewer than the vocabulary's {vocab} tokens (llama.cpp's converter pads it to the vocabulary)"
        )
    scaling = f.choice(_key("rope.scaling.type"), "none", ("none", "linear"))
    config = ModelConfig(
        name=name or f.text("general.name", ARCH),
        arch=ARCH,
        n_layers=n_layers,
        hidden=hidden,
        ffn=_ffn(f, n_layers),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        vocab_size=vocab or 1,
        context_length=f.integer(_key("context_length"), 32768),
        rms_eps=f.number(_key("attention.layer_norm_rms_epsilon"), 1e-6),
        rope_base_global=f.number(_key("rope.freq_base"), 1_000_000.0),
        rope_base_local=f.number(_key("rope.freq_base_swa"), 10_000.0),
        rope_scale_global=f.number(_key("rope.scaling.factor"), 1.0) if scaling == "linear" else 1.0,
        sliding_window=f.integer(_key("attention.sliding_window"), 512),
        query_pre_attn_scalar=1.0,  # Gemma 3n does not scale attention scores (llama.cpp: 1.0)
        final_logit_softcap=f.number(_key("final_logit_softcapping"), 30.0),
        tie_embeddings="output.weight" not in shapes,
        layer_types=_layer_types(f, n_layers),
        altup_inputs=altup,
        laurel_rank=_rows(shapes, "blk.0.laurel_l.weight") or 64,
        ple_dim=f.integer(_key("embedding_length_per_layer_input"), 256),
        ple_vocab_size=vocab or 1,
        kv_shared_layers=shared,
        activation_sparsity=_sparsity(f, n_layers),
    )
    missing = [n for n in required_weights(config) if n not in shapes]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelFormatError(f"{source}: the Gemma 3n tensor {missing[0]!r} is missing{more}")
    expected = weight_shapes(config)
    unused = {  # the K/V of layers that share another's cache: allowed, never loaded
        f"blk.{i}.{w}.weight": expected[f"blk.{config.kv_layer(i)}.{w}.weight"]
        for i in range(n_layers)
        if not config.owns_kv(i)
        for w in KV_WEIGHTS
    }
    check_shapes(expected | unused, shapes, source)
    check_expected(expected | unused, shapes, source)
    return config


__all__ = ["ARCH", "config_from_gguf"]
