"""Gemma 3n's op kinds on the cpu backend (docs/gemma3n.md): AltUp, LAuReL, per-layer embeddings, the
Gaussian top-k, shared-KV attention, and its sparse layers' MLP reading only the units the top-k kept.

The projections inside these kinds (the AltUp projections, one (hidden, hidden) slice at a time) run on
the backend's own matvec / GEMM path; the per-row work around them (routers, stream mixing, norms) are
numba kernels here. ``rmsnorm_topk_ffn`` (the optional fusion of :mod:`workbench.ops.fusion`, applied with
the ``sparse_skip`` tunable) computes, for steps of up to ``gemv_max_rows`` rows, each row's gate in full,
its Gaussian top-k, then only the up rows of the units kept (read in place, :func:`.sparse.up_rows`) and
only their down columns (a transposed float32 copy made at load, :mod:`.sparse_down`); more rows (prefill)
run it densely. Figures: docs/backend-cpu.md#gemma-3n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...models.weights import QTensor
from ...numba_jit import numba
from ...ops.graph import Op
from ..base import Step, UnsupportedOpError
from . import kernels as k
from . import matvec as mv
from . import sparse as sp
from . import sparse_down as sd

if TYPE_CHECKING:
    from . import CpuBackend

njit = numba.njit
Env = dict[str, np.ndarray]
F32 = np.float32
MIN_MAGNITUDE_SQ = F32(1e-5)  # AltUp's floor on a projected stream's mean square (ops/reference_gemma3n.py)
# kinds whose weights are small float32 arrays kept whole (routers, coefficients, scales, a norm)
SMALL_WEIGHT_KINDS = frozenset({"altup_predict", "altup_correct", "ple_project"})
# kinds that apply a stacked (n-1, hidden, hidden) projection one slice at a time
STACKED_KINDS = frozenset({"altup_expand", "altup_unembed"})
TOPK_FFN = "rmsnorm_topk_ffn"


@dataclass
class RowTable:
    """A float table read only by row (the per-layer embedding table stored as F16/BF16/F32): rows
    converted on lookup, never the whole table."""

    name: str
    tensor: QTensor
    fmt: int = -1
    n_units: int = 0

    def gather(self, rows: np.ndarray) -> np.ndarray:
        return self.tensor.dequantize_rows(rows)


def slice_tensor(qt: QTensor, i: int) -> QTensor:
    """Slice ``i`` of a stacked (n, rows, cols) tensor as a (rows, cols) tensor over the same bytes."""
    rows = qt.shape[-2]
    return QTensor(f"{qt.name}[{i}]", qt.type, qt.shape[-2:], lambda: qt.raw[i * rows : (i + 1) * rows])


def slice_names(name: str, n: int) -> tuple[str, ...]:
    """The backend's weight names of the slices of a stacked projection."""
    return tuple(f"{name}[{i}]" for i in range(n))


# -- kernels -----------------------------------------------------------------------------------------------
@njit(cache=True, fastmath=True)
def _router(x, norm_w, router_w, eps, m):  # pragma: no cover - compiled
    """``m = tanh(router_w @ (RMSNorm(x; norm_w) / hidden))`` for one row ``x``."""
    h = x.shape[0]
    inv = k.inv_rms(x, eps)
    for r in range(router_w.shape[0]):
        acc = np.float32(0.0)
        for i in range(h):
            acc += (x[i] * inv * norm_w[i] * np.float32(1.0 / h)) * router_w[r, i]
        m[r] = np.tanh(acc)


@njit(cache=True, fastmath=True)
def altup_predict(x, norm_w, router_w, coef_w, eps, pred, active):  # pragma: no cover - compiled
    """AltUp's prediction of every row: ``p_i = x_i + sum_j A_ij x_j``, ``A = reshape(coef_w @ m, (n, n))``."""
    n = router_w.shape[0]
    h = x.shape[1] // n
    m = np.empty(n, np.float32)
    a = np.empty((n, n), np.float32)
    for t in range(x.shape[0]):
        _router(x[t, :h], norm_w, router_w, eps, m)
        for i in range(n):
            for j in range(n):
                acc = np.float32(0.0)
                for r in range(n):
                    acc += coef_w[i * n + j, r] * m[r]
                a[i, j] = acc
        for i in range(n):
            for c in range(h):
                acc = np.float32(0.0)
                for j in range(n):
                    acc += a[i, j] * x[t, j * h + c]
                pred[t, i * h + c] = acc + x[t, i * h + c]
        for c in range(h):
            active[t, c] = pred[t, c]


