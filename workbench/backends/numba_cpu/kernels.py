"""numba kernels for the small ops of a step: norms, RoPE, activations, residual adds, decode attention.

Each mirrors its reference in :mod:`workbench.ops.reference` (float32 arithmetic, same order of operations
where it matters) and writes into an output array the caller owns.
"""

from __future__ import annotations

import math

import numpy as np

from ...numba_jit import numba
from . import attend_simd as av

njit = numba.njit
F32 = np.float32


@njit(cache=True, fastmath=True, inline="always")
def inv_rms(v, eps):  # pragma: no cover - compiled
    """1 / sqrt(mean(v^2) + eps) of a 1-D slice (indexed from 0, so the sum vectorizes: a computed index
    ``start + i`` keeps numba's negative-index check and the loop scalar, 0.54 us for 640 values)."""
    ss = np.float32(0.0)
    for i in range(v.shape[0]):
        ss += v[i] * v[i]
    return np.float32(1.0) / np.sqrt(ss / np.float32(v.shape[0]) + np.float32(eps))


@njit(cache=True, fastmath=True)
def rmsnorm(x, w, eps, group, out):  # pragma: no cover - compiled
    """RMSNorm of each ``group`` values of every row (group = row length for a plain norm)."""
    t_n, k = x.shape
    for t in range(t_n):
        for g0 in range(0, k, group):
            xs, os = x[t, g0 : g0 + group], out[t, g0 : g0 + group]
            inv = inv_rms(xs, eps)
            for i in range(group):
                os[i] = xs[i] * inv * w[i]


@njit(cache=True, fastmath=True)
def rmsnorm_rope(x, w, eps, cos, sin, head_dim, out):  # pragma: no cover - compiled
    """Per-head RMSNorm then rotate-half RoPE with tables ``cos``/``sin`` (tokens, head_dim)."""
    t_n, k = x.shape
    half = head_dim // 2
    buf = np.empty(head_dim, np.float32)
    for t in range(t_n):
        for h0 in range(0, k, head_dim):
            xs = x[t, h0 : h0 + head_dim]
            inv = inv_rms(xs, eps)
            for i in range(head_dim):
                buf[i] = xs[i] * inv * w[i]
            for i in range(half):
                a, b = buf[i], buf[i + half]
                out[t, h0 + i] = a * cos[t, i] - b * sin[t, i]
                out[t, h0 + half + i] = b * cos[t, half + i] + a * sin[t, half + i]


@njit(cache=True, fastmath=True)
def rope(x, cos, sin, head_dim, out):  # pragma: no cover - compiled
    t_n, k = x.shape
    half = head_dim // 2
    for t in range(t_n):
        for h0 in range(0, k, head_dim):
            for i in range(half):
                a, b = x[t, h0 + i], x[t, h0 + half + i]
                out[t, h0 + i] = a * cos[t, i] - b * sin[t, i]
                out[t, h0 + half + i] = b * cos[t, half + i] + a * sin[t, half + i]


# tanh(x) ~ x * P(x^2) / Q(x^2) on |x| <= 7.905 (beyond, tanh rounds to +-1 in float32): a rational
# minimax fit with error under 1e-6 that LLVM vectorizes (numba's tanh is a scalar libm call per element).
_TANH_CLAMP = 7.90531110763549805
_TANH_P = (4.89352455891786e-03, 6.37261928875436e-04, 1.48572235717979e-05, 5.12229709037114e-08,
           -8.60467152213735e-11, 2.00018790482477e-13, -2.76076847742355e-16)  # fmt: skip
_TANH_Q = (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04, 1.19825839466702e-06)


@njit(cache=True, fastmath=True, inline="always")
def tanh_approx(x):  # pragma: no cover - compiled
    x = min(max(x, np.float32(-_TANH_CLAMP)), np.float32(_TANH_CLAMP))
    x2 = x * x
    p = np.float32(_TANH_P[6])
    for i in range(5, -1, -1):
        p = p * x2 + np.float32(_TANH_P[i])
    q = np.float32(_TANH_Q[3])
    for i in range(2, -1, -1):
        q = q * x2 + np.float32(_TANH_Q[i])
    return x * p / q


@njit(cache=True, fastmath=True, error_model="numpy")  # no zero-division branch: the tanh vectorizes
def gelu_mul(gate, up, out):  # pragma: no cover - compiled
    c = np.float32(math.sqrt(2.0 / math.pi))
    for t in range(gate.shape[0]):
        for i in range(gate.shape[1]):
            g = gate[t, i]
            th = tanh_approx(c * (g + np.float32(0.044715) * g * g * g))
            out[t, i] = np.float32(0.5) * g * (np.float32(1.0) + th) * up[t, i]


@njit(cache=True, fastmath=True)
def add(a, b, out):  # pragma: no cover - compiled
    for t in range(a.shape[0]):
        for i in range(a.shape[1]):
            out[t, i] = a[t, i] + b[t, i]


