"""The ``ffn_down`` columns a sparse FFN reads, stored transposed, and the kernel that sums the kept ones.

A column of a row-major quantized matrix is spread over every row's blocks, so a kernel that reads only the
kept columns needs the transpose: row ``j`` = the ``hidden`` weights activation ``j`` contributes. Each row
is stored as the spec's ``ffn-down`` format says (:func:`workbench.sparsity.ffn.down_columns`):

* ``fp32``: the exact dequantized values (``4 * hidden`` bytes; 5 MiB per 640 x 2048 layer);
* ``fp16``: IEEE half (``2 * hidden`` bytes);
* ``int8``: ``hidden`` codes, padded to 4 bytes, then the row's float32 scale (``hidden + 4`` bytes).

A store is one ``uint8`` array (rows, row bytes) that kernels find by address in a weight table row
(format code, address, row bytes, rows, hidden), like the GGUF weights of the step programs.
"""

from __future__ import annotations

import numpy as np

from ...numba_jit import numba
from ...sparsity.ffn import down_columns
from .addr import f32_ptr, i8_ptr, prefetch, u16_ptr
from .qformats import half_to_float

njit, prange = numba.njit, numba.prange
FMT_CODES = {"fp32": -21, "fp16": -22, "int8": -23}  # weight-table format codes (below every GGUF type id)
D_F32, D_F16, D_I8 = FMT_CODES.values()


def column_store(down_w: np.ndarray, fmt: str) -> np.ndarray:
    """``down_w`` (hidden, ffn) float32 as the transposed store of format ``fmt``."""
    planes = down_columns(down_w, fmt)
    q = planes["q"]
    if fmt != "int8":
        return np.ascontiguousarray(q).view(np.uint8)
    hidden = q.shape[1]
    codes = -(-hidden // 4) * 4
    store = np.zeros((q.shape[0], codes + 4), np.uint8)
    store[:, :hidden] = q.view(np.uint8)
    store[:, codes:] = planes["scale"].astype(np.float32).view(np.uint8).reshape(-1, 4)
    return store


def table_row(store: np.ndarray, fmt: str, hidden: int) -> tuple[int, int, int, int, int]:
    """The weight-table row of a store: format code, address, row bytes, rows, hidden."""
    return FMT_CODES[fmt], store.ctypes.data, store.shape[1], store.shape[0], hidden


@njit(cache=True, inline="always")
def _prefetch_row(addr, nbytes):  # pragma: no cover - compiled
    for off in range(0, nbytes, 64):
        prefetch(addr + off)


@njit(cache=True, inline="always")
def _row(base, rb, idx, f, fmt, j, m, off):  # pragma: no cover - compiled
    """Address (plus ``off`` bytes) and weight of kept row ``j`` (int8: times the row's scale); past the
    end, row 0 with weight 0."""
    if j >= m:
        return base + idx[0] * rb + off, np.float32(0.0)
    r = base + idx[j] * rb
    return r + off, f[j] * f32_ptr(r + rb - 4)[0] if fmt == D_I8 else f[j]


@njit(cache=True, fastmath=True)
def _sum_rows(fmt, base, rb, idx, f, c0, c1, out):  # pragma: no cover - compiled
    """``out[c] = sum_j f[j] * row idx[j][c]`` for columns c0..c1, four rows per pass over a local sum."""
    m, n = idx.shape[0], c1 - c0
    size = 4 if fmt == D_F32 else 2 if fmt == D_F16 else 1
    off = c0 * size
    acc = np.zeros(n, np.float32)
    for j0 in range(0, m, 4):
        for j in range(j0 + 4, min(m, j0 + 8)):  # the next pass's rows
            _prefetch_row(base + idx[j] * rb + off, n * size)
        r0, w0 = _row(base, rb, idx, f, fmt, j0, m, off)
        r1, w1 = _row(base, rb, idx, f, fmt, j0 + 1, m, off)
        r2, w2 = _row(base, rb, idx, f, fmt, j0 + 2, m, off)
        r3, w3 = _row(base, rb, idx, f, fmt, j0 + 3, m, off)
        if fmt == D_F32:
            a0, a1 = numba.carray(f32_ptr(r0), (n,)), numba.carray(f32_ptr(r1), (n,))
            a2, a3 = numba.carray(f32_ptr(r2), (n,)), numba.carray(f32_ptr(r3), (n,))
            for c in range(n):
                acc[c] += w0 * a0[c] + w1 * a1[c] + w2 * a2[c] + w3 * a3[c]
        elif fmt == D_F16:
            h0, h1 = numba.carray(u16_ptr(r0), (n,)), numba.carray(u16_ptr(r1), (n,))
            h2, h3 = numba.carray(u16_ptr(r2), (n,)), numba.carray(u16_ptr(r3), (n,))
            for c in range(n):
                acc[c] += (w0 * half_to_float(h0[c]) + w1 * half_to_float(h1[c])
                           + w2 * half_to_float(h2[c]) + w3 * half_to_float(h3[c]))  # fmt: skip
        else:
            b0, b1 = numba.carray(i8_ptr(r0), (n,)), numba.carray(i8_ptr(r1), (n,))
            b2, b3 = numba.carray(i8_ptr(r2), (n,)), numba.carray(i8_ptr(r3), (n,))
            for c in range(n):
                acc[c] += (w0 * np.float32(np.int32(b0[c])) + w1 * np.float32(np.int32(b1[c]))
                           + w2 * np.float32(np.int32(b2[c])) + w3 * np.float32(np.int32(b3[c])))  # fmt: skip
    out[c0:c1] = acc


@njit(parallel=True, cache=True)
def down_kept(wrow, idx, f, out, parts):  # pragma: no cover - compiled
    """``out[c] = sum_j f[j] * W[idx[j], c]`` over the store of table row ``wrow``: ``parts`` column ranges
    (one per thread), so every kept row is read in long runs."""
    fmt, base, rb, hidden = wrow[0], wrow[1], wrow[2], wrow[4]
    width = ((hidden + parts - 1) // parts + 15) // 16 * 16
    for i in prange((hidden + width - 1) // width):
        _sum_rows(fmt, base, rb, idx, f, i * width, min(hidden, (i + 1) * width), out)
