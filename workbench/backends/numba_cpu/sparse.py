"""``sparse_ffn`` on the cpu backend: decode reads only the kept rows of ffn_up and columns of ffn_down.

Per decode token: the gate projection in full (every activation must be ranked), the kept set of
:func:`workbench.sparsity.ffn.ffn_mask` (:func:`select_kept`, the same rule compiled), then only the kept
rows of ``ffn_up`` and the kept *columns* of ``ffn_down``. Up rows in GGUF blocks are read in place by the
backend's own row kernels (:func:`up_rows_i16` / :func:`up_rows_f32`, same activation quantization as the
dense matvec); planar up rows are gathered and multiplied by the planar kernels. Down columns come from a
transposed float32 copy made once per layer (exact: the dequantized values; 5 MiB per 640x2048 layer),
because a column of a row-major quantized matrix is spread over every row's blocks. Steps of many rows
(prefill) compute the masked FFN densely (the masks differ per token).
"""

from __future__ import annotations

from statistics import NormalDist
from typing import TYPE_CHECKING

import numpy as np

from ..._numba import numba
from ...ops import reference as ref
from ...ops.graph import Op
from ...quant.planar import PlanarTensor, fake_quant_rows_int8
from ...sparsity.ffn import ffn_mask, kept_count
from ..base import Step
from . import matvec as mv
from .matvec import _rows_f32, _rows_i16
from .qformats import PlanarWeight

if TYPE_CHECKING:
    from . import CpuBackend, CpuWeight

njit, prange = numba.njit, numba.prange
GELU_C = np.float32(np.sqrt(2.0 / np.pi))
GGUF_FMTS = frozenset(int(t) for t in mv.QUANT_TYPES)  # CpuWeight.fmt of GGUF block formats


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


@njit(cache=True)
def select_kept(g, a, stat, z, k):  # pragma: no cover - compiled
    """Indices (increasing) a token keeps: ``stat``: g > mean + z * std; else the k largest |a|."""
    n = g.shape[0]
    if stat:
        g64 = g.astype(np.float64)
        mean = g64.mean()
        cutoff = mean + np.sqrt(((g64 - mean) ** 2).mean()) * z
        return np.flatnonzero(g64 > cutoff)
    absa = np.abs(a)
    thr = np.partition(absa, n - k)[n - k]
    idx = np.empty(k, np.int64)
    m = 0
    for i in range(n):
        if absa[i] > thr:
            idx[m] = i
            m += 1
    for i in range(n):  # ties at the threshold: the first ones, up to k
        if m < k and absa[i] == thr:
            idx[m] = i
            m += 1
    return np.sort(idx[:m])


@njit(parallel=True, cache=True)
def up_rows_i16(fmt, w, n_units, idx, xq, xd, xs, out):  # pragma: no cover - compiled
    """out[0, j] = dot(row idx[j] of w, x) on GGUF blocks, x int16/int8-quantized per 32-block."""
    for j in prange(idx.shape[0]):
        _rows_i16(fmt, w, n_units, idx[j], idx[j] + 1, xq, xd, xs, out, j)


@njit(parallel=True, cache=True)
def up_rows_f32(fmt, w, n_units, idx, x, xs, out):  # pragma: no cover - compiled
    """:func:`up_rows_i16` with exact float32 activations."""
    for j in prange(idx.shape[0]):
        _rows_f32(fmt, w, n_units, idx[j], idx[j] + 1, x, xs, out, j)


