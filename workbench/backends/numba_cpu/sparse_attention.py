"""``block_sparse_attention`` on the cpu backend: only the kept key blocks are read.

Decode: :func:`block_slots` walks the kept blocks (sinks, strided, local; :mod:`workbench.sparsity.attention`)
and maps their positions to cache slots (position, or position mod ring on sliding layers, checked
against the slot's stored position), so masked blocks are never touched; the attention over those slots is
the dense kernel's (:func:`.kernels.attend_slots`). Steps of many tokens (prefill) group queries by block:
all queries of a block see the same key blocks, so each group multiplies only its kept keys (BLAS).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...numba_jit import numba
from ...ops.graph import Op
from ...sparsity.attention import KIND, block_kept
from ..base import Step
from . import kernels as k
from .attend_blas import attend

if TYPE_CHECKING:
    from . import CpuBackend

njit = numba.njit


@njit(cache=True)
def block_slots(kpos, n_slots, ring, qpos, window, blocks):  # pragma: no cover - compiled
    """The cache slots (by increasing position) a query at ``qpos`` sees: kept blocks, causal, in the window;
    ``blocks`` = (block, sink, local, stride)."""
    size, sink, local, stride = blocks[0], blocks[1], blocks[2], blocks[3]
    qb = qpos // size
    lo = max(0, qpos - window + 1) if window > 0 else 0
    seen = np.empty(min(n_slots, qpos + 1), np.int64)
    n = 0
    for kb in range(lo // size, qb + 1):
        if kb < sink or kb > qb - local or (stride > 0 and kb % stride == 0):
            for p in range(max(kb * size, lo), min(kb * size + size, qpos + 1)):
                s = p % ring if ring > 0 else p
                if s < n_slots and kpos[s] == p:
                    seen[n] = s
                    n += 1
    return seen[:n]


@njit(cache=True)
def attend_blocks_one(
    q, keys, vals, kpos, n_slots, ring, qpos, n_heads, head_dim, scale, window, blocks, out
):  # pragma: no cover
    """:func:`.kernels.attend_one` over the kept blocks only."""
    seen = block_slots(kpos, n_slots, ring, qpos, window, blocks)
    k.attend_slots(q, keys, vals, seen, n_heads, head_dim, scale, out)


def attend_blocks(
    q: np.ndarray, keys: np.ndarray, vals: np.ndarray, qpos: np.ndarray, kpos: np.ndarray, a
) -> np.ndarray:
    """Many queries: per query block, the dense BLAS attention over that block's kept keys only."""
    size = a["blocks"][0]
    window = a.get("window", 0)
    out = np.empty_like(q)
    qb = qpos // size
    for u in np.unique(qb):
        rows = np.flatnonzero(qb == u)
        keep = (kpos >= 0) & block_kept(kpos // size, u, a["blocks"]) & (kpos <= qpos[rows].max())
        if window:
            keep &= kpos > qpos[rows].min() - window
        sel = np.flatnonzero(keep)
        out[rows] = attend(q[rows], keys[sel], vals[sel], qpos[rows], kpos[sel], a)
    return out


def _block_attention(b: CpuBackend, op: Op, env: dict, step: Step) -> None:
    a = op.attrs
    q, key, v, pos = (env[n] for n in op.inputs)
    out = np.empty_like(q)
    blocks = np.array(a["blocks"], np.int64)
    for s in step.seqs:
        layer = s.cache.layers[op.layer]
        sl = slice(s.start, s.stop)
        if s.stop - s.start == 1:
            layer.write(pos[sl], key[sl], v[sl])
            p = int(pos[s.start])
            attend_blocks_one(q[s.start], layer.keys, layer.values, layer.pos, min(layer.capacity, p + 1),
                              layer.ring, p, a["n_heads"], a["head_dim"], a["scale"], a.get("window", 0), blocks,
                              out[s.start])  # fmt: skip
        else:
            keys, vals, kpos = layer.append(pos[sl], key[sl], v[sl])
            out[sl] = attend_blocks(q[sl], keys, vals, pos[sl], kpos, a)
    env[op.outputs[0]] = out


HANDLERS = {KIND: _block_attention}
