"""Reference semantics of the op kinds Gemma 3n adds, as pure numpy functions in float32.

They follow Hugging Face transformers' ``models/gemma3n/modeling_gemma3n.py`` in the order of its
arithmetic (see docs/gemma3n.md). Activations that carry the AltUp streams are (tokens, n * hidden):
stream ``i`` is columns ``i * hidden .. (i + 1) * hidden``; stream 0 is the active one, the one the
layer's attention and MLP see.
"""

from __future__ import annotations

import math

import numpy as np

from .reference import gelu_tanh, matmul, rmsnorm

F32 = np.float32
MIN_MAGNITUDE_SQ = 1e-5  # AltUp's floor on a projected stream's mean square before it is rescaled


def streams(x: np.ndarray, n: int) -> np.ndarray:
    """(tokens, n * hidden) -> (n, tokens, hidden): a view of each AltUp stream."""
    t = x.shape[0]
    return x.reshape(t, n, -1).transpose(1, 0, 2)


def join_streams(s: np.ndarray) -> np.ndarray:
    """(n, tokens, hidden) -> (tokens, n * hidden), the layout of stream activations."""
    n, t, h = s.shape
    return np.ascontiguousarray(s.transpose(1, 0, 2)).reshape(t, n * h)


def rmsnorm_plain(x: np.ndarray, eps: float, group: int | None = None) -> np.ndarray:
    """RMSNorm without a weight, over groups of ``group`` values (Gemma 3n's V norm, per head)."""
    shape = x.shape
    g = group or shape[-1]
    xs = x.reshape(-1, g).astype(F32, copy=False)
    ms = np.mean(xs * xs, axis=-1, keepdims=True, dtype=F32)
    return (xs * (F32(1.0) / np.sqrt(ms + F32(eps)))).reshape(shape)