@njit(cache=True, fastmath=True)
def altup_correct(p, z, norm_w, router_w, coef_w, scale_w, eps, out, gate_in):  # pragma: no cover
    """AltUp's correction: ``q_i = p_i + c_i (z - p_0)``, ``c = coef_w @ m(z) + 1``; ``gate_in = q_0 * scale_w``."""
    n = router_w.shape[0]
    h = z.shape[1]
    m = np.empty(n, np.float32)
    c = np.empty(n, np.float32)
    for t in range(z.shape[0]):
        _router(z[t], norm_w, router_w, eps, m)
        for i in range(n):
            acc = np.float32(0.0)
            for r in range(n):
                acc += coef_w[i, r] * m[r]
            c[i] = acc + np.float32(1.0)
        for col in range(h):
            d = z[t, col] - p[t, col]
            for i in range(n):
                out[t, i * h + col] = p[t, i * h + col] + c[i] * d
            gate_in[t, col] = out[t, col] * scale_w[col]


@njit(cache=True, fastmath=True)
def laurel_residual(a, att, n, lau, out):  # pragma: no cover - compiled
    """``((a + att) + (n + lau)) / sqrt(2)``."""
    s = np.float32(math.sqrt(2.0))
    for t in range(a.shape[0]):
        for c in range(a.shape[1]):
            out[t, c] = ((a[t, c] + att[t, c]) + (n[t, c] + lau[t, c])) / s


@njit(cache=True)
def gaussian_topk(g, std_multiplier, out):  # pragma: no cover - compiled
    """``relu(g - (mean(g) + k std(g)))`` per row, population std (the sums in float64)."""
    f = g.shape[1]
    for t in range(g.shape[0]):
        s = 0.0
        for i in range(f):
            s += g[t, i]
        mean = s / f
        v = 0.0
        for i in range(f):
            d = g[t, i] - mean
            v += d * d
        cut = np.float32(mean + math.sqrt(v / f) * std_multiplier)
        for i in range(f):
            out[t, i] = max(g[t, i] - cut, np.float32(0.0))


@njit(cache=True, fastmath=True)
def ple_inject(x, r, out):  # pragma: no cover - compiled
    """The streams ``x`` with ``r`` added to every stream but the first."""
    h = r.shape[1]
    for t in range(x.shape[0]):
        for c in range(h):
            out[t, c] = x[t, c]
        for c in range(h, x.shape[1]):
            out[t, c] = x[t, c] + r[t, c % h]


# -- handlers ----------------------------------------------------------------------------------------------
def _out(env: Env, name: str, rows: int, cols: int) -> np.ndarray:
    arr = np.empty((rows, cols), np.float32)
    env[name] = arr
    return arr


