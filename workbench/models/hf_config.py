"""Hugging Face ``config.json`` -> :class:`ModelConfig` for Gemma 3 text models.

Both layouts the Hub ships are read: ``gemma3_text`` (270M and 1B, ``Gemma3ForCausalLM``) and ``gemma3``
(4B to 27B, ``Gemma3ForConditionalGeneration``), whose ``text_config`` names only the fields that differ
from transformers' ``Gemma3TextConfig`` defaults (the 4B's gives neither heads nor head_dim). A field the
config leaves out takes transformers' default, except the sizes, which the tensors decide: vocabulary and
hidden size from the embedding, head_dim from the q_norm weight, query and KV heads from q_proj and
k_proj rows over head_dim, FFN size from gate_proj, layers from the highest layer index. A size the config
states must agree with the tensors (a config may run fewer layers than the files hold, as transformers
does), and every tensor must have the shape the config gives it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .config import ModelConfig, UnsupportedModelError
from .gemma3 import weight_shapes

# transformers' Gemma3TextConfig defaults (the same in transformers 4.50 to 5.x)
TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "final_logit_softcapping": None,
    "tie_word_embeddings": True,
}
# settings of transformers' Gemma 3 that this engine does not implement: (key, the value it runs)
_FIXED = (
    ("hidden_activation", "gelu_pytorch_tanh"),
    ("attn_logit_softcapping", None),
    ("attention_bias", False),
    ("use_bidirectional_attention", False),
)
_LAYER = re.compile(r"^blk\.(\d+)\.")

Shapes = Mapping[str, tuple[str, tuple[int, ...]]]  # GGUF name -> (name in the file, shape)


def layer_of(name: str) -> int | None:
    """The layer index of a GGUF tensor name (``blk.<i>.*``), None for the embedding and final norm."""
    m = _LAYER.match(name)
    return int(m.group(1)) if m else None


def text_config(cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The text model's fields of a ``config.json`` (a ``gemma3`` config's ``text_config``)."""
    model_type = cfg.get("model_type")
    if model_type == "gemma3_text":
        return dict(cfg)
    if model_type == "gemma3":
        text = cfg.get("text_config") or {}
        if not isinstance(text, Mapping):
            raise UnsupportedModelError(f"{source}: 'text_config' is {text!r}, not an object")
        if text.get("model_type", "gemma3_text") != "gemma3_text":
            raise UnsupportedModelError(
                f"{source}: text_config.model_type is {text['model_type']!r}, expected 'gemma3_text'"
            )
        out = dict(text)
        if "tie_word_embeddings" not in out and "tie_word_embeddings" in cfg:
            out["tie_word_embeddings"] = cfg["tie_word_embeddings"]
        return out
    raise UnsupportedModelError(
        f"{source}: unsupported architecture {model_type!r} in config.json (supported: gemma3_text, gemma3)"
    )


def _given(tc: Mapping[str, Any], key: str, source: str) -> int | None:
    v = tc.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise UnsupportedModelError(f"{source}: config.json {key} is {v!r}, not a positive integer")
    return v


