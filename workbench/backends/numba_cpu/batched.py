"""Batched projections: a few activation rows (a batch's decode step, a speculative verification) against
whole weights, each weight row decoded once per 8 activation rows (:mod:`.dot_f32_rows8` with exact float
activations, :mod:`.dot_int16_rows8` with int16 ones; interleaved layouts by their 16-row path). Each row's
arithmetic is the same whatever the number of rows, so a row's result does not depend on the batch.
Figures: docs/backend-cpu.md#batched-kernels."""

from __future__ import annotations

from ..._numba import numba
from .dispatch import dot_row_f32_rows8, dot_row_i16_rows8
from .dot_f32_rows8 import ROWS, pad_rows
from .interleaved import rows_i16 as r16_rows_i16
from .matvec import rows_f32_by_dequant, task_count, task_size
from .simd import R16_FMTS

njit, prange = numba.njit, numba.prange
__all__ = ["ROWS", "matmul_rows3", "matmul_rows3_i16", "pad_rows"]


@njit(cache=True)
def _rows(fmt, w, n_units, r0, r1, x, out):  # pragma: no cover - compiled
    """out[:, n] = x @ row n of w for weight rows r0..r1; x has a multiple of ROWS rows."""
    wa, rb = w.ctypes.data, w.shape[1]
    if fmt in R16_FMTS:
        rows_f32_by_dequant(fmt, wa, rb, n_units, r0, r1, x, out, r0)
        return
    xs, os = x.strides[0], out.strides[0]
    for t0 in range(0, x.shape[0], ROWS):
        xa, oa = x.ctypes.data + t0 * xs, out.ctypes.data + t0 * os
        for n in range(r0, r1):
            dot_row_f32_rows8(fmt, wa + n * rb, xa, xs, n_units, oa + n * 4, os)


@njit(parallel=True, cache=True)
def matmul_rows3(f0, w0, u0, o0, f1, w1, u1, o1, f2, w2, u2, o2, x, rpt):  # pragma: no cover - compiled
    """Up to three projections of the same activation rows ``x`` (T, K), T a multiple of ROWS
    (:func:`pad_rows`), in one parallel loop over weight rows (unused slots pass weights with zero rows);
    each weight row is decoded once per ROWS activation rows."""
    t0, t1 = task_count(w0.shape[0], rpt), task_count(w1.shape[0], rpt)
    for i in prange(t0 + t1 + task_count(w2.shape[0], rpt)):
        if i < t0:
            r0 = i * rpt
            _rows(f0, w0, u0, r0, min(w0.shape[0], r0 + rpt), x, o0)
        elif i < t0 + t1:
            r0 = (i - t0) * rpt
            _rows(f1, w1, u1, r0, min(w1.shape[0], r0 + rpt), x, o1)
        else:
            r0 = (i - t0 - t1) * rpt
            _rows(f2, w2, u2, r0, min(w2.shape[0], r0 + rpt), x, o2)


@njit(cache=True)
def _rows_i16(fmt, w, n_units, r0, r1, xq, xd, xs, out):  # pragma: no cover - compiled
    """out[:, n] = activation rows . row n of w for weight rows r0..r1; a multiple of ROWS activation rows."""
    wa, rb = w.ctypes.data, w.shape[1]
    if fmt in R16_FMTS:  # 16 weight rows at a time, for each activation row
        r16_rows_i16(fmt, wa, rb, n_units, r0, r1, xq, xd, xs, out, r0)
        return
    qs, ds, os = xq.strides[0], xd.strides[0], out.strides[0]
    for t0 in range(0, xq.shape[0], ROWS):
        q, d, s = xq.ctypes.data + t0 * qs, xd.ctypes.data + t0 * ds, xs.ctypes.data + t0 * ds
        oa = out.ctypes.data + t0 * os
        for n in range(r0, r1):
            dot_row_i16_rows8(fmt, wa + n * rb, q, qs, d, s, ds, n_units, oa + n * 4, os)


@njit(parallel=True, cache=True)
def matmul_rows3_i16(f0, w0, u0, o0, f1, w1, u1, o1, f2, w2, u2, o2, xq, xd, xs, rpt):  # pragma: no cover
    """The int16 twin of :func:`matmul_rows3`: activation rows as ``xq``/``xd``/``xs`` (a multiple of
    ROWS rows, :func:`pad_rows`)."""
    p0, p1, p2 = task_size(f0, rpt), task_size(f1, rpt), task_size(f2, rpt)
    t0, t1 = task_count(w0.shape[0], p0), task_count(w1.shape[0], p1)
    for i in prange(t0 + t1 + task_count(w2.shape[0], p2)):
        if i < t0:
            r0 = i * p0
            _rows_i16(f0, w0, u0, r0, min(w0.shape[0], r0 + p0), xq, xd, xs, o0)
        elif i < t0 + t1:
            r0 = (i - t0) * p1
            _rows_i16(f1, w1, u1, r0, min(w1.shape[0], r0 + p1), xq, xd, xs, o1)
        else:
            r0 = (i - t0 - t1) * p2
            _rows_i16(f2, w2, u2, r0, min(w2.shape[0], r0 + p2), xq, xd, xs, o2)