def _rmsnorm_plain(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    x = env[op.inputs[0]]
    group = op.attr("group") or x.shape[1]
    k.rmsnorm(x, np.ones(group, np.float32), op.attrs["eps"], group, _out(env, op.outputs[0], *x.shape))


def _shared_kv_attention(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    """Attention over layer ``kv_layer``'s cache, extended by that layer's attention earlier in the step:
    a decode token reads its slots in place, as the owner did; a longer run reads what the owner's append
    returned (the ring may already hold later keys in slots the run's first queries still see)."""
    a = op.attrs
    q, pos = env[op.inputs[0]], env[op.inputs[1]]
    out = _out(env, op.outputs[0], *q.shape)
    for s in step.seqs:
        layer = s.cache.layers[a["kv_layer"]]
        sl = slice(s.start, s.stop)
        if s.stop - s.start == 1:
            p = int(pos[s.start])
            k.attend_one(q[s.start], layer.keys, layer.values, layer.pos, min(layer.capacity, p + 1), p,
                         a["n_heads"], a["head_dim"], a["scale"], a.get("window", 0), out[s.start])  # fmt: skip
        else:
            keys, vals, kpos = layer.visible(pos[sl])
            k.attend_rows(q[sl], keys, vals, kpos, pos[sl].astype(np.int64), a["n_heads"], a["head_dim"],
                          a["scale"], a.get("window", 0), out[sl])  # fmt: skip


def _rescaled(y: np.ndarray, target: np.ndarray) -> np.ndarray:
    own = np.sqrt(np.maximum(np.mean(y * y, axis=-1, keepdims=True, dtype=F32), MIN_MAGNITUDE_SQ))
    return y * target / own


def _altup_expand(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    x = env[op.inputs[0]]
    n = b.model.weights[op.weights[0]].shape[0]
    target = np.sqrt(np.mean(x * x, axis=-1, keepdims=True, dtype=F32))
    ys = b.project(x, slice_names(op.weights[0], n))
    out = _out(env, op.outputs[0], x.shape[0], (n + 1) * x.shape[1])
    h = x.shape[1]
    out[:, :h] = x
    for i, y in enumerate(ys):
        out[:, (i + 1) * h : (i + 2) * h] = _rescaled(y, target)


def _altup_unembed(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    x = env[op.inputs[0]]
    n = b.model.weights[op.weights[0]].shape[0]
    h = x.shape[1] // (n + 1)
    x0 = np.ascontiguousarray(x[:, :h])
    target = np.sqrt(np.mean(x0 * x0, axis=-1, keepdims=True, dtype=F32))
    total = x0.copy()
    for i, name in enumerate(slice_names(op.weights[0], n)):
        xi = np.ascontiguousarray(x[:, (i + 1) * h : (i + 2) * h])
        total += _rescaled(b.project(xi, (name,))[0], target)
    env[op.outputs[0]] = total / F32(n + 1)


def _altup_predict(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    x = env[op.inputs[0]]
    norm_w, router_w, coef_w = (b.small[n] for n in op.weights)
    h = x.shape[1] // router_w.shape[0]
    pred, active = _out(env, op.outputs[0], *x.shape), _out(env, op.outputs[1], x.shape[0], h)
    altup_predict(x, norm_w, router_w, coef_w, op.attrs["eps"], pred, active)


def _altup_correct(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    p, z = env[op.inputs[0]], env[op.inputs[1]]
    norm_w, router_w, coef_w, scale_w = (b.small[n] for n in op.weights)
    out, gate_in = _out(env, op.outputs[0], *p.shape), _out(env, op.outputs[1], *z.shape)
    altup_correct(p, z, norm_w, router_w, coef_w, scale_w, op.attrs["eps"], out, gate_in)


def _laurel_residual(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    a, att, n, lau = (env[t] for t in op.inputs)
    laurel_residual(a, att, n, lau, _out(env, op.outputs[0], *a.shape))


def _gaussian_topk(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    g = env[op.inputs[0]]
    gaussian_topk(g, op.attrs["std_multiplier"], _out(env, op.outputs[0], *g.shape))


def _ple_project(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    a = op.attrs
    proj, rows = env[op.inputs[0]], env[op.inputs[1]]
    out = _out(env, op.outputs[0], *proj.shape)
    k.rmsnorm(proj * F32(a["scale"]), b.small[op.weights[0]].reshape(-1), a["eps"], a["group"], out)
    out += rows
    out *= F32(1.0 / math.sqrt(2.0))


def _ple_gate(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    g, inputs = env[op.inputs[0]], env[op.inputs[1]]
    w = g.shape[1]
    mine = np.ascontiguousarray(inputs[:, op.layer * w : (op.layer + 1) * w])
    k.gelu_mul(g, mine, _out(env, op.outputs[0], *g.shape))


def _ple_inject(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    x, r = env[op.inputs[0]], env[op.inputs[1]]
    ple_inject(x, r, _out(env, op.outputs[0], *x.shape))


# -- the sparse layers' MLP --------------------------------------------------------------------------------
def down_store(b: CpuBackend, name: str) -> np.ndarray:
    """The weight-table row of the transposed float32 copy of ``ffn_down`` (made once, kept by the backend):
    row ``j`` holds the hidden values unit ``j`` contributes, so a token reads only its kept units' rows."""
    stores = b.topk_down
    if name not in stores:
        t = b.model.weights[name]
        store = sd.column_store(t.dequantize().reshape(t.rows, t.cols), "fp32")
        stores[name] = (store, np.array(sd.table_row(store, "fp32", t.rows), np.int64))
    return stores[name][1]


def _up_kept(b: CpuBackend, name: str, x: np.ndarray, idx: np.ndarray, parts: int) -> np.ndarray:
    """Rows ``idx`` of ``ffn_up`` times the one row ``x``, reading only those rows: GGUF blocks in place
    (activation quantized as the dense matvec quantizes it), float rows gathered."""
    w = b.weights[name]
    if w.fmt < 0:
        return w.data[idx] @ x[0]
    if w.fmt not in mv.QUANT_FMTS or w.fmt in mv.INTERLEAVED:
        raise UnsupportedOpError(
            f"cpu backend: {TOPK_FFN} cannot read single rows of {name!r} (format {w.fmt})"
        )
    u = np.empty((1, len(idx)), np.float32)
    xs = np.empty((1, x.shape[1] // 32), np.float32)
    xq, xd = np.empty((1, x.shape[1]), np.int16), np.empty_like(xs)
    if b.levels:
        mv.quantize_rows_i16(x, b.levels, xq, xd, xs)
    else:
        mv.block_sums(x, xs)
    wrow = np.array([w.fmt, w.data.ctypes.data, w.data.shape[1], w.rows, w.n_units], np.int64)
    sp.up_rows(wrow, idx, b.levels, x, xq, xd, xs, u, parts)
    return u[0]


def _topk_ffn(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    """A sparse layer's MLP, norm to residual add: few rows skip the units the top-k zeroed, row by row."""
    norm, gate, topk, up, _act, down, post, _res = op.attrs["parts"]
    y = env[op.inputs[0]]
    h = np.empty_like(y)
    k.rmsnorm(y, b.norms[norm.weights[0]], norm.attrs["eps"], y.shape[1], h)
    if y.shape[0] > b.gemv_max_rows:  # prefill: every token keeps other units; dense
        g, u = b.project(h, (gate.weights[0], up.weights[0]))
        gs = np.empty_like(g)
        gaussian_topk(g, topk.attrs["std_multiplier"], gs)
        f = np.empty_like(g)
        k.gelu_mul(gs, u, f)
        d = b.project(f, down.weights)[0]
    else:
        g = b.project(h, (gate.weights[0],))[0]
        gs = np.empty_like(g)
        gaussian_topk(g, topk.attrs["std_multiplier"], gs)
        wrow = down_store(b, down.weights[0])
        d = np.zeros((y.shape[0], int(wrow[4])), np.float32)
        parts = b.threads_used()
        for t in range(y.shape[0]):
            idx = np.flatnonzero(gs[t] > 0)
            b.topk_units[0] += len(idx)
            b.topk_units[1] += gs.shape[1]
            if not len(idx):
                continue
            u = _up_kept(b, up.weights[0], h[t : t + 1], idx, parts)
            f = np.empty((1, len(idx)), np.float32)
            k.gelu_mul(np.ascontiguousarray(gs[t, idx])[None], u[None].astype(np.float32), f)
            sd.down_kept(wrow, idx, f[0], d[t], parts)
    k.rmsnorm_add(d, b.norms[post.weights[0]], post.attrs["eps"], y, _out(env, op.outputs[0], *y.shape))


HANDLERS = {
    "rmsnorm_plain": _rmsnorm_plain,
    "shared_kv_attention": _shared_kv_attention,
    "altup_expand": _altup_expand,
    "altup_unembed": _altup_unembed,
    "altup_predict": _altup_predict,
    "altup_correct": _altup_correct,
    "laurel_residual": _laurel_residual,
    "gaussian_topk": _gaussian_topk,
    "ple_project": _ple_project,
    "ple_gate": _ple_gate,
    "ple_inject": _ple_inject,
    TOPK_FFN: _topk_ffn,
}