def _match_magnitude(y: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``y`` rescaled to the root mean square ``target`` (per row), its own floored at sqrt(1e-5)."""
    own = np.sqrt(np.maximum(np.mean(y * y, axis=-1, keepdims=True, dtype=F32), F32(MIN_MAGNITUDE_SQ)))
    return y * target / own


def altup_expand(x: np.ndarray, proj: np.ndarray) -> np.ndarray:
    """The AltUp streams of the embedding ``x`` (tokens, hidden): stream 0 is ``x``, stream k >= 1 is
    ``proj[k-1] @ x`` rescaled to ``x``'s root mean square. ``proj`` is (n-1, hidden, hidden)."""
    x = x.astype(F32, copy=False)
    target = np.sqrt(np.mean(x * x, axis=-1, keepdims=True, dtype=F32))
    out = [x] + [_match_magnitude(matmul(x, p), target) for p in proj]
    return join_streams(np.stack(out))


def altup_unembed(x: np.ndarray, proj: np.ndarray) -> np.ndarray:
    """The mean of the AltUp streams after the last layer: stream 0 as it is, stream k >= 1 as
    ``proj[k-1] @ stream_k`` rescaled to stream 0's root mean square. Returns (tokens, hidden)."""
    s = streams(x.astype(F32, copy=False), len(proj) + 1)
    target = np.sqrt(np.mean(s[0] * s[0], axis=-1, keepdims=True, dtype=F32))
    out = [s[0]] + [_match_magnitude(matmul(s[k + 1], p), target) for k, p in enumerate(proj)]
    return np.mean(np.stack(out), axis=0, dtype=F32)


def altup_router(x: np.ndarray, norm_w: np.ndarray, router_w: np.ndarray, eps: float) -> np.ndarray:
    """The AltUp router's modalities: tanh(W_router @ (RMSNorm(x) / hidden)), (tokens, n)."""
    h = x.shape[-1]
    return np.tanh(matmul(rmsnorm(x, norm_w, eps) * F32(1.0 / h), router_w)).astype(F32)


def altup_predict(
    x: np.ndarray, norm_w: np.ndarray, router_w: np.ndarray, coef_w: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """AltUp's prediction: ``p_i = x_i + sum_j A_ij x_j`` with ``A = reshape(coef_w @ m, (n, n))`` and ``m``
    the router's modalities of the active stream. Returns (predictions (tokens, n * hidden), the active
    prediction p_0 (tokens, hidden))."""
    n = router_w.shape[0]
    s = streams(x.astype(F32, copy=False), n)
    coefs = matmul(altup_router(s[0], norm_w, router_w, eps), coef_w).reshape(-1, n, n)  # (t, i, j)
    p = np.einsum("tij,jth->ith", coefs, s, optimize=True).astype(F32) + s
    return join_streams(p), np.ascontiguousarray(p[0])


def altup_correct(
    p: np.ndarray,
    z: np.ndarray,
    norm_w: np.ndarray,
    router_w: np.ndarray,
    coef_w: np.ndarray,
    scale_w: np.ndarray,
    eps: float,
) -> tuple[np.ndarray, np.ndarray]:
    """AltUp's correction of the predictions ``p`` by the layer's output ``z`` (the active stream's new
    value): ``q_i = p_i + c_i (z - p_0)`` with ``c = coef_w @ m + 1`` and ``m`` the router's modalities of
    ``z``. Returns (q (tokens, n * hidden), q_0 * scale_w: the input of the per-layer-embedding gate)."""
    n = router_w.shape[0]
    s = streams(p.astype(F32, copy=False), n)
    z = z.astype(F32, copy=False)
    c = matmul(altup_router(z, norm_w, router_w, eps), coef_w) + F32(1.0)  # (t, n)
    q = (z - s[0])[None] * c.T[:, :, None] + s
    return join_streams(q), q[0] * scale_w.astype(F32, copy=False)


def laurel_residual(x: np.ndarray, attn: np.ndarray, h: np.ndarray, laurel: np.ndarray) -> np.ndarray:
    """The layer's residual after attention with LAuReL: ``((x + attn) + (h + laurel)) / sqrt(2)``, where
    ``h`` is the normed input both branches read and ``laurel`` its normed low-rank projection."""
    return ((x + attn) + (h + laurel)) / F32(math.sqrt(2.0))


def gaussian_topk(g: np.ndarray, std_multiplier: float, ddof: int = 0) -> np.ndarray:
    """``relu(g - (mean(g) + k * std(g)))`` per row, population std as transformers (``ddof`` 1: the sample
    std llama.cpp uses): about the top ``1 - Phi(k)`` of the values survive, shifted down by the cutoff
    (Gemma 3n's activation sparsity, before GELU)."""
    g = g.astype(F32, copy=False)
    mean = np.mean(g, axis=-1, keepdims=True, dtype=F32)
    n = g.shape[-1]
    std = np.sqrt(np.sum((g - mean) ** 2, axis=-1, keepdims=True, dtype=F32) / F32(n - ddof))
    return np.maximum(g - (mean + std * F32(std_multiplier)), F32(0.0))


def ple_project(
    proj: np.ndarray, rows: np.ndarray, norm_w: np.ndarray, scale: float, group: int, eps: float
) -> np.ndarray:
    """Every layer's per-layer input: ``(RMSNorm(proj * scale) + rows) / sqrt(2)``, the norm over each
    layer's ``group`` values; ``proj`` is the embedding's projection, ``rows`` the per-layer embedding
    table's rows of the tokens (both (tokens, layers * group))."""
    normed = rmsnorm(proj.astype(F32, copy=False) * F32(scale), norm_w, eps, group)
    return (normed + rows.astype(F32, copy=False)) * F32(1.0 / math.sqrt(2.0))


def ple_gate(g: np.ndarray, inputs: np.ndarray, layer: int) -> np.ndarray:
    """``gelu_tanh(g) * inputs[:, layer]``: the gate of a layer's per-layer input (width of ``g``)."""
    w = g.shape[-1]
    return gelu_tanh(g) * inputs[:, layer * w : (layer + 1) * w].astype(F32, copy=False)


def ple_inject(x: np.ndarray, r: np.ndarray) -> np.ndarray:
    """The AltUp streams ``x`` with ``r`` added to every stream but the first (the active one)."""
    n = x.shape[-1] // r.shape[-1]
    s = streams(x.astype(F32, copy=False), n).copy()
    s[1:] += r.astype(F32, copy=False)
    return join_streams(s)
