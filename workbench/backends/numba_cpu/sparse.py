"""``sparse_ffn`` on the cpu backend: decode reads only the kept rows of ffn_up and columns of ffn_down.

Per decode token: the gate projection in full (every activation must be ranked), the kept set of
:func:`workbench.sparsity.ffn.ffn_mask` (:func:`select_kept`, the same rule compiled), then only the kept
rows of ``ffn_up`` and the kept *columns* of ``ffn_down``. Up rows in GGUF blocks are read in place by the
backend's own row kernels (same activation quantization as the dense matvec, the next rows prefetched);
planar up rows are gathered and multiplied by the planar kernels. Down columns are rows of a transposed
copy made once per layer in the op's ``down`` format (:mod:`.sparse_down`). One-token steps of GGUF
models run this inside the compiled step program (:func:`kept_ffn` is its instruction); other steps call
it op by op. Steps of many rows (prefill) compute the masked FFN densely (the masks differ per token).
"""

from __future__ import annotations

from statistics import NormalDist
from typing import TYPE_CHECKING

import numpy as np

from ...numba_jit import numba
from ...ops import reference as ref
from ...ops.graph import Op
from ...quant.planar import PlanarTensor, fake_quant_rows_int8
from ...sparsity.ffn import down_values, ffn_mask, kept_count
from ..base import Step
from . import kernels as k
from . import matvec as mv
from . import sparse_down as sd
from .addr import prefetch
from .qformats import PlanarWeight
from .sparse_attention import HANDLERS as ATTENTION_HANDLERS
from .weights import CpuWeight

if TYPE_CHECKING:
    from . import CpuBackend

njit, prange = numba.njit, numba.prange
GELU_C = np.float32(np.sqrt(2.0 / np.pi))
HIST_SHIFT = 19  # top-k histogram bins: the top 12 bits of a non-negative float (exponent + 3 mantissa bits)


@njit(cache=True)
def top_k(a, k):  # pragma: no cover - compiled
    """Indices (increasing) of the ``k`` largest ``|a|`` (``a`` contiguous float32), ties at the threshold:
    the first ones. A radix step finds the histogram bin of the k-th largest (non-negative floats order as
    their bits), then only that bin's values are partitioned."""
    n = a.shape[0]
    bits = a.view(np.int32)
    hist = np.zeros(1 << (31 - HIST_SHIFT), np.int32)
    for i in range(n):
        hist[(bits[i] & 0x7FFFFFFF) >> HIST_SHIFT] += 1
    b, above = hist.shape[0] - 1, 0
    while above + hist[b] < k:
        above += hist[b]
        b -= 1
    cand = np.empty(hist[b], np.int32)
    c = 0
    for i in range(n):
        v = bits[i] & 0x7FFFFFFF
        if v >> HIST_SHIFT == b:
            cand[c] = v
            c += 1
    thr = np.partition(cand, c - (k - above))[c - (k - above)]  # the (k - above)-th largest of the bin
    ties = k - above
    for j in range(c):
        if cand[j] > thr:
            ties -= 1
    idx = np.empty(k, np.int64)
    m = 0
    for i in range(n):
        v = bits[i] & 0x7FFFFFFF
        if v > thr or (v == thr and ties > 0):
            if v == thr:
                ties -= 1
            idx[m] = i
            m += 1
    return idx


@njit(cache=True)
def select_kept(g, a, stat, z, k):  # pragma: no cover - compiled
    """Indices (increasing) a token keeps: ``stat``: g > mean + z * std; else the k largest |a|."""
    if stat:
        g64 = g.astype(np.float64)
        mean = g64.mean()
        cutoff = mean + np.sqrt(((g64 - mean) ** 2).mean()) * z
        return np.flatnonzero(g64 > cutoff)
    return top_k(a, k)


@njit(cache=True, fastmath=True, error_model="numpy")
def gelu(g, out):  # pragma: no cover - compiled
    """gelu_tanh of each value (the tanh of :func:`.kernels.gelu_mul`; numpy's error model lets the division
    vectorize)."""
    for i in range(g.shape[0]):
        v = g[i]
        out[i] = (
            np.float32(0.5)
            * v
            * (np.float32(1.0) + k.tanh_approx(GELU_C * (v + np.float32(0.044715) * v * v * v)))
        )


@njit(parallel=True, cache=True)
def up_rows(wrow, idx, levels, x, xq, xd, xs, out, parts):  # pragma: no cover - compiled
    """``out[0, j] = dot(row idx[j], x)`` of the GGUF weight of table row ``wrow``, reading only those rows
    (``parts`` runs of them, one per thread; the row after next prefetched); x quantized as the dense
    matvec does."""
    wa, rb = wrow[mv.W_ADDR], wrow[mv.W_ROW_BYTES]
    m = idx.shape[0]
    per = (m + parts - 1) // parts
    for p in prange(parts):
        for j in range(p * per, min(m, (p + 1) * per)):
            if j + 2 < m:
                for off in range(0, rb, 64):
                    prefetch(wa + idx[j + 2] * rb + off)
            mv.rows_at(wrow, idx[j], idx[j] + 1, x, levels, xq, xd, xs, out, j)