@njit(cache=True, fastmath=True)
def rmsnorm_add(x, w, eps, residual, out):  # pragma: no cover - compiled
    """``residual + rmsnorm(x) * w`` (post-norm and residual of a block)."""
    t_n, k = x.shape
    for t in range(t_n):
        inv = inv_rms(x[t], eps)
        for i in range(k):
            out[t, i] = residual[t, i] + x[t, i] * inv * w[i]


@njit(cache=True, fastmath=True)
def scale_rows(x, scale):  # pragma: no cover - compiled
    for t in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[t, i] *= np.float32(scale)


@njit(cache=True, fastmath=True)
def softcap(x, cap, out):  # pragma: no cover - compiled
    inv = np.float32(1.0) / np.float32(cap)
    for t in range(x.shape[0]):
        for i in range(x.shape[1]):
            out[t, i] = tanh_approx(x[t, i] * inv) * np.float32(cap)


@njit(cache=True)
def _visible(kpos, n_slots, qpos, window):  # pragma: no cover - compiled
    """The slots among the first ``n_slots`` a query at ``qpos`` sees: ``0 <= kpos <= qpos`` and, with a
    window, ``kpos > qpos - window`` (C-contiguous int64)."""
    seen = np.empty(n_slots, np.int64)
    n_seen = 0
    for s in range(n_slots):
        p = kpos[s]
        if 0 <= p <= qpos and (window <= 0 or p > qpos - window):
            seen[n_seen] = s
            n_seen += 1
    return seen[:n_seen]


@njit(cache=True, fastmath=True)
def attend_one(q, keys, vals, kpos, n_slots, qpos, n_heads, head_dim, scale, window, out):  # pragma: no cover
    """Decode attention of one query row over the first ``n_slots`` cache slots, in place.

    ``q`` and ``out`` (n_heads*head_dim,); ``keys``/``vals`` (slots, n_kv_heads*head_dim); ``kpos`` the slots'
    positions (-1: empty). A slot is visible when ``0 <= kpos <= qpos`` and, with a window,
    ``kpos > qpos - window``. Each key and value row is read once for all query heads of its group (GQA)."""
    attend_slots(q, keys, vals, _visible(kpos, n_slots, qpos, window), n_heads, head_dim, scale, out)


@njit(cache=True, fastmath=True)
def attend_serial(q, keys, vals, kpos, qpos, n_heads, head_dim, scale, window, out):  # pragma: no cover
    """:func:`attend_one` on this thread over the slots ``kpos`` (one range): a row of :func:`attend_rows`, and
    a decode shard's heads (shards.py: a parallel loop there would nest in the shards')."""
    mx = np.empty(n_heads, np.float32)
    sm = np.empty(n_heads, np.float32)
    acc = np.empty((n_heads, head_dim), np.float32)
    seen = _visible(kpos, kpos.shape[0], qpos, window)
    _attend_chunk(q, keys, vals, seen, n_heads, head_dim, scale, mx, sm, acc)
    for h in range(n_heads):
        inv = np.float32(1.0) / sm[h]
        for i in range(head_dim):
            out[h * head_dim + i] = acc[h, i] * inv


