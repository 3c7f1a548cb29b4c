"""Batched projections: a few activation rows (a batch's decode step, a speculative verification) against
whole weights, each weight row decoded once per 8 activation rows (:mod:`.dot_f32_rows8` with exact float
activations, :mod:`.dot_int16_rows8` with int16 ones; interleaved layouts by their 16-row path). Each row's
arithmetic is the same whatever the number of rows, so a row's result does not depend on the batch.
Figures: docs/backend-cpu.md#batched-kernels."""

from __future__ import annotations

from ...numba_jit import numba
from .dispatch import dot_row_f32_rows8, dot_row_i16_rows8
from .dot_f32_rows8 import ROWS, pad_rows
from .interleaved import rows_i16 as r16_rows_i16
from .matvec import rows_f32_by_dequant, task_count, task_size
from .simd import R16_FMTS

njit, prange = numba.njit, numba.prange
__all__ = ["ROWS", "matmul_rows3", "pad_rows"]


@njit(cache=True)
def _rows(fmt, w, n_units, r0, r1, x, levels, xq, xd, xs, out):  # pragma: no cover - compiled
    """out[:, n] = activation rows . row n of w for weight rows r0..r1, a multiple of ROWS activation rows:
    int16 codes ``xq``/``xd``/``xs`` where ``levels`` > 0, else the exact floats ``x``."""
    wa, rb, os = w.ctypes.data, w.shape[1], out.strides[0]
    if fmt in R16_FMTS:  # 16 weight rows at a time for int16 activations; float ones dequantize each row
        if levels > 0:
            r16_rows_i16(fmt, wa, rb, n_units, r0, r1, xq, xd, xs, out, r0)
        else:
            rows_f32_by_dequant(fmt, wa, rb, n_units, r0, r1, x, out, r0)
    elif levels > 0:
        qs, ds = xq.strides[0], xd.strides[0]
        for t0 in range(0, xq.shape[0], ROWS):
            q, d, s = xq.ctypes.data + t0 * qs, xd.ctypes.data + t0 * ds, xs.ctypes.data + t0 * ds
            oa = out.ctypes.data + t0 * os
            for n in range(r0, r1):
                dot_row_i16_rows8(fmt, wa + n * rb, q, qs, d, s, ds, n_units, oa + n * 4, os)
    else:
        xr = x.strides[0]
        for t0 in range(0, x.shape[0], ROWS):
            xa, oa = x.ctypes.data + t0 * xr, out.ctypes.data + t0 * os
            for n in range(r0, r1):
                dot_row_f32_rows8(fmt, wa + n * rb, xa, xr, n_units, oa + n * 4, os)


@njit(parallel=True, cache=True)
def matmul_rows3(
    f0, w0, u0, o0, f1, w1, u1, o1, f2, w2, u2, o2, x, levels, xq, xd, xs, rpt
):  # pragma: no cover - compiled
    """Up to three projections of the same activation rows, T of them, a multiple of ROWS (:func:`pad_rows`):
    the floats ``x`` (T, K), or where ``levels`` > 0 their int16 codes ``xq``/``xd``/``xs``
    (:func:`.matvec.quantize_rows_i16`), in one parallel loop over weight rows (unused slots pass weights
    with zero rows); each weight row is decoded once per ROWS activation rows."""
    p0, p1, p2 = task_size(f0, rpt), task_size(f1, rpt), task_size(f2, rpt)
    t0, t1 = task_count(w0.shape[0], p0), task_count(w1.shape[0], p1)
    for i in prange(t0 + t1 + task_count(w2.shape[0], p2)):
        if i < t0:
            r0 = i * p0
            _rows(f0, w0, u0, r0, min(w0.shape[0], r0 + p0), x, levels, xq, xd, xs, o0)
        elif i < t0 + t1:
            r0 = (i - t0) * p1
            _rows(f1, w1, u1, r0, min(w1.shape[0], r0 + p1), x, levels, xq, xd, xs, o1)
        else:
            r0 = (i - t0 - t1) * p2
            _rows(f2, w2, u2, r0, min(w2.shape[0], r0 + p2), x, levels, xq, xd, xs, o2)
