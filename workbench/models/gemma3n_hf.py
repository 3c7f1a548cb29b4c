"""Hugging Face Gemma 3n directories: ``config.json`` -> :class:`ModelConfig`, tensor names -> GGUF names.

Both layouts are read: ``gemma3n_text`` (``Gemma3nForCausalLM``, weights ``model.*``) and ``gemma3n``
(``Gemma3nForConditionalGeneration``: a ``text_config``, text weights under ``model.language_model.`` or
``language_model.model.``; the vision and audio towers are not used). A field the config leaves out takes
transformers' ``Gemma3nTextConfig`` default (the E4B's values). Every tensor the model uses must be present
with the shape the config gives it; the K/V projections some checkpoints carry on the layers that share
another layer's cache are ignored, as transformers 5 ignores them. Norm weights are used as stored
(Gemma 3n's RMSNorm has no 1 + w).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .config import ModelConfig
from .errors import ModelFormatError
from .gemma3n import required_weights, weight_shapes
from .hf_config import layer_types_of, rope_settings
from .validate import MAX_LAYERS, Fields, Shapes, check_layer_count, check_shapes

MODEL_TYPES = ("gemma3n", "gemma3n_text")
# transformers' Gemma3nTextConfig defaults (transformers 4.53 to 5.x)
TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_400,
    "hidden_size": 2048,
    "intermediate_size": 16_384,
    "num_hidden_layers": 35,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "max_position_embeddings": 32_768,
    "rms_norm_eps": 1e-6,
    "sliding_window": 512,
    "final_logit_softcapping": 30.0,
    "vocab_size_per_layer_input": 262_144,
    "hidden_size_per_layer_input": 256,
    "num_kv_shared_layers": 15,
    "laurel_rank": 64,
    "altup_num_inputs": 4,
}
SLIDING_PATTERN = 5  # transformers' default layer types: layer i is global when (i + 1) % 5 == 0
DEFAULT_SPARSE_LAYERS, DEFAULT_SPARSITY = 10, 0.95  # the default pattern, for models of more layers
# settings of transformers' Gemma 3n that this engine does not implement: (key, the value it runs)
_FIXED = (
    ("hidden_activation", "gelu_pytorch_tanh"),
    ("attention_bias", False),
    ("altup_active_idx", 0),
    ("altup_correct_scale", True),
)

# Hugging Face name (after the text model's prefix) -> llama.cpp's GGUF name
_TOP = {
    "embed_tokens.weight": "token_embd.weight",
    "embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
    "norm.weight": "output_norm.weight",
}
_STACKED = {"altup_projections": "altup_proj.weight", "altup_unembed_projections": "altup_unembd_proj.weight"}
_LAYER_MAP = {
    "self_attn.q_proj.weight": "attn_q",
    "self_attn.k_proj.weight": "attn_k",
    "self_attn.v_proj.weight": "attn_v",
    "self_attn.o_proj.weight": "attn_output",
    "self_attn.q_norm.weight": "attn_q_norm",
    "self_attn.k_norm.weight": "attn_k_norm",
    "input_layernorm.weight": "attn_norm",
    "post_attention_layernorm.weight": "post_attention_norm",
    "pre_feedforward_layernorm.weight": "ffn_norm",
    "post_feedforward_layernorm.weight": "post_ffw_norm",
    "mlp.gate_proj.weight": "ffn_gate",
    "mlp.up_proj.weight": "ffn_up",
    "mlp.down_proj.weight": "ffn_down",
    "altup.correct_output_scale": "altup_correct_scale",
    "altup.correction_coefs.weight": "altup_correct_coef",
    "altup.prediction_coefs.weight": "altup_predict_coef",
    "altup.modality_router.weight": "altup_router",
    "altup.router_norm.weight": "altup_router_norm",
    "laurel.linear_left.weight": "laurel_l",
    "laurel.linear_right.weight": "laurel_r",
    "laurel.post_laurel_norm.weight": "laurel_post_norm",
    "per_layer_input_gate.weight": "inp_gate",
    "per_layer_projection.weight": "proj",
    "post_per_layer_input_norm.weight": "post_norm",
}
_PREFIX = re.compile(r"^(?:model\.language_model\.|language_model\.model\.|model\.)")
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_PART = re.compile(r"^(altup_projections|altup_unembed_projections)\.(\d+)\.weight$")


def is_gemma3n(cfg: Mapping[str, Any]) -> bool:
    """Whether a ``config.json`` object describes a Gemma 3n model."""
    return cfg.get("model_type") in MODEL_TYPES


def gguf_name(hf_name: str) -> tuple[str, int | None] | None:
    """(GGUF name, part) of a Hugging Face Gemma 3n tensor name, or None for tensors the text model does
    not use. ``part`` is the index of one of the AltUp projections, which GGUF stacks into one tensor."""
    if hf_name in ("lm_head.weight", "language_model.lm_head.weight"):
        return "output.weight", None
    name = _PREFIX.sub("", hf_name)
    if name in _TOP:
        return _TOP[name], None
    if m := _PART.match(name):
        return _STACKED[m.group(1)], int(m.group(2))
    m = _LAYER.match(name)
    if m and m.group(2) in _LAYER_MAP:
        return f"blk.{m.group(1)}.{_LAYER_MAP[m.group(2)]}.weight", None
    return None


def hf_name(name: str) -> str:
    """The ``Gemma3nForCausalLM`` name of a GGUF tensor name (for messages)."""
    top = {v: k for k, v in _TOP.items()} | {v: f"{k}.*.weight" for k, v in _STACKED.items()}
    if name in top:
        return f"model.{top[name]}"
    m = re.match(r"^blk\.(\d+)\.(.+)\.weight$", name)
    layer = {v: k for k, v in _LAYER_MAP.items()}
    if m and m.group(2) in layer:
        return f"model.layers.{m.group(1)}.{layer[m.group(2)]}"
    return "lm_head.weight" if name == "output.weight" else name


def text_config(cfg: Mapping[str, Any], source: str) -> Fields:
    """The text model's fields of a ``config.json`` (a ``gemma3n`` config's ``text_config``)."""
    top = Fields(cfg, source)
    if top.choice("model_type", None, MODEL_TYPES) == "gemma3n_text":
        return top
    text = top.section("text_config")
    text.choice("model_type", "gemma3n_text", ("gemma3n_text",))
    return text


def _per_layer(tc: Fields, key: str, n_layers: int, default: Any) -> list[Any]:
    """A value given once or once per layer (``intermediate_size``, ``activation_sparsity_pattern``)."""
    value = tc.raw(key, default)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value] * n_layers
    values = tc.sequence(key) if tc.has(key) else value
    if len(values) != n_layers:
        tc.fail(key, values, f"gives {len(values)} values for {n_layers} layers")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        tc.fail(key, values, "not a list of numbers")
    return list(values)


def _layer_types(tc: Fields, n_layers: int) -> tuple[str, ...]:
    """The config's ``layer_types``, else transformers' default: every SLIDING_PATTERN-th layer global."""
    given = layer_types_of(tc, n_layers, "Gemma 3n")
    return given or tuple("global" if (i + 1) % SLIDING_PATTERN == 0 else "sliding" for i in range(n_layers))


def _sparsity(tc: Fields, n_layers: int) -> tuple[float, ...]:
    sparse = DEFAULT_SPARSE_LAYERS if n_layers > DEFAULT_SPARSE_LAYERS else 0
    default = [DEFAULT_SPARSITY] * sparse + [0.0] * (n_layers - sparse)
    values = _per_layer(tc, "activation_sparsity_pattern", n_layers, default)
    if not all(0 <= v < 1 for v in values):
        tc.fail("activation_sparsity_pattern", values, "holds a sparsity outside [0, 1)")
    return tuple(float(v) for v in values)


def _check_ple_table(tc: Fields, shapes: Shapes, rows: int) -> None:
    """The per-layer embedding table must have a row for each id of ``vocab_size_per_layer_input``."""
    entry = shapes.get("per_layer_token_embd.weight")
    if entry is not None and entry[1] and entry[1][0] < rows:
        raise ModelFormatError(
            f"{tc.source}: the per-layer embedding table {entry[0]!r} has {entry[1][0]} rows, fewer than "
            f"{tc.prefix}vocab_size_per_layer_input = {rows}: token ids past it would have no per-layer input"
        )


def config_from_hf(cfg: Mapping[str, Any], shapes: Shapes, source: str, name: str = "") -> ModelConfig:
    """:class:`ModelConfig` of a Hugging Face Gemma 3n ``config.json`` and its text tensors' shapes
    (GGUF name -> (name in the file, shape)); ``source`` names the config file in error messages."""
    tc = text_config(cfg, source)
    for key, runs in _FIXED:
        if tc.has(key) and tc.values[key] != runs:
            tc.unsupported(key, tc.values[key], f"this engine runs Gemma 3n with {runs!r}")
    d = TEXT_DEFAULTS
    altup = tc.integer("altup_num_inputs", d["altup_num_inputs"])
    if altup != 4:
        tc.unsupported(
            "altup_num_inputs", altup, "this engine runs Gemma 3n's 4 AltUp streams (as llama.cpp)"
        )
    n_layers = tc.integer("num_hidden_layers", d["num_hidden_layers"], hi=MAX_LAYERS)
    check_layer_count(n_layers, shapes, f"{tc.prefix}num_hidden_layers", source)
    ffn = _per_layer(tc, "intermediate_size", n_layers, d["intermediate_size"])
    if len(set(ffn)) > 1:
        tc.unsupported("intermediate_size", ffn, "FFN sizes that differ between layers")
    if not isinstance(ffn[0], int) or ffn[0] < 1:
        tc.fail("intermediate_size", ffn[0], "not a positive integer")
    ple_rows = tc.integer("vocab_size_per_layer_input", d["vocab_size_per_layer_input"])
    _check_ple_table(tc, shapes, ple_rows)
    shared = tc.integer("num_kv_shared_layers", d["num_kv_shared_layers"], lo=0)
    if shared >= n_layers:
        tc.fail("num_kv_shared_layers", shared, f"not below num_hidden_layers {n_layers}")
    rope_global, rope_local, scale = rope_settings(tc)
    top = Fields(cfg, source)
    config = ModelConfig(
        name=name or top.text("_name_or_path", "") or "gemma3n",
        arch="gemma3n",
        n_layers=n_layers,
        hidden=tc.integer("hidden_size", d["hidden_size"]),
        ffn=ffn[0],
        n_heads=tc.integer("num_attention_heads", d["num_attention_heads"]),
        n_kv_heads=tc.integer("num_key_value_heads", d["num_key_value_heads"]),
        head_dim=tc.integer("head_dim", d["head_dim"]),
        vocab_size=tc.integer("vocab_size", d["vocab_size"]),
        context_length=tc.integer("max_position_embeddings", d["max_position_embeddings"]),
        rms_eps=tc.number("rms_norm_eps", d["rms_norm_eps"]),
        rope_base_global=rope_global,
        rope_base_local=rope_local,
        rope_scale_global=scale,
        sliding_window=tc.integer("sliding_window", d["sliding_window"]),
        query_pre_attn_scalar=1.0,  # Gemma 3n does not scale attention scores
        final_logit_softcap=tc.number("final_logit_softcapping", None),
        tie_embeddings=tc.flag("tie_word_embeddings", top.flag("tie_word_embeddings", True)),
        layer_types=_layer_types(tc, n_layers),
        altup_inputs=altup,
        laurel_rank=tc.integer("laurel_rank", d["laurel_rank"]),
        ple_dim=tc.integer("hidden_size_per_layer_input", d["hidden_size_per_layer_input"]),
        ple_vocab_size=ple_rows,
        kv_shared_layers=shared,
        activation_sparsity=_sparsity(tc, n_layers),
    )
    missing = [n for n in required_weights(config) if n not in shapes]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelFormatError(
            f"{source}: the Gemma 3n tensor {hf_name(missing[0])!r} (GGUF {missing[0]!r}) is missing{more}"
        )
    check_shapes(weight_shapes(config), shapes, source)
    return config


__all__ = [
    "MODEL_TYPES",
    "TEXT_DEFAULTS",
    "config_from_hf",
    "gguf_name",
    "hf_name",
    "is_gemma3n",
    "text_config",
]
