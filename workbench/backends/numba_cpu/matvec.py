"""Quantized matrix-vector kernels (numba, parallel over output rows) on weights in their GGUF blocks.

Every kernel takes the weight as ``uint8`` (rows, bytes per row), exactly as stored in the GGUF file, and
a small number of activation rows (decode, batched decode, speculative verification); prefill of many
tokens dequantizes weight tiles and multiplies with BLAS instead (:func:`.projection.gemm`). Which kernel
a row runs and why: docs/backend-cpu.md#how-the-decode-kernels-are-chosen.
"""

from __future__ import annotations

import numpy as np

from ...numba_jit import numba
from ...quant.formats import GGMLType
from ...quant.repack import ROW_GROUP
from .addr import i16_ptr
from .dispatch import dequant_row, dot_rows_f32, dot_rows_i8, dot_rows_i16
from .dot_int8_vnni import HAS_VNNI, UNIT_VALUES, VNNI_ORDER
from .interleaved import gguf_row
from .interleaved import rows_i16 as r16_rows_i16
from .kernel_table import WIDE
from .simd import (
    DECODERS,
    INTERLEAVED,
    Q5_0_X4,
    R16_FMTS,
    REPACKED,
)

njit, prange = numba.njit, numba.prange

Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K = (
    int(t) for t in (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K)
)
F32, F16, BF16 = int(GGMLType.F32), int(GGMLType.F16), int(GGMLType.BF16)
QUANT_TYPES = frozenset(DECODERS)
# CpuWeight.fmt values of the GGUF block formats and of the layouts they are repacked into
QUANT_FMTS = frozenset(int(t) for t in QUANT_TYPES) | frozenset(REPACKED) | frozenset(INTERLEAVED)
FLOAT_TYPES = frozenset({GGMLType.F32, GGMLType.F16, GGMLType.BF16})

# every row kernel is in kernel_table.KERNELS, called through the generated dispatch functions


# AVX512-VNNI hosts (with the 512-bit kernels): int8 activations multiply Q8_0, Q5_0_X4, Q4_K and Q6_K_I8
# rows by vpdpbusd (dot_int8_vnni.py), from an int8 copy that the quantizer writes into int8 buffers (act_codes)
VNNI = WIDE and HAS_VNNI
V8_Q8_0_VALUES, V8_X4_VALUES, V8_K_VALUES = UNIT_VALUES[Q8_0], UNIT_VALUES[Q5_0_X4], UNIT_VALUES[Q4_K]


def act_codes(rows: int, cols: int, vnni: bool) -> np.ndarray:
    """The buffer of :func:`quantize_rows_i16`'s codes for ``rows`` activation rows of ``cols`` values: int16,
    or, for the VNNI kernels, int8 rows of 3 x cols bytes (the int16 codes, then their int8 copy)."""
    return np.zeros((rows, 3 * cols), np.int8) if vnni else np.zeros((rows, cols), np.int16)


def units(qtype: int, cols: int) -> int:
    """Decode units (blocks, or superblocks for k-quants) in a row of ``cols`` values."""
    return cols // DECODERS[GGMLType(qtype)].unit_values


@njit(cache=True, inline="always")
def _vnni_block(blk, n_blocks):  # pragma: no cover - compiled
    """Where block ``blk`` sits in the int8 copy: VNNI_ORDER within whole groups of 4, a last partial group
    in its order."""
    g, j = blk // 4, blk % 4
    return 4 * g + VNNI_ORDER[j] if 4 * g + 4 <= n_blocks else blk


@njit(cache=True, fastmath=True)
def quantize_rows_i16(x, levels, xq, xd, xs):  # pragma: no cover - compiled
    """Per 32-value block: scale = max|x| / levels, codes = round(x / scale), xs = sum(codes) (for k-quant
    mins). ``xq`` int16: the codes; int8 (:func:`act_codes`, levels <= 127): each row holds the codes as
    int16 in its first 2 x cols bytes and then as int8 in the VNNI kernels' block order (dot_int8_vnni.py)."""
    t_n, k = x.shape
    nb = k // 32
    for t in range(t_n):
        row = xq.ctypes.data + t * xq.strides[0]
        q16 = numba.carray(i16_ptr(row), (k,))
        for blk in range(nb):
            amax = np.float32(0.0)
            for i in range(32):
                a = abs(x[t, blk * 32 + i])
                if a > amax:
                    amax = a
            d = amax / np.float32(levels)
            inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
            s = np.int32(0)
            for i in range(32):
                q = np.int16(np.rint(x[t, blk * 32 + i] * inv))
                q16[blk * 32 + i] = q
                s += np.int32(q)
            xd[t, blk] = d
            xs[t, blk] = np.float32(s)
        if xq.itemsize == 1:
            for blk in range(nb):
                dst = 2 * k + _vnni_block(blk, nb) * 32
                for i in range(32):
                    xq[t, dst + i] = np.int8(q16[blk * 32 + i])