def _up_kept(b: CpuBackend, w, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The kept rows of ``ffn_up`` times ``x`` (1, hidden), reading only those rows."""
    if isinstance(w, PlanarWeight) or w.fmt < 0:
        return b.project_weights(x, [_rows_of(w, idx)])[0][0]
    from . import ACT_QUANT

    out = np.empty((1, len(idx)), np.float32)
    levels = ACT_QUANT[b.act_quant]
    xs = np.empty((1, x.shape[1] // 32), np.float32)
    if levels:
        xq, xd = np.empty(x.shape, np.int16), np.empty_like(xs)
        mv.quantize_rows_i16(x, levels, xq, xd, xs)
        up_rows_i16(w.fmt, w.data, w.n_units, idx, xq, xd, xs, out)
    else:
        mv.block_sums(x, xs)
        up_rows_f32(w.fmt, w.data, w.n_units, idx, x, xs, out)
    return out[0]


def _rows_of(w: CpuWeight | PlanarWeight, idx: np.ndarray):
    """The weight restricted to rows ``idx`` (a gathered copy, multiplied by the same kernels)."""
    if isinstance(w, PlanarWeight):
        t = w.tensor
        sub = PlanarTensor(
            t.name + "[kept]", t.type, (len(idx), t.cols), {k: v[idx] for k, v in t.planes.items()}
        )
        return PlanarWeight(sub)
    from . import CpuWeight

    return CpuWeight(w.name + "[kept]", w.type, w.fmt, w.data[idx], w.n_units)


def _down_t(b: CpuBackend, name: str) -> np.ndarray:
    cache = b.__dict__.setdefault("sparse_down_t", {})
    wt = cache.get(name)
    if wt is None:
        wt = cache[name] = np.ascontiguousarray(b.model.weights[name].dequantize().T, dtype=np.float32)
    return wt


@njit(parallel=True, cache=True)
def sparse_ffn_token(
    fg, wg, ug, fu, wu, uu, xq, xd, xs, x, levels, stat, z, k, wt, gbuf, out
):  # pragma: no cover
    """One decode token's sparse FFN on GGUF-block gate/up weights, in one call: the gate in full (tasks of
    16 rows), GELU, the kept set, the kept up rows, and ``out[c] = sum_j f_j * wt[idx_j, c]``."""
    n = wg.shape[0]
    for i in prange((n + 15) // 16):
        r0 = i * 16
        if levels:
            _rows_i16(fg, wg, ug, r0, min(n, r0 + 16), xq, xd, xs, gbuf, r0)
        else:
            _rows_f32(fg, wg, ug, r0, min(n, r0 + 16), x, xs, gbuf, r0)
    g = gbuf[0]
    a = np.empty(n, np.float32)
    for i in range(n):
        v = g[i]
        a[i] = (
            np.float32(0.5)
            * v
            * (np.float32(1.0) + np.tanh(GELU_C * (v + np.float32(0.044715) * (v * v * v))))
        )
    idx = select_kept(g, a, stat, z, k)
    m = idx.shape[0]
    u = np.empty((1, m), np.float32)
    for j in prange(m):
        if levels:
            _rows_i16(fu, wu, uu, idx[j], idx[j] + 1, xq, xd, xs, u, j)
        else:
            _rows_f32(fu, wu, uu, idx[j], idx[j] + 1, x, xs, u, j)
    f = np.empty(m, np.float32)
    for j in range(m):
        f[j] = a[idx[j]] * u[0, j]
    n_out = wt.shape[1]
    parts = numba.get_num_threads()  # one column range per thread: each kept row is read in long runs
    width = ((n_out + parts - 1) // parts + 15) // 16 * 16
    for i in prange((n_out + width - 1) // width):
        c0, c1 = i * width, min(n_out, (i + 1) * width)
        acc = np.zeros(c1 - c0, np.float32)
        for j in range(m):
            row = wt[idx[j], c0:c1]
            fj = f[j]
            for c in range(c1 - c0):
                acc[c] += fj * row[c]
        out[c0:c1] = acc


def _fused_token(
    b: CpuBackend, gw, uw, x: np.ndarray, stat: bool, z: float, k: int, wt: np.ndarray, out
) -> None:
    from . import ACT_QUANT

    levels = ACT_QUANT[b.act_quant]
    xs = np.empty((1, x.shape[1] // 32), np.float32)
    xq, xd = np.empty(x.shape, np.int16), np.empty_like(xs)
    if levels:
        mv.quantize_rows_i16(x, levels, xq, xd, xs)
    else:
        mv.block_sums(x, xs)
    gbuf = np.empty((1, gw.rows), np.float32)
    sparse_ffn_token(gw.fmt, gw.data, gw.n_units, uw.fmt, uw.data, uw.n_units, xq, xd, xs, x, levels, stat, z, k,
                     wt, gbuf, out)  # fmt: skip


def _sparse_ffn(b: CpuBackend, op: Op, env: dict, step: Step) -> None:
    h = env[op.inputs[0]]
    gname, uname, dname = op.weights
    method, target = op.attrs["method"], op.attrs["target"]
    gw, uw = b.weights[gname], b.weights[uname]
    down_fmt = getattr(b.weights[dname], "format", None)
    act8_down = down_fmt is not None and down_fmt.act8
    if h.shape[0] > b.gemv_max_rows:
        g = b.project(h, (gname,))[0]
        a = ref.gelu_tanh(g)
        f = np.where(ffn_mask(g, a, method, target), a * b.project(h, (uname,))[0], np.float32(0.0))
        env[op.outputs[0]] = b.project(f.astype(np.float32), (dname,))[0]
        return
    out = np.empty((h.shape[0], b.weights[dname].rows), np.float32)
    wt = _down_t(b, dname)
    stat = method == "stat"
    z = NormalDist().inv_cdf(target) if stat else 0.0
    k = kept_count(gw.rows, target)
    if gw.fmt in GGUF_FMTS and uw.fmt in GGUF_FMTS and not act8_down:
        for t in range(h.shape[0]):
            _fused_token(b, gw, uw, h[t : t + 1], stat, z, k, wt, out[t])
        env[op.outputs[0]] = out
        return
    g = b.project(h, (gname,))[0]
    a = ref.gelu_tanh(g)
    for t in range(h.shape[0]):
        idx = select_kept(g[t], a[t], stat, z, k)
        f = (a[t, idx] * _up_kept(b, uw, h[t : t + 1], idx)).astype(np.float32)
        if act8_down:
            f = fake_quant_rows_int8(f[None, :])[0]
        sum_columns(f, idx, wt, out[t])
    env[op.outputs[0]] = out


HANDLERS = {"sparse_ffn": _sparse_ffn}
