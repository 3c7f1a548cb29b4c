"""Matvecs over weights whose rows are interleaved 16 at a time (Q8_0_R16, Q5_0_R16, Q4_K_R16): whole
groups by the 16-row kernels (:mod:`.dot_int16_interleaved`, through :mod:`.dispatch`), groups cut by a
task's row range computed whole and the rows asked for copied, and one row back in its GGUF block layout
(:func:`gguf_row`, for dequantization)."""

from __future__ import annotations

import numpy as np

from ...numba_jit import numba
from ...quant.repack import Q4_K_BYTES, Q5_0_BYTES, Q8_0_BYTES, ROW_GROUP
from .addr import u8_ptr
from .dispatch import dot16_i16
from .simd import INTERLEAVED, Q4_K_R16, Q5_0_R16, Q8_0_R16

njit = numba.njit
GGUF_Q8_0, GGUF_Q5_0, GGUF_Q4_K = (int(INTERLEAVED[f]) for f in (Q8_0_R16, Q5_0_R16, Q4_K_R16))


@njit(cache=True)
def rows_i16(fmt, wa, rb, n_units, r0, r1, xq, xd, xs, out, c0):  # pragma: no cover - compiled
    """out[t, c0 + n - r0] = row n of the interleaved weight at ``wa`` (``rb`` bytes a row) . activation
    row t (int16 codes at the start of each row of ``xq``, block scales ``xd``, code sums ``xs``), for rows
    r0..r1. Whole groups inside r0..r1 are stored in place (nothing allocated: this runs per task); a group
    cut by r0 or r1 is computed whole and the rows asked for copied."""
    for t in range(xq.shape[0]):
        q, d, s = (xq.ctypes.data + t * xq.strides[0], xd.ctypes.data + t * xd.strides[0],
                   xs.ctypes.data + t * xs.strides[0])  # fmt: skip
        row = out.ctypes.data + t * out.strides[0]
        for g in range(r0 // ROW_GROUP, (r1 + ROW_GROUP - 1) // ROW_GROUP):
            n0 = g * ROW_GROUP
            if n0 >= r0 and n0 + ROW_GROUP <= r1 and out.strides[1] == 4:
                dot16_i16(fmt, wa + n0 * rb, q, d, s, n_units, row + (c0 + n0 - r0) * 4)
            else:
                _cut_group(fmt, wa + n0 * rb, q, d, s, n_units, out[t], c0 + n0 - r0, max(n0, r0) - n0,
                           min(n0 + ROW_GROUP, r1) - n0)  # fmt: skip


@njit(cache=True)
def _cut_group(fmt, ga, q, d, s, n_units, out_row, at, first, end):  # pragma: no cover - compiled
    """Rows ``first .. end - 1`` of the group at ``ga`` into ``out_row[at + first ...]``."""
    buf = np.empty(ROW_GROUP, np.float32)
    dot16_i16(fmt, ga, q, d, s, n_units, buf.ctypes.data)
    for i in range(first, end):
        out_row[at + i] = buf[i]


@njit(cache=True)
def gguf_row(fmt, wa, rb, n, dst):  # pragma: no cover - compiled
    """Write row ``n`` of the interleaved weight at ``wa`` into ``dst`` (uint8, ``rb`` bytes) as its GGUF
    blocks, for the kernels that read rows one by one; returns their GGUF type (Q8_0, Q5_0 or Q4_K)."""
    lane = n % ROW_GROUP
    src = numba.carray(u8_ptr(wa + (n - lane) * rb), (ROW_GROUP * rb,))
    if fmt == Q8_0_R16:
        for blk in range(rb // Q8_0_BYTES):
            s, o = blk * ROW_GROUP * Q8_0_BYTES, blk * Q8_0_BYTES
            _take(src, s, 2, 2, lane, dst, o)
            _take(src, s + 32, 32, 2, lane, dst, o + 2)
        return GGUF_Q8_0
    if fmt == Q4_K_R16:
        for blk in range(rb // Q4_K_BYTES):
            s, o = blk * ROW_GROUP * Q4_K_BYTES, blk * Q4_K_BYTES
            _take(src, s, 2, 2, lane, dst, o)
            _take(src, s + 32, 2, 2, lane, dst, o + 2)
            _take(src, s + 64, 12, 1, lane, dst, o + 4)
            _take(src, s + 256, 128, 2, lane, dst, o + 16)
        return GGUF_Q4_K
    for blk in range(rb // Q5_0_BYTES):
        s, o = blk * ROW_GROUP * Q5_0_BYTES, blk * Q5_0_BYTES
        _take(src, s, 2, 2, lane, dst, o)
        qh = np.uint32(0)
        for k in range(16):
            w = s + 32 + 4 * k
            word = (np.uint32(src[w]) | (np.uint32(src[w + 1]) << 8) | (np.uint32(src[w + 2]) << 16)
                    | (np.uint32(src[w + 3]) << 24))  # fmt: skip
            qh |= ((word >> np.uint32(2 * lane)) & np.uint32(3)) << np.uint32(2 * k)
        for i in range(4):
            dst[o + 2 + i] = np.uint8((qh >> np.uint32(8 * i)) & np.uint32(0xFF))
        _take(src, s + 96, 16, 2, lane, dst, o + 6)
    return GGUF_Q5_0


@njit(cache=True, inline="always")
def _take(src, at, n, granule, lane, dst, o):  # pragma: no cover - compiled
    """The inverse of repack's ``_interleaved`` for one row: ``n`` bytes of row ``lane``, stored from ``at`` in
    granules of ``granule`` bytes (each granule of the 16 rows in turn), into ``dst[o:o + n]``."""
    for i in range(n):
        dst[o + i] = src[at + (i // granule) * ROW_GROUP * granule + lane * granule + i % granule]