@njit(parallel=True, cache=True)
def attend_rows(q, keys, vals, kpos, qpos, n_heads, head_dim, scale, window, out):  # pragma: no cover
    """Causal (sliding-window) attention of the query rows ``q`` at positions ``qpos`` over the slots
    ``keys``/``vals``/``kpos`` (prefill and verification steps), a row at a time in the vector kernels of
    decode. Rows are paired first with last, so that each thread gets as many keys as the other; faster than
    2-D BLAS products per KV head (figures: docs/backend-cpu.md#decode-attention)."""
    _check_rows(q, keys, vals, kpos, out)
    t = q.shape[0]
    for i in numba.prange((t + 1) // 2):
        attend_serial(q[i], keys, vals, kpos, qpos[i], n_heads, head_dim, scale, window, out[i])
        r = t - 1 - i
        if r != i:
            attend_serial(q[r], keys, vals, kpos, qpos[r], n_heads, head_dim, scale, window, out[r])


ATT_CHUNKS = 8  # key ranges of one decode attention, reduced in parallel (flash-decoding)
ATT_MIN_KEYS = 16  # keys per range at least (fewer keys: fewer ranges)


@njit(cache=True, fastmath=True)
def _attend_chunk(q, keys, vals, seen, n_heads, head_dim, scale, mx, sm, acc):  # pragma: no cover - compiled
    """Unnormalized attention of one query row over the slots ``seen`` (C-contiguous int64): per query head
    h, ``mx[h]`` the largest score, ``sm[h]`` the sum of exp(score - mx[h]) and ``acc[h]`` the values weighted
    by those exponentials. Both products run in the vector kernels of :mod:`.attend_simd`, over up to
    MAX_HEADS query heads of a KV head at once; dims past the last whole 16 (none for Gemma 3) in loops."""
    n_kv = keys.shape[1] // head_dim
    group = n_heads // n_kv
    n_seen = seen.shape[0]
    stride = keys.strides[0] // 4  # a shard's KV heads are a column range of the cache rows
    vec_dims = head_dim // av.LANES * av.LANES
    probs = np.empty((group, n_seen), np.float32)
    acc[:] = 0.0
    s_at, p_at = seen.ctypes.data, probs.ctypes.data
    for kh in range(n_kv):
        col = kh * head_dim
        k_at, v_at = keys.ctypes.data + col * 4, vals.ctypes.data + col * 4
        for g0 in range(0, group, av.MAX_HEADS):
            heads = min(av.MAX_HEADS, group - g0)
            q_at = q.ctypes.data + (kh * group + g0) * head_dim * 4
            p_g0 = p_at + g0 * n_seen * 4
            av.score_keys(heads, q_at, k_at, v_at, stride, s_at, n_seen, head_dim, np.float32(scale), p_g0)
        for g in range(group if vec_dims < head_dim else 0):
            qrow = q[(kh * group + g) * head_dim : (kh * group + g + 1) * head_dim]
            for j in range(n_seen):
                d = np.float32(0.0)
                for i in range(vec_dims, head_dim):
                    d += qrow[i] * keys[seen[j], col + i]
                probs[g, j] += d * np.float32(scale)
        for g in range(group):
            h = kh * group + g
            m = probs[g, 0]
            for j in range(1, n_seen):
                m = max(m, probs[g, j])
            total = np.float32(0.0)
            for j in range(n_seen):
                e = np.exp(probs[g, j] - m)
                probs[g, j] = e
                total += e
            mx[h], sm[h] = m, total
        for g0 in range(0, group, av.MAX_HEADS):
            heads = min(av.MAX_HEADS, group - g0)
            p_g0 = p_at + g0 * n_seen * 4
            a_at = acc.ctypes.data + (kh * group + g0) * head_dim * 4
            d0 = 0
            while d0 + av.LANES * av.WIDE <= vec_dims:
                av.weigh_values(heads, 1, v_at, stride, s_at, n_seen, p_g0, d0, head_dim, a_at)
                d0 += av.LANES * av.WIDE
            while d0 < vec_dims:
                av.weigh_values(heads, 0, v_at, stride, s_at, n_seen, p_g0, d0, head_dim, a_at)
                d0 += av.LANES
        for g in range(group if vec_dims < head_dim else 0):
            arow = acc[kh * group + g]
            for j in range(n_seen):
                p = probs[g, j]
                for i in range(vec_dims, head_dim):
                    arow[i] += p * vals[seen[j], col + i]


@njit(cache=True)
def _rows_ok(a):  # pragma: no cover - compiled
    return a.itemsize == 4 and a.strides[a.ndim - 1] == 4 and (a.ndim == 1 or a.strides[0] == 4 * a.shape[1])


@njit(cache=True)
def _check_rows(q, keys, vals, seen, out):  # pragma: no cover - compiled
    """The vector kernels read rows by address: float32 rows back to back, int64 slots."""
    if not (_rows_ok(q) and _rows_ok(keys) and _rows_ok(vals) and _rows_ok(out) and seen.itemsize == 8):
        raise ValueError("attention: queries, keys, values and outputs must be C-contiguous float32 rows")
    if keys.shape[1] != vals.shape[1]:
        raise ValueError("attention: keys and values differ in width")


@njit(parallel=True, cache=True, fastmath=True)
def attend_slots(q, keys, vals, seen, n_heads, head_dim, scale, out):  # pragma: no cover - compiled
    """Attention of one query row over the cache slots ``seen`` (the visible ones, chosen by the caller).

    The slots are split in up to ATT_CHUNKS ranges of at least ATT_MIN_KEYS keys, reduced in parallel and
    merged (flash-decoding); the split depends on the number of slots only, so results do not depend on
    the thread count (docs/backend-cpu.md#decode-attention)."""
    _check_rows(q, keys, vals, seen, out)
    n_seen = seen.shape[0]
    n_ch = max(1, min(ATT_CHUNKS, n_seen // ATT_MIN_KEYS))
    per = (n_seen + n_ch - 1) // n_ch
    mx = np.empty((n_ch, n_heads), np.float32)
    sm = np.empty((n_ch, n_heads), np.float32)
    acc = np.empty((n_ch, n_heads, head_dim), np.float32)
    if n_ch == 1:
        _attend_chunk(q, keys, vals, seen, n_heads, head_dim, scale, mx[0], sm[0], acc[0])
    else:
        for c in numba.prange(n_ch):
            s0 = c * per
            _attend_chunk(q, keys, vals, seen[s0 : min(n_seen, s0 + per)], n_heads, head_dim, scale, mx[c], sm[c],
                          acc[c])  # fmt: skip
    for h in range(n_heads):  # plain loops: array expressions here would each become a parallel loop
        m = mx[0, h]
        for c in range(1, n_ch):
            m = max(m, mx[c, h])
        total = np.float32(0.0)
        for i in range(head_dim):
            out[h * head_dim + i] = 0.0
        for c in range(n_ch):
            w = np.exp(mx[c, h] - m)
            total += w * sm[c, h]
            for i in range(head_dim):
                out[h * head_dim + i] += w * acc[c, h, i]
        inv = np.float32(1.0) / total
        for i in range(head_dim):
            out[h * head_dim + i] *= inv
