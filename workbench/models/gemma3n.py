"""Gemma 3n (E2B, E4B) text decoder's forward step as a graph of named ops (the single description of it).

What differs from Gemma 3 (:mod:`.gemma3`), op by op, is in docs/gemma3n.md: four AltUp streams carried as
one (tokens, 4 * hidden) activation, LAuReL beside attention, a per-layer embedding (PLE) added to the
streams after each layer, the Gaussian top-k on the sparse layers' gate, and the last
``kv_shared_layers`` layers attending over an earlier layer's KV cache. Weights have llama.cpp's GGUF names;
norm weights are used as stored (no 1 + w).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from statistics import NormalDist

import numpy as np

from ..ops.graph import Graph, WeightSpec
from .config import ModelConfig
from .step_builder import StepBuilder

# per-layer weights every layer has, and those only layers that own a KV cache have
LAYER_WEIGHTS = (
    "attn_norm",
    "attn_q",
    "attn_q_norm",
    "attn_output",
    "post_attention_norm",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
    "post_ffw_norm",
    "altup_router_norm",
    "altup_router",
    "altup_predict_coef",
    "altup_correct_coef",
    "altup_correct_scale",
    "laurel_l",
    "laurel_r",
    "laurel_post_norm",
    "inp_gate",
    "proj",
    "post_norm",
)
KV_WEIGHTS = ("attn_k", "attn_v", "attn_k_norm")
GLOBAL_WEIGHTS = (
    "token_embd",
    "per_layer_token_embd",
    "per_layer_model_proj",
    "per_layer_proj_norm",
    "altup_proj",
    "altup_unembd_proj",
    "output_norm",
)


def gaussian_std_multiplier(sparsity: float) -> float:
    """Phi^-1(sparsity), as transformers computes it from the float32 sparsity: the Gaussian top-k keeps
    the gate values above mean + this * std (1.6448536 at Gemma 3n's 0.95)."""
    return float(np.float32(NormalDist().inv_cdf(float(np.float32(sparsity)))))


def required_weights(config: ModelConfig) -> list[str]:
    """GGUF names of every weight the model uses (a sharing layer has no K/V projections)."""
    names = [f"{n}.weight" for n in GLOBAL_WEIGHTS]
    for i in range(config.n_layers):
        own = LAYER_WEIGHTS + (KV_WEIGHTS if config.owns_kv(i) else ())
        names += [f"blk.{i}.{n}.weight" for n in own]
    if not config.tie_embeddings:
        names.append("output.weight")
    return names


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Numpy-order shape of every weight the model needs (GGUF names; llama.cpp's layouts)."""
    c = config
    h, n, lp = c.hidden, c.altup_inputs, c.n_layers * c.ple_dim
    shapes = {
        "token_embd": (c.vocab_size, h),
        "output": (c.vocab_size, h),
        "per_layer_token_embd": (c.ple_vocab_size, lp),
        "per_layer_model_proj": (lp, h),
        "per_layer_proj_norm": (c.ple_dim,),
        "altup_proj": (n - 1, h, h),
        "altup_unembd_proj": (n - 1, h, h),
        "attn_q": (c.q_dim, h),
        "attn_k": (c.kv_dim, h),
        "attn_v": (c.kv_dim, h),
        "attn_output": (h, c.q_dim),
        "attn_q_norm": (c.head_dim,),
        "attn_k_norm": (c.head_dim,),
        "ffn_gate": (c.ffn, h),
        "ffn_up": (c.ffn, h),
        "ffn_down": (h, c.ffn),
        "altup_router": (n, h),
        "altup_predict_coef": (n * n, n),
        "altup_correct_coef": (n, n),
        "laurel_l": (c.laurel_rank, h),
        "laurel_r": (h, c.laurel_rank),
        "inp_gate": (c.ple_dim, h),
        "proj": (h, c.ple_dim),
    }
    return {name: shapes.get(name.split(".")[-2], (h,)) for name in required_weights(config)}


def build_graph(
    config: ModelConfig, weights: Mapping[str, WeightSpec], n_tokens: int, n_logits: int
) -> Graph:
    """The forward step for ``n_tokens`` tokens with logits for ``n_logits`` of them.

    Step inputs and output as :func:`.gemma3.build_graph`. Attention ops of layers that own a KV cache
    read and extend it; ``shared_kv_attention`` ops read the cache of layer ``attrs["kv_layer"]``, which
    an earlier op of the same step extended.
    """
    b = StepBuilder(config, weights, n_tokens, n_logits, required_weights(config), "Gemma 3n model")
    c, act, add = config, b.act, b.add
    h, streams = c.hidden, c.altup_inputs * c.hidden
    norm = dict(eps=c.rms_eps)
    lp = c.n_layers * c.ple_dim
    e = act("x.embed", h)
    add("embed", "embed", ["tokens"], [e], ["token_embd.weight"], scale=c.embed_scale)
    rows = act("ple.rows", lp)
    add("ple_embed", "embed", ["tokens"], [rows], ["per_layer_token_embd.weight"], scale=math.sqrt(c.ple_dim))
    proj = act("ple.proj", lp)
    add("ple_model_proj", "matmul", [e], [proj], ["per_layer_model_proj.weight"])
    pli = act("ple.inputs", lp)
    add(
        "ple_project",
        "ple_project",
        [proj, rows],
        [pli],
        ["per_layer_proj_norm.weight"],
        scale=h**-0.5,
        group=c.ple_dim,
        **norm,
    )
    x = act("x.streams", streams)
    add("altup_expand", "altup_expand", [e], [x], ["altup_proj.weight"])
    for i in range(c.n_layers):
        x = _layer(c, i, x, pli, act, add)
    xr = act("x.rows", streams, n_logits)
    add("gather_rows", "gather_rows", [x, "logit_rows"], [xr])
    xm = act("x.mean", h, n_logits)
    add("altup_unembed", "altup_unembed", [xr], [xm], ["altup_unembd_proj.weight"])
    return b.head(xm)


def _layer(c: ModelConfig, i: int, x: str, pli: str, act, add) -> str:
    """Ops of layer ``i`` reading the AltUp streams ``x``; returns the name of its output streams."""
    p = f"blk.{i}"

    def w(n: str) -> str:
        return f"{p}.{n}.weight"

    h, streams = c.hidden, c.altup_inputs * c.hidden
    norm = dict(eps=c.rms_eps)
    pred, a = act(f"{p}.altup_pred", streams), act(f"{p}.active", h)
    router = [w("altup_router_norm"), w("altup_router")]
    add(f"{p}.altup_predict", "altup_predict", [x], [pred, a], [*router, w("altup_predict_coef")], i, **norm)
    n = act(f"{p}.attn_in", h)
    add(f"{p}.attn_norm", "rmsnorm", [a], [n], [w("attn_norm")], i, **norm)
    # attention: Q always; K and V only where the layer owns its cache
    rope = dict(head_dim=c.head_dim, base=c.rope_base(i), scale=c.rope_scale(i))
    q, qn, qr = act(f"{p}.q", c.q_dim), act(f"{p}.q_normed", c.q_dim), act(f"{p}.q_rope", c.q_dim)
    add(f"{p}.attn_q", "matmul", [n], [q], [w("attn_q")], i)
    add(f"{p}.attn_q_norm", "rmsnorm", [q], [qn], [w("attn_q_norm")], i, group=c.head_dim, **norm)
    add(f"{p}.rope_q", "rope", [qn, "positions"], [qr], (), i, n_heads=c.n_heads, **rope)
    heads = dict(n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, head_dim=c.head_dim, scale=c.attn_scale)
    window = c.sliding_window if c.is_sliding(i) else 0
    o = act(f"{p}.attn_out", c.q_dim)
    if c.owns_kv(i):
        k, v = act(f"{p}.k", c.kv_dim), act(f"{p}.v", c.kv_dim)
        add(f"{p}.attn_k", "matmul", [n], [k], [w("attn_k")], i)
        add(f"{p}.attn_v", "matmul", [n], [v], [w("attn_v")], i)
        kn, kr, vn = (
            act(f"{p}.k_normed", c.kv_dim),
            act(f"{p}.k_rope", c.kv_dim),
            act(f"{p}.v_normed", c.kv_dim),
        )
        add(f"{p}.attn_k_norm", "rmsnorm", [k], [kn], [w("attn_k_norm")], i, group=c.head_dim, **norm)
        add(f"{p}.attn_v_norm", "rmsnorm_plain", [v], [vn], (), i, group=c.head_dim, **norm)
        add(f"{p}.rope_k", "rope", [kn, "positions"], [kr], (), i, n_heads=c.n_kv_heads, **rope)
        add(f"{p}.attn", "attention", [qr, kr, vn, "positions"], [o], (), i, window=window, **heads)
    else:
        src = c.kv_layer(i)
        add(
            f"{p}.attn",
            "shared_kv_attention",
            [qr, "positions"],
            [o],
            (),
            i,
            window=window,
            kv_layer=src,
            **heads,
        )
    att, attn = act(f"{p}.attn_proj", h), act(f"{p}.attn_post", h)
    add(f"{p}.attn_output", "matmul", [o], [att], [w("attn_output")], i)
    add(f"{p}.post_attention_norm", "rmsnorm", [att], [attn], [w("post_attention_norm")], i, **norm)
    # LAuReL: a low-rank branch beside attention, joined in the residual
    ll, lr, lrn = act(f"{p}.laurel_low", c.laurel_rank), act(f"{p}.laurel", h), act(f"{p}.laurel_post", h)
    add(f"{p}.laurel_l", "matmul", [n], [ll], [w("laurel_l")], i)
    add(f"{p}.laurel_r", "matmul", [ll], [lr], [w("laurel_r")], i)
    add(f"{p}.laurel_post_norm", "rmsnorm", [lr], [lrn], [w("laurel_post_norm")], i, **norm)
    y = act(f"{p}.x_attn", h)
    add(f"{p}.laurel_residual", "laurel_residual", [a, attn, n, lrn], [y], (), i)
    # MLP, with the Gaussian top-k on the gate of sparse layers
    h2, g, u = act(f"{p}.ffn_in", h), act(f"{p}.gate", c.ffn), act(f"{p}.up", c.ffn)
    add(f"{p}.ffn_norm", "rmsnorm", [y], [h2], [w("ffn_norm")], i, **norm)
    add(f"{p}.ffn_gate", "matmul", [h2], [g], [w("ffn_gate")], i)
    sparsity = c.activation_sparsity[i]
    if sparsity > 0:
        gs = act(f"{p}.gate_topk", c.ffn)
        k = gaussian_std_multiplier(sparsity)
        add(f"{p}.gaussian_topk", "gaussian_topk", [g], [gs], (), i, sparsity=sparsity, std_multiplier=k)
        g = gs
    add(f"{p}.ffn_up", "matmul", [h2], [u], [w("ffn_up")], i)
    f, d, dn = act(f"{p}.ffn_act", c.ffn), act(f"{p}.ffn_proj", h), act(f"{p}.ffn_post", h)
    add(f"{p}.ffn_act", "gelu_mul", [g, u], [f], (), i)
    add(f"{p}.ffn_down", "matmul", [f], [d], [w("ffn_down")], i)
    add(f"{p}.post_ffw_norm", "rmsnorm", [d], [dn], [w("post_ffw_norm")], i, **norm)
    z = act(f"{p}.x_out", h)
    add(f"{p}.ffn_residual", "add", [y, dn], [z], (), i)
    # AltUp correct, then the per-layer embedding into streams 1..n-1
    xc, gin = act(f"{p}.altup_corrected", streams), act(f"{p}.ple_gate_in", h)
    weights = [*router, w("altup_correct_coef"), w("altup_correct_scale")]
    add(f"{p}.altup_correct", "altup_correct", [pred, z], [xc, gin], weights, i, **norm)
    gg, gp = act(f"{p}.ple_gate_proj", c.ple_dim), act(f"{p}.ple_gated", c.ple_dim)
    add(f"{p}.inp_gate", "matmul", [gin], [gg], [w("inp_gate")], i)
    add(f"{p}.ple_gate", "ple_gate", [gg, pli], [gp], (), i)
    r, rn = act(f"{p}.ple_proj", h), act(f"{p}.ple_post", h)
    add(f"{p}.proj", "matmul", [gp], [r], [w("proj")], i)
    add(f"{p}.post_norm", "rmsnorm", [r], [rn], [w("post_norm")], i, **norm)
    out = act(f"{p}.x_streams", streams)
    add(f"{p}.ple_inject", "ple_inject", [xc, rn], [out], (), i)
    return out