@njit(cache=True)
def kept_ffn(wt, g, k, z, levels, x, xq, xd, xs, out, parts):  # pragma: no cover - compiled
    """The rest of one token's sparse FFN after its gate projection ``g``: GELU, the kept set (top-k when
    ``k`` > 0, else statistical with ``z``), the kept up rows (table row 1, GGUF blocks; ``xq``/``xd``/``xs``
    hold x quantized for the gate) and ``out = sum_j f_j * down column idx_j`` (table row 2, a column store);
    ``parts``: the threads to split the rows and columns over."""
    a = np.empty(g.shape[0], np.float32)
    gelu(g, a)
    idx = select_kept(g, a, k == 0, z, k)
    u = np.empty((1, idx.shape[0]), np.float32)
    up_rows(wt[1], idx, levels, x, xq, xd, xs, u, parts)
    f = np.empty(idx.shape[0], np.float32)
    for j in range(idx.shape[0]):
        f[j] = a[idx[j]] * u[0, j]
    sd.down_kept(wt[2], idx, f, out, parts)


def kept_rule(op: Op, ffn: int) -> tuple[int, float]:
    """``(k, z)`` of :func:`kept_ffn`: top-k keeps k; statistical top-k is k = 0 with cutoff factor z."""
    target = op.attrs["target"]
    if op.attrs["method"] == "stat":
        return 0, NormalDist().inv_cdf(target)
    return kept_count(ffn, target), 0.0


def down_row(b: CpuBackend, op: Op) -> np.ndarray:
    """The weight-table row of the op's transposed down store (made once per weight and format, kept by the
    backend for as long as programs may read it)."""
    name, fmt = op.weights[2], op.attrs.get("down", "fp32")
    stores = b.__dict__.setdefault("sparse_down", {})
    store = stores.get((name, fmt))
    if store is None:
        t = b.model.weights[name]
        store = stores[(name, fmt)] = sd.column_store(t.dequantize().reshape(t.rows, t.cols), fmt)
    return np.array(sd.table_row(store, fmt, b.model.weights[name].rows), np.int64)


def _down_dense(b: CpuBackend, op: Op, f: np.ndarray, act8: bool) -> np.ndarray:
    """``f @ down.T`` for many rows, with the values the op's down format stores (fp32: the weight itself)."""
    name, fmt = op.weights[2], op.attrs.get("down", "fp32")
    if fmt == "fp32":
        return b.project(f, (name,))[0]
    cache = b.__dict__.setdefault("sparse_down_values", {})
    if (name, fmt) not in cache:
        t = b.model.weights[name]
        cache[(name, fmt)] = down_values(t.dequantize().reshape(t.rows, t.cols), fmt)
    return (fake_quant_rows_int8(f) if act8 else f) @ cache[(name, fmt)].T


def _weight_row(w: CpuWeight) -> tuple[int, int, int, int, int]:
    return w.fmt, w.data.ctypes.data, w.data.shape[1], w.rows, w.n_units


def _up_gathered(b: CpuBackend, w, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The kept rows of a planar or float ``ffn_up`` times ``x`` (1, hidden): those rows gathered, then
    multiplied by the backend's kernels for the format."""
    if isinstance(w, PlanarWeight):
        t = w.tensor
        sub = PlanarTensor(
            t.name + "[kept]", t.type, (len(idx), t.cols), {n: v[idx] for n, v in t.planes.items()}
        )
        return b.project_weights(x, [PlanarWeight(sub)])[0][0]
    return b.project_weights(x, [CpuWeight(w.name + "[kept]", w.type, w.fmt, w.data[idx], w.n_units)])[0][0]


def _sparse_ffn(b: CpuBackend, op: Op, env: dict, step: Step) -> None:
    h = env[op.inputs[0]]
    gname, uname, dname = op.weights
    gw, uw = b.weights[gname], b.weights[uname]
    down_fmt = getattr(b.weights[dname], "format", None)
    act8_down = down_fmt is not None and down_fmt.act8
    if h.shape[0] > b.gemv_max_rows:
        g = b.project(h, (gname,))[0]
        a = ref.gelu_tanh(g)
        mask = ffn_mask(g, a, op.attrs["method"], op.attrs["target"])
        f = np.where(mask, a * b.project(h, (uname,))[0], np.float32(0.0)).astype(np.float32)
        env[op.outputs[0]] = _down_dense(b, op, f, act8_down)
        return
    out = np.empty((h.shape[0], b.weights[dname].rows), np.float32)
    wt = np.zeros((3, 5), np.int64)
    wt[2] = down_row(b, op)
    k_, z = kept_rule(op, gw.rows)
    g = b.project(h, (gname,))[0]
    if gw.fmt in mv.QUANT_FMTS and uw.fmt in mv.QUANT_FMTS and not act8_down:
        wt[1] = _weight_row(uw)
        xs = np.empty((1, h.shape[1] // 32), np.float32)
        xq, xd = np.empty((1, h.shape[1]), np.int16), np.empty_like(xs)
        for t in range(h.shape[0]):
            x = h[t : t + 1]
            if b.levels:
                mv.quantize_rows_i16(x, b.levels, xq, xd, xs)
            else:
                mv.block_sums(x, xs)
            kept_ffn(wt, g[t], k_, z, b.levels, x, xq, xd, xs, out[t], b.threads_used())
        env[op.outputs[0]] = out
        return
    a = ref.gelu_tanh(g)
    for t in range(h.shape[0]):
        idx = select_kept(g[t], a[t], k_ == 0, z, k_)
        f = (a[t, idx] * _up_gathered(b, uw, h[t : t + 1], idx)).astype(np.float32)
        if act8_down:
            f = fake_quant_rows_int8(f[None, :])[0]
        sd.down_kept(wt[2], idx, f, out[t], b.threads_used())
    env[op.outputs[0]] = out


HANDLERS = {"sparse_ffn": _sparse_ffn, **ATTENTION_HANDLERS}
