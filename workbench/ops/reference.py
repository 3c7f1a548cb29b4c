"""Reference semantics of every op kind, as pure numpy functions in float32.

These functions define the ops: every backend is tested against them. They follow Hugging Face
transformers' Gemma 3 (eager attention) in the order of their arithmetic.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
_GELU_C = F32(np.sqrt(2.0 / np.pi))


def embed(rows: np.ndarray, scale: float) -> np.ndarray:
    """Embedding rows (already looked up, float32) times the embedding scale (sqrt(hidden) for Gemma)."""
    return rows.astype(F32, copy=False) * F32(scale)


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float, group: int | None = None) -> np.ndarray:
    """RMSNorm over groups of ``group`` values (default: the whole last axis), times ``w`` as the model uses
    it (Gemma 3's 1+w, Gemma 3n's w: loaders store it so)."""
    shape = x.shape
    g = group or shape[-1]
    xs = x.reshape(-1, g).astype(F32, copy=False)
    ms = np.mean(xs * xs, axis=-1, keepdims=True, dtype=F32)
    out = xs * (F32(1.0) / np.sqrt(ms + F32(eps)))
    return (out * w.astype(F32, copy=False).reshape(1, g)).reshape(shape)


def matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x @ w.T``: x is (tokens, in), w is (out, in) as stored."""
    return np.matmul(x.astype(F32, copy=False), w.T.astype(F32, copy=False))


def rope_inv_freq(head_dim: int, base: float, scale: float = 1.0) -> np.ndarray:
    """RoPE inverse frequencies (head_dim / 2,) in float32, as transformers computes them."""
    exps = np.arange(0, head_dim, 2, dtype=np.int64).astype(F32) / F32(head_dim)
    inv_freq = (F32(1.0) / (F32(base) ** exps)).astype(F32)
    return inv_freq / F32(scale) if scale != 1.0 else inv_freq


def rope_tables(
    positions: np.ndarray, head_dim: int, base: float, scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables, (tokens, head_dim), as transformers computes them in float32."""
    inv_freq = rope_inv_freq(head_dim, base, scale)
    freqs = positions.astype(F32)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(F32), np.sin(emb).astype(F32)


def rope(
    x: np.ndarray, positions: np.ndarray, n_heads: int, head_dim: int, base: float, scale: float = 1.0
) -> np.ndarray:
    """Rotary embedding, rotate-half (NeoX) style, applied to each head of x (tokens, n_heads*head_dim)."""
    cos, sin = rope_tables(positions, head_dim, base, scale)
    xh = x.reshape(len(positions), n_heads, head_dim).astype(F32, copy=False)
    half = head_dim // 2
    rot = np.concatenate([-xh[..., half:], xh[..., :half]], axis=-1)
    out = xh * cos[:, None, :] + rot * sin[:, None, :]
    return out.reshape(x.shape)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    x = x.astype(F32, copy=False)
    return F32(0.5) * x * (F32(1.0) + np.tanh(_GELU_C * (x + F32(0.044715) * (x * x * x))))


def gelu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """GELU(tanh)(gate) * up: Gemma's gated MLP activation."""
    return gelu_tanh(gate) * up.astype(F32, copy=False)


def attention(
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    q_pos: np.ndarray,
    k_pos: np.ndarray,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    scale: float,
    window: int = 0,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """Causal (optionally sliding-window) grouped-query attention.

    q: (T, n_heads*head_dim); keys/values: (S, n_kv_heads*head_dim) with their positions ``k_pos`` (S,).
    A query at position p sees keys at positions k with k <= p and, with a window W, k > p - W, and, with a
    boolean ``mask`` (T, S), only where it is true (sparse attention variants). Returns (T, n_heads*head_dim).
    """
    t, s = q.shape[0], keys.shape[0]
    group = n_heads // n_kv_heads
    qh = q.reshape(t, n_kv_heads, group, head_dim).astype(F32, copy=False)
    kh = keys.reshape(s, n_kv_heads, head_dim).astype(F32, copy=False)
    vh = values.reshape(s, n_kv_heads, head_dim).astype(F32, copy=False)
    scores = np.einsum("tkgd,skd->kgts", qh, kh, optimize=True) * F32(scale)
    visible = k_pos[None, :] <= q_pos[:, None]
    if window:
        visible &= k_pos[None, :] > q_pos[:, None] - window
    if mask is not None:
        visible &= mask
    scores = np.where(visible[None, None], scores, F32(-np.inf))
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out = np.einsum("kgts,skd->tkgd", p, vh, optimize=True)
    return out.reshape(t, n_heads * head_dim).astype(F32, copy=False)


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    return (np.tanh(x / F32(cap)) * F32(cap)).astype(F32)