def _sizes(tc: Mapping[str, Any], shapes: Shapes, source: str) -> dict[str, int]:
    """The size fields: stated ones checked against the tensors, missing ones read from them."""
    sizes: dict[str, int] = {}

    def settle(key: str, derived: int | None, tensor: str | None, why: str = "") -> None:
        given = _given(tc, key, source)
        if given is not None and derived is not None and given != derived:
            hf, shape = shapes[tensor]
            raise UnsupportedModelError(
                f"{source}: config.json sets {key} = {given} but tensor {hf!r} has shape {list(shape)}"
                f" ({key} = {derived}{why})"
            )
        sizes[key] = given if given is not None else derived if derived is not None else TEXT_DEFAULTS[key]

    def dim(tensor: str, axis: int) -> int | None:
        entry = shapes.get(tensor)
        return entry[1][axis] if entry and len(entry[1]) > axis else None

    embed = "token_embd.weight"
    settle("vocab_size", dim(embed, 0), embed)
    settle("hidden_size", dim(embed, 1), embed)
    settle("head_dim", dim("blk.0.attn_q_norm.weight", 0), "blk.0.attn_q_norm.weight")
    hd = sizes["head_dim"]
    for key, tensor in (
        ("num_attention_heads", "blk.0.attn_q.weight"),
        ("num_key_value_heads", "blk.0.attn_k.weight"),
    ):
        rows = dim(tensor, 0)
        if rows is not None and rows % hd:
            raise UnsupportedModelError(
                f"{source}: tensor {shapes[tensor][0]!r} has {rows} rows, not a multiple of head_dim {hd}"
            )
        settle(key, rows // hd if rows is not None else None, tensor, f" at head_dim {hd}")
    settle("intermediate_size", dim("blk.0.ffn_gate.weight", 0), "blk.0.ffn_gate.weight")
    # a config may run fewer layers than the file holds (as transformers does); never more
    layers = [i for n in shapes if (i := layer_of(n)) is not None]
    stated = _given(tc, "num_hidden_layers", source)
    if stated is not None and layers and stated > max(layers) + 1:
        raise UnsupportedModelError(
            f"{source}: config.json sets num_hidden_layers = {stated} but the files hold layers "
            f"0..{max(layers)} only"
        )
    sizes["num_hidden_layers"] = stated or (max(layers) + 1 if layers else TEXT_DEFAULTS["num_hidden_layers"])
    return sizes


def _rope(tc: Mapping[str, Any], source: str) -> tuple[float, float, float]:
    """(global base, local base, global linear scale) from either rope convention of transformers."""
    theta_global = tc.get("rope_theta") or TEXT_DEFAULTS["rope_theta"]
    theta_local = tc.get("rope_local_base_freq") or TEXT_DEFAULTS["rope_local_base_freq"]
    params = tc.get("rope_parameters")
    if isinstance(params, Mapping) and "full_attention" in params:  # transformers 5 (per layer type)
        full, local = params["full_attention"] or {}, params.get("sliding_attention") or {}
        theta_global = full.get("rope_theta", theta_global)
        theta_local = local.get("rope_theta", theta_local)
        _rope_type(local, "rope_parameters.sliding_attention", source, linear_ok=False)
        scaling, where = full, "rope_parameters.full_attention"
    elif params:
        raise UnsupportedModelError(
            f"{source}: config.json rope_parameters is {params!r}; Gemma 3 gives one per layer type "
            f"(full_attention, sliding_attention)"
        )
    else:
        scaling, where = tc.get("rope_scaling") or {}, "rope_scaling"
    kind = _rope_type(scaling, where, source, linear_ok=True)
    scale = float(scaling.get("factor", 1.0)) if kind == "linear" else 1.0
    return float(theta_global), float(theta_local), scale


def _rope_type(params: Mapping[str, Any], where: str, source: str, linear_ok: bool) -> str:
    kind = params.get("rope_type", params.get("type", "default"))
    allowed = ("default", "linear") if linear_ok else ("default",)
    if kind not in allowed:
        raise UnsupportedModelError(
            f"{source}: config.json {where} has rope_type {kind!r} (supported: {', '.join(allowed)})"
        )
    return kind


def check_shapes(config: ModelConfig, shapes: Shapes, source: str) -> None:
    """Every text tensor present must have the shape ``config`` gives it (missing ones fail later)."""
    for name, want in weight_shapes(config).items():
        if name in shapes and tuple(shapes[name][1]) != tuple(want):
            hf, got = shapes[name]
            raise UnsupportedModelError(
                f"{source}: tensor {hf!r} has shape {list(got)} but the config gives it {list(want)}"
            )


def config_from_hf(cfg: Mapping[str, Any], shapes: Shapes, source: str, name: str = "") -> ModelConfig:
    """:class:`ModelConfig` of a Hugging Face Gemma 3 ``config.json`` and its text tensors' shapes.

    ``shapes`` maps GGUF tensor names to (name in the file, shape); ``source`` names the config file in
    error messages.
    """
    tc = text_config(cfg, source)
    for key, runs in _FIXED:
        if key in tc and tc[key] != runs:
            raise UnsupportedModelError(
                f"{source}: config.json {key} is {tc[key]!r}; this engine runs Gemma 3 with {runs!r}"
            )
    sizes = _sizes(tc, shapes, source)
    rope_global, rope_local, scale = _rope(tc, source)
    layer_types = tc.get("layer_types")
    lt: tuple[str, ...] = ()
    if layer_types:
        lt = tuple("sliding" if t == "sliding_attention" else "global" for t in layer_types)

    def get(key: str) -> Any:
        v = tc.get(key)
        return TEXT_DEFAULTS[key] if v is None else v

    config = ModelConfig(
        name=name or str(cfg.get("_name_or_path") or "gemma3"),
        n_layers=sizes["num_hidden_layers"],
        hidden=sizes["hidden_size"],
        ffn=sizes["intermediate_size"],
        n_heads=sizes["num_attention_heads"],
        n_kv_heads=sizes["num_key_value_heads"],
        head_dim=sizes["head_dim"],
        vocab_size=sizes["vocab_size"],
        context_length=int(get("max_position_embeddings")),
        rms_eps=float(get("rms_norm_eps")),
        rope_base_global=rope_global,
        rope_base_local=rope_local,
        rope_scale_global=scale,
        sliding_window=int(get("sliding_window")),
        sliding_window_pattern=int(
            tc.get("sliding_window_pattern")
            or tc.get("_sliding_window_pattern")
            or TEXT_DEFAULTS["sliding_window_pattern"]
        ),
        query_pre_attn_scalar=float(get("query_pre_attn_scalar")),
        final_logit_softcap=tc.get("final_logit_softcapping"),
        tie_embeddings=bool(get("tie_word_embeddings")),
        layer_types=lt,
    )
    check_shapes(config, shapes, source)
    return config


__all__ = ["TEXT_DEFAULTS", "check_shapes", "config_from_hf", "layer_of", "text_config"]
