"""Causal GQA attention of many query rows by BLAS: 2-D products per KV head, the mask as a penalty.

:mod:`.sparse_attention` runs it over each query block's kept keys; dense attention runs the numba kernels
of :mod:`.kernels` (``attend_one`` for a decode row over the cache slots in place, ``attend_rows``).
"""

from __future__ import annotations

import numpy as np


def attend(
    q: np.ndarray, keys: np.ndarray, vals: np.ndarray, qpos: np.ndarray, kpos: np.ndarray, a
) -> np.ndarray:
    """Causal (sliding-window) GQA attention with 2-D BLAS products per KV head; ``kpos`` -1 = empty slot."""
    hd, nkv, window = a["head_dim"], a["n_kv_heads"], a.get("window", 0)
    t, group = q.shape[0], a["n_heads"] // nkv
    seen = (kpos[None, :] >= 0) & (kpos[None, :] <= qpos[:, None])
    if window:
        seen &= kpos[None, :] > qpos[:, None] - window
    penalty = np.where(seen, np.float32(0.0), np.float32(-np.inf))[:, None, :]
    out = np.empty((t, nkv, group, hd), np.float32)
    qh = q.reshape(t, nkv, group, hd)
    for kh in range(nkv):
        cols = slice(kh * hd, (kh + 1) * hd)
        scores = (qh[:, kh].reshape(t * group, hd) @ keys[:, cols].T).reshape(t, group, -1)
        scores = scores * np.float32(a["scale"]) + penalty
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores, out=scores)
        p /= p.sum(axis=-1, keepdims=True)
        out[:, kh] = (p.reshape(t * group, -1) @ vals[:, cols]).reshape(t, group, hd)
    return out.reshape(t, -1)
