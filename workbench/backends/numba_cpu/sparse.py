"""``sparse_ffn`` on the cpu backend: decode reads only the kept rows of ffn_up and columns of ffn_down.

Per decode token: the gate projection in full (every activation must be ranked), the mask of
:func:`workbench.sparsity.ffn.ffn_mask`, then the kept rows of ``ffn_up`` (gathered, multiplied by the
backend's own kernels for their format), and the down projection as a sum of the kept *columns* of
``ffn_down``. Those come from a transposed float32 copy made once per layer (exact: the dequantized
values), because a column of a row-major quantized matrix is spread over every row's blocks. Steps of
many rows (prefill) compute the masked FFN densely (the masks differ per token).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..._numba import numba
from ...ops import reference as ref
from ...ops.graph import Op
from ...quant.planar import PlanarTensor, fake_quant_rows_int8
from ...sparsity.ffn import ffn_mask
from ..base import Step
from .qformats import PlanarWeight

if TYPE_CHECKING:
    from . import CpuBackend, CpuWeight

njit, prange = numba.njit, numba.prange


@njit(parallel=True, cache=True, fastmath=True)
def sum_columns(f, idx, wt, out):  # pragma: no cover - compiled
    """out[c] = sum_j f[j] * wt[idx[j], c]: a matvec reading only rows ``idx`` of the transposed weight."""
    n_out = wt.shape[1]
    chunk = 64
    for i in prange((n_out + chunk - 1) // chunk):
        c0, c1 = i * chunk, min(n_out, (i + 1) * chunk)
        acc = np.zeros(c1 - c0, np.float32)
        for j in range(idx.shape[0]):
            row = wt[idx[j]]
            fj = f[j]
            for c in range(c0, c1):
                acc[c - c0] += fj * row[c]
        out[c0:c1] = acc


def _rows_of(w: CpuWeight | PlanarWeight, idx: np.ndarray):
    """The weight restricted to rows ``idx`` (a gathered copy, multiplied by the same kernels)."""
    if isinstance(w, PlanarWeight):
        t = w.tensor
        sub = PlanarTensor(t.name + "[kept]", t.type, (len(idx), t.cols), {k: v[idx] for k, v in t.planes.items()})
        return PlanarWeight(sub)
    from . import CpuWeight

    return CpuWeight(w.name + "[kept]", w.type, w.fmt, w.data[idx], w.n_units)


def _down_t(b: CpuBackend, name: str) -> np.ndarray:
    cache = b.__dict__.setdefault("sparse_down_t", {})
    wt = cache.get(name)
    if wt is None:
        wt = cache[name] = np.ascontiguousarray(b.model.weights[name].dequantize().T, dtype=np.float32)
    return wt


def _sparse_ffn(b: CpuBackend, op: Op, env: dict, step: Step) -> None:
    h = env[op.inputs[0]]
    gname, uname, dname = op.weights
    method, target = op.attrs["method"], op.attrs["target"]
    g = b.project(h, (gname,))[0]
    a = ref.gelu_tanh(g)
    mask = ffn_mask(g, a, method, target)
    down_fmt = getattr(b.weights[dname], "format", None)
    if h.shape[0] > b.gemv_max_rows:
        u = b.project(h, (uname,))[0]
        f = np.where(mask, a * u, np.float32(0.0)).astype(np.float32)
        env[op.outputs[0]] = b.project(f, (dname,))[0]
        return
    out = np.empty((h.shape[0], b.weights[dname].rows), np.float32)
    wt = _down_t(b, dname)
    for t in range(h.shape[0]):
        idx = np.flatnonzero(mask[t])
        u = b.project_weights(h[t : t + 1], [_rows_of(b.weights[uname], idx)])[0][0]
        f = (a[t, idx] * u).astype(np.float32)
        if down_fmt is not None and down_fmt.act8:
            f = fake_quant_rows_int8(f[None, :])[0]
        sum_columns(f, idx, wt, out[t])
    env[op.outputs[0]] = out


HANDLERS = {"sparse_ffn": _sparse_ffn}