@njit(cache=True, fastmath=True)
def block_sums(x, xs):  # pragma: no cover - compiled
    t_n, k = x.shape
    for t in range(t_n):
        for blk in range(k // 32):
            s = np.float32(0.0)
            for i in range(32):
                s += x[t, blk * 32 + i]
            xs[t, blk] = s


ROWS_PER_TASK = 16  # default rows per parallel task (tunable ``rows_per_task``: the CPU's "workgroup size")


# stand-ins for the activation arrays a call does not read (the kernels below and .batched.matmul_rows3 take
# both the exact floats and the int16 codes, and read those ``levels`` picks): a float call's codes and
# scales, an int16 call's floats
NO_CODES, NO_FLOATS = np.zeros((1, 0), np.int16), np.zeros((1, 0), np.float32)


@njit(cache=True)
def _rows(fmt, w, n_units, r0, r1, x, levels, xq, xd, xs, out, c0):  # pragma: no cover - compiled
    """out[t, c0 + i] = row r0 + i of w . activation row t, for rows r0..r1 and every activation row: int16
    (int8) codes ``xq``/``xd``/``xs`` where ``levels`` > 0, else the exact floats ``x`` (block sums ``xs``)."""
    rows_levels_at(fmt, w.ctypes.data, w.shape[1], n_units, r0, r1, x, levels, xq, xd, xs, out, c0)


@njit(cache=True)
def rows_i16_at(fmt, wa, rb, n_units, r0, r1, xq, xd, xs, out, c0):  # pragma: no cover - compiled
    """out[t, c0 + i] = row r0 + i . int16 activation row t for rows r0..r1 of the weight at address ``wa``
    (``rb`` bytes a row); an int8 ``xq`` (:func:`act_codes`) runs the VNNI kernels where the format has one."""
    if fmt in R16_FMTS:
        r16_rows_i16(fmt, wa, rb, n_units, r0, r1, xq, xd, xs, out, c0)
        return
    for t in range(xq.shape[0]):
        q, d, s = (
            xq.ctypes.data + t * xq.strides[0],
            xd.ctypes.data + t * xd.strides[0],
            xs.ctypes.data + t * xs.strides[0],
        )
        if xq.itemsize == 1 and rows_i8(fmt, wa, rb, n_units, r0, r1, q, d, s, out[t], c0):
            continue
        dot_rows_i16(fmt, wa, rb, n_units, r0, r1, q, d, s, out[t], c0)


@njit(cache=True)
def rows_i8(fmt, wa, rb, n_units, r0, r1, q, d, s, out, c0):  # pragma: no cover - compiled
    """out[c0 + i] = row r0 + i . the activation row whose codes start at ``q`` (int16, then the int8 copy)
    by the VNNI kernels (the int8 copy after the 2 x cols bytes of int16 codes); False (nothing done) for a
    format without one."""
    if fmt == Q8_0 and n_units % 4:
        return False  # not whole groups of 4 blocks
    q8 = q + 2 * n_units * (
        V8_Q8_0_VALUES if fmt == Q8_0 else V8_X4_VALUES if fmt == Q5_0_X4 else V8_K_VALUES
    )
    return dot_rows_i8(fmt, wa, rb, n_units, r0, r1, q8, d, s, out, c0)


@njit(cache=True)
def rows_f32_at(fmt, wa, rb, n_units, r0, r1, x, xs, out, c0):  # pragma: no cover - compiled
    """The exact-float twin of :func:`rows_i16_at`."""
    if fmt in R16_FMTS:
        rows_f32_by_dequant(fmt, wa, rb, n_units, r0, r1, x, out, c0)
        return
    for t in range(x.shape[0]):
        xp, s = x.ctypes.data + t * x.strides[0], xs.ctypes.data + t * xs.strides[0]
        dot_rows_f32(fmt, wa, rb, n_units, r0, r1, xp, s, out[t], c0)


@njit(cache=True)
def rows_at(wrow, r0, r1, x, levels, xq, xd, xs, out, c0):  # pragma: no cover - compiled
    """Rows r0..r1 of the weight of table row ``wrow`` (see W_FMT) . each activation row, into ``out[t, c0:]``:
    int16 (int8) codes ``xq``/``xd``/``xs`` where ``levels`` > 0, else the exact floats ``x`` (block sums
    ``xs``)."""
    rows_levels_at(wrow[W_FMT], wrow[W_ADDR], wrow[W_ROW_BYTES], wrow[W_UNITS], r0, r1, x, levels, xq, xd, xs,
                   out, c0)  # fmt: skip


@njit(cache=True)
def rows_levels_at(
    fmt, wa, rb, n_units, r0, r1, x, levels, xq, xd, xs, out, c0
):  # pragma: no cover - compiled
    """:func:`rows_i16_at` where ``levels`` > 0, else :func:`rows_f32_at`: the one choice between the int16
    (int8) codes and the exact floats, for a weight at address ``wa`` (``rb`` bytes a row)."""
    if levels > 0:
        rows_i16_at(fmt, wa, rb, n_units, r0, r1, xq, xd, xs, out, c0)
    else:
        rows_f32_at(fmt, wa, rb, n_units, r0, r1, x, xs, out, c0)


@njit(cache=True)
def rows_f32_by_dequant(fmt, wa, rb, n_units, r0, r1, x, out, c0):  # pragma: no cover - compiled
    """out[t, c0 + n - r0] = row n . x[t] for rows r0..r1, each row dequantized (:func:`dequant_row_at`) and
    summed in float in value order: the exact path of the interleaved layouts, which have no float kernel
    (the backend interleaves only for quantized activations)."""
    w = np.empty(x.shape[1], np.float32)  # the row's values
    for n in range(r0, r1):
        dequant_row_at(fmt, wa, rb, n, w.ctypes.data, n_units)
        for t in range(x.shape[0]):
            s = np.float32(0.0)
            for i in range(w.shape[0]):
                s += w[i] * x[t, i]
            out[t, c0 + n - r0] = s


@njit(cache=True)
def dequant_row_at(fmt, wa, rb, n, out, n_units):  # pragma: no cover - compiled
    """Row ``n`` of the weight at ``wa`` (``rb`` bytes a row) as float32 at ``out``."""
    row = wa + n * rb
    if fmt in R16_FMTS:
        buf = np.empty(rb, np.uint8)
        fmt, row = gguf_row(fmt, wa, rb, n, buf), buf.ctypes.data
    dequant_row(fmt, row, out, n_units)


@njit(cache=True)
def task_count(n_rows, rpt):  # pragma: no cover - compiled
    return (n_rows + rpt - 1) // rpt


@njit(cache=True)
def task_size(fmt, rpt):  # pragma: no cover - compiled
    """Rows of a task of a ``fmt`` weight asked to run tasks of ``rpt`` rows: for the interleaved layouts a
    multiple of 16 (their kernels compute whole groups of 16 rows; a task cutting one would compute it twice)."""
    return -(-rpt // ROW_GROUP) * ROW_GROUP if fmt in R16_FMTS else rpt


@njit(parallel=True, cache=True)
def matvec(fmt, w, n_units, x, levels, xq, xd, xs, out, rpt=ROWS_PER_TASK):  # pragma: no cover - compiled
    """out[t, n] = dot(row n of w, activation row t), activations as :func:`_rows` takes them, in parallel
    tasks of rows."""
    n = w.shape[0]
    rpt = task_size(fmt, rpt)
    for i in prange(task_count(n, rpt)):
        r0 = i * rpt
        _rows(fmt, w, n_units, r0, min(n, r0 + rpt), x, levels, xq, xd, xs, out, r0)


@njit(parallel=True, cache=True)
def matvec3(
    f0, w0, u0, o0, f1, w1, u1, o1, f2, w2, u2, o2, x, levels, xq, xd, xs, rpt
):  # pragma: no cover - compiled
    """Up to three projections of the same activations (as :func:`_rows` takes them) in one parallel loop
    (QKV; gate and up): one wake-up of the threads instead of three.

    Unused slots pass weights with zero rows."""
    p0, p1, p2 = task_size(f0, rpt), task_size(f1, rpt), task_size(f2, rpt)
    t0, t1 = task_count(w0.shape[0], p0), task_count(w1.shape[0], p1)
    for i in prange(t0 + t1 + task_count(w2.shape[0], p2)):
        if i < t0:
            r0 = i * p0
            _rows(f0, w0, u0, r0, min(w0.shape[0], r0 + p0), x, levels, xq, xd, xs, o0, r0)
        elif i < t0 + t1:
            r0 = (i - t0) * p1
            _rows(f1, w1, u1, r0, min(w1.shape[0], r0 + p1), x, levels, xq, xd, xs, o1, r0)
        else:
            r0 = (i - t0 - t1) * p2
            _rows(f2, w2, u2, r0, min(w2.shape[0], r0 + p2), x, levels, xq, xd, xs, o2, r0)


@njit(parallel=True, cache=True)
def dequantize_rows(fmt, w, n_units, row0, out):  # pragma: no cover - compiled
    """out[i] = float32 values of row ``row0 + i`` of w, for every row of ``out``."""
    rb = w.shape[1]
    for i in prange(out.shape[0]):
        dequant_row_at(fmt, w.ctypes.data, rb, row0 + i, out.ctypes.data + i * out.strides[0], n_units)


@njit(cache=True)
def dequantize_gather(fmt, w, n_units, rows, out):  # pragma: no cover - compiled
    """out[i] = float32 values of row ``rows[i]`` of w (embedding lookup)."""
    rb = w.shape[1]
    for i in range(rows.shape[0]):
        dequant_row_at(fmt, w.ctypes.data, rb, rows[i], out.ctypes.data + i * out.strides[0], n_units)


# weight tables for the step programs (program.py): one row per weight, columns below
W_FMT, W_ADDR, W_ROW_BYTES, W_ROWS, W_UNITS = range(5)
