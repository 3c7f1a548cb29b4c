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

from collections.abc import Mapping
from typing import Any

from .config import ModelConfig
from .errors import ModelFormatError, UnsupportedModelError
from .gemma3 import highest_layer, weight_shapes
from .validate import MAX_LAYERS, Fields, Shapes, check_layer_count, check_shapes

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
# transformers' layer type names -> ModelConfig's
LAYER_TYPES = {"sliding_attention": "sliding", "full_attention": "global"}


def text_config(cfg: Mapping[str, Any], source: str) -> Fields:
    """The text model's fields of a ``config.json`` (a ``gemma3`` config's ``text_config``)."""
    top = Fields(cfg, source)
    if top.choice("model_type", None, ("gemma3_text", "gemma3")) == "gemma3_text":
        return top
    text = top.section("text_config")
    text.choice("model_type", "gemma3_text", ("gemma3_text",))
    return text


def _sizes(tc: Fields, shapes: Shapes) -> dict[str, int]:
    """The size fields: stated ones checked against the tensors, missing ones read from them."""
    sizes: dict[str, int] = {}

    def settle(key: str, derived: int | None, tensor: str | None, why: str = "") -> None:
        given = tc.integer(key, None)
        if given is not None and derived is not None and given != derived:
            hf, shape = shapes[tensor]
            raise ModelFormatError(
                f"{tc.source}: {tc.prefix}{key} = {given} but tensor {hf!r} has shape {list(shape)}"
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
            raise ModelFormatError(
                f"{tc.source}: tensor {shapes[tensor][0]!r} has {rows} rows, not a multiple of head_dim {hd}"
            )
        settle(key, rows // hd if rows else None, tensor, f" at head_dim {hd}")
    settle("intermediate_size", dim("blk.0.ffn_gate.weight", 0), "blk.0.ffn_gate.weight")
    stated = tc.integer("num_hidden_layers", None, hi=MAX_LAYERS)
    if stated is not None:
        check_layer_count(stated, shapes, f"{tc.prefix}num_hidden_layers", tc.source)
    highest = highest_layer(shapes)
    held = highest + 1 if highest is not None and highest < MAX_LAYERS else None
    sizes["num_hidden_layers"] = stated or held or TEXT_DEFAULTS["num_hidden_layers"]
    if sizes["num_attention_heads"] % sizes["num_key_value_heads"]:
        tc.fail(
            "num_key_value_heads",
            sizes["num_key_value_heads"],
            f"does not divide num_attention_heads {sizes['num_attention_heads']}",
        )
    if hd % 2:
        tc.fail("head_dim", hd, "odd: RoPE rotates pairs of values")
    return sizes


def rope_settings(tc: Fields) -> tuple[float, float, float]:
    """(global base, local base, global linear scale) from either rope convention of transformers."""
    theta_global = tc.number("rope_theta", TEXT_DEFAULTS["rope_theta"])
    theta_local = tc.number("rope_local_base_freq", TEXT_DEFAULTS["rope_local_base_freq"])
    params = tc.section("rope_parameters")
    if params.values:  # transformers 5: one set per layer type
        if not params.has("full_attention"):
            raise UnsupportedModelError(
                f"{tc.source}: {tc.prefix}rope_parameters is {dict(params.values)!r}; Gemma 3 gives one per "
                f"layer type (full_attention, sliding_attention)"
            )
        full, local = params.section("full_attention"), params.section("sliding_attention")
        theta_global = full.number("rope_theta", theta_global)
        theta_local = local.number("rope_theta", theta_local)
        _rope_type(local, linear_ok=False)
        scaling = full
    else:
        scaling = tc.section("rope_scaling")
    kind = _rope_type(scaling, linear_ok=True)
    scale = scaling.number("factor", 1.0) if kind == "linear" else 1.0
    return theta_global, theta_local, scale


def _rope_type(params: Fields, linear_ok: bool) -> str:
    kind = params.text("rope_type" if params.has("rope_type") else "type", "default")
    allowed = ("default", "linear") if linear_ok else ("default",)
    if kind not in allowed:
        raise UnsupportedModelError(
            f"{params.source}: {params.prefix.rstrip('.')} has rope_type {kind!r} "
            f"(supported: {', '.join(allowed)})"
        )
    return kind


def layer_types_of(tc: Fields, n_layers: int, family: str = "Gemma 3") -> tuple[str, ...]:
    """``layer_types`` in ModelConfig's names, or () when the config gives none (the caller derives them)."""
    given = tc.strings("layer_types", [])
    if not given:
        return ()
    unknown = [t for t in given if t not in LAYER_TYPES]
    if unknown:
        tc.fail("layer_types", given, f"holds {unknown[0]!r} ({family} layers: {', '.join(LAYER_TYPES)})")
    if len(given) != n_layers:
        tc.fail("layer_types", given, f"names {len(given)} layers, the model runs {n_layers}")
    return tuple(LAYER_TYPES[t] for t in given)


def config_from_hf(cfg: Mapping[str, Any], shapes: Shapes, source: str, name: str = "") -> ModelConfig:
    """:class:`ModelConfig` of a Hugging Face Gemma 3 ``config.json`` and its text tensors' shapes.

    ``shapes`` maps GGUF tensor names to (name in the file, shape); ``source`` names the config file in
    error messages.
    """
    tc = text_config(cfg, source)
    for key, runs in _FIXED:
        if tc.has(key) and tc.values[key] != runs:
            raise UnsupportedModelError(
                f"{source}: {tc.prefix}{key} is {tc.values[key]!r}; this engine runs Gemma 3 with {runs!r}"
            )
    sizes = _sizes(tc, shapes)
    rope_global, rope_local, scale = rope_settings(tc)
    pattern_key = "sliding_window_pattern" if tc.has("sliding_window_pattern") else "_sliding_window_pattern"
    top = Fields(cfg, source)
    config = ModelConfig(
        name=name or top.text("_name_or_path", "") or "gemma3",
        n_layers=sizes["num_hidden_layers"],
        hidden=sizes["hidden_size"],
        ffn=sizes["intermediate_size"],
        n_heads=sizes["num_attention_heads"],
        n_kv_heads=sizes["num_key_value_heads"],
        head_dim=sizes["head_dim"],
        vocab_size=sizes["vocab_size"],
        context_length=tc.integer("max_position_embeddings", TEXT_DEFAULTS["max_position_embeddings"]),
        rms_eps=tc.number("rms_norm_eps", TEXT_DEFAULTS["rms_norm_eps"]),
        rope_base_global=rope_global,
        rope_base_local=rope_local,
        rope_scale_global=scale,
        sliding_window=tc.integer("sliding_window", TEXT_DEFAULTS["sliding_window"]),
        sliding_window_pattern=tc.integer(pattern_key, TEXT_DEFAULTS["sliding_window_pattern"]),
        query_pre_attn_scalar=tc.number("query_pre_attn_scalar", TEXT_DEFAULTS["query_pre_attn_scalar"]),
        final_logit_softcap=tc.number("final_logit_softcapping", None),
        # a gemma3 config may state it beside text_config rather than in it
        tie_embeddings=tc.flag("tie_word_embeddings", top.flag("tie_word_embeddings", True)),
        layer_types=layer_types_of(tc, sizes["num_hidden_layers"]),
    )
    check_shapes(weight_shapes(config), shapes, source)
    return config


__all__ = ["LAYER_TYPES", "TEXT_DEFAULTS", "config_from_hf", "rope_settings", "text_config"]
