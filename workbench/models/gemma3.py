"""Gemma 3 forward step as a graph of named ops (the single description of the model)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ..ops.graph import Graph, WeightSpec
from .config import ModelConfig
from .step_builder import StepBuilder

_LAYER = re.compile(r"^blk\.(\d+)\.")


def layer_of(name: str) -> int | None:
    """The layer index of a GGUF tensor name (``blk.<i>.*``), None for the embedding and final norm."""
    m = _LAYER.match(name)
    return int(m.group(1)) if m else None


def highest_layer(names: Iterable[str]) -> int | None:
    """The highest layer index among tensor names, None when none belongs to a layer."""
    return max((i for n in names if (i := layer_of(n)) is not None), default=None)


def required_weights(config: ModelConfig) -> list[str]:
    names = ["token_embd.weight", "output_norm.weight"]
    for i in range(config.n_layers):
        names += [
            f"blk.{i}.{n}.weight"
            for n in (
                "attn_norm",
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_q_norm",
                "attn_k_norm",
                "attn_output",
                "post_attention_norm",
                "ffn_norm",
                "ffn_gate",
                "ffn_up",
                "ffn_down",
                "post_ffw_norm",
            )
        ]
    if not config.tie_embeddings:
        names.append("output.weight")
    return names


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Numpy-order shape of every weight the model needs (GGUF names)."""
    c = config
    shapes = {
        "token_embd": (c.vocab_size, c.hidden),
        "attn_q": (c.q_dim, c.hidden),
        "attn_k": (c.kv_dim, c.hidden),
        "attn_v": (c.kv_dim, c.hidden),
        "attn_output": (c.hidden, c.q_dim),
        "ffn_gate": (c.ffn, c.hidden),
        "ffn_up": (c.ffn, c.hidden),
        "ffn_down": (c.hidden, c.ffn),
        "attn_q_norm": (c.head_dim,),
        "attn_k_norm": (c.head_dim,),
        "output": (c.vocab_size, c.hidden),
    }
    return {n: shapes.get(n.split(".")[-2], (c.hidden,)) for n in required_weights(config)}


def build_graph(
    config: ModelConfig, weights: Mapping[str, WeightSpec], n_tokens: int, n_logits: int
) -> Graph:
    """The forward step for ``n_tokens`` tokens with logits for ``n_logits`` of them.

    Step inputs: ``tokens`` (T,), ``positions`` (T,), ``logit_rows`` (R,) indices into the T tokens.
    Output: ``logits`` (R, vocab). Attention ops read and extend the KV cache of their layer (``op.layer``).
    """
    b = StepBuilder(config, weights, n_tokens, n_logits, required_weights(config))
    c, act, add = config, b.act, b.add
    x = act("x.embed", c.hidden)
    add("embed", "embed", ["tokens"], [x], ["token_embd.weight"], scale=c.embed_scale)
    for i in range(c.n_layers):
        p = f"blk.{i}"
        w = lambda n, p=p: f"{p}.{n}.weight"  # noqa: E731
        norm = dict(eps=c.rms_eps)
        h = act(f"{p}.attn_in", c.hidden)
        add(f"{p}.attn_norm", "rmsnorm", [x], [h], [w("attn_norm")], i, **norm)
        q, k, v = act(f"{p}.q", c.q_dim), act(f"{p}.k", c.kv_dim), act(f"{p}.v", c.kv_dim)
        add(f"{p}.attn_q", "matmul", [h], [q], [w("attn_q")], i)
        add(f"{p}.attn_k", "matmul", [h], [k], [w("attn_k")], i)
        add(f"{p}.attn_v", "matmul", [h], [v], [w("attn_v")], i)
        qn, kn = act(f"{p}.q_normed", c.q_dim), act(f"{p}.k_normed", c.kv_dim)
        add(f"{p}.attn_q_norm", "rmsnorm", [q], [qn], [w("attn_q_norm")], i, group=c.head_dim, **norm)
        add(f"{p}.attn_k_norm", "rmsnorm", [k], [kn], [w("attn_k_norm")], i, group=c.head_dim, **norm)
        rope = dict(head_dim=c.head_dim, base=c.rope_base(i), scale=c.rope_scale(i))
        qr, kr = act(f"{p}.q_rope", c.q_dim), act(f"{p}.k_rope", c.kv_dim)
        add(f"{p}.rope_q", "rope", [qn, "positions"], [qr], (), i, n_heads=c.n_heads, **rope)
        add(f"{p}.rope_k", "rope", [kn, "positions"], [kr], (), i, n_heads=c.n_kv_heads, **rope)
        o = act(f"{p}.attn_out", c.q_dim)
        add(
            f"{p}.attn",
            "attention",
            [qr, kr, v, "positions"],
            [o],
            (),
            i,
            n_heads=c.n_heads,
            n_kv_heads=c.n_kv_heads,
            head_dim=c.head_dim,
            scale=c.attn_scale,
            window=c.sliding_window if c.is_sliding(i) else 0,
        )
        a = act(f"{p}.attn_proj", c.hidden)
        add(f"{p}.attn_output", "matmul", [o], [a], [w("attn_output")], i)
        an = act(f"{p}.attn_post", c.hidden)
        add(f"{p}.post_attention_norm", "rmsnorm", [a], [an], [w("post_attention_norm")], i, **norm)
        x_mid = act(f"{p}.x_attn", c.hidden)
        add(f"{p}.attn_residual", "add", [x, an], [x_mid], (), i)
        h2 = act(f"{p}.ffn_in", c.hidden)
        add(f"{p}.ffn_norm", "rmsnorm", [x_mid], [h2], [w("ffn_norm")], i, **norm)
        g, u = act(f"{p}.gate", c.ffn), act(f"{p}.up", c.ffn)
        add(f"{p}.ffn_gate", "matmul", [h2], [g], [w("ffn_gate")], i)
        add(f"{p}.ffn_up", "matmul", [h2], [u], [w("ffn_up")], i)
        f = act(f"{p}.ffn_act", c.ffn)
        add(f"{p}.ffn_act", "gelu_mul", [g, u], [f], (), i)
        d = act(f"{p}.ffn_proj", c.hidden)
        add(f"{p}.ffn_down", "matmul", [f], [d], [w("ffn_down")], i)
        dn = act(f"{p}.ffn_post", c.hidden)
        add(f"{p}.post_ffw_norm", "rmsnorm", [d], [dn], [w("post_ffw_norm")], i, **norm)
        x = act(f"{p}.x_out", c.hidden)
        add(f"{p}.ffn_residual", "add", [x_mid, dn], [x], (), i)
    xr = act("x.rows", c.hidden, n_logits)
    add("gather_rows", "gather_rows", [x, "logit_rows"], [xr])
    return b.head(xr)
