"""NPU numerics: bf16 rounding, int8 quantization, and the AIE's shift-round-saturate (SRS)."""

from __future__ import annotations

import numpy as np

F32 = np.float32


def to_bf16(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to bfloat16 (round to nearest, ties to even), returned as float32 values."""
    u = np.ascontiguousarray(x, dtype=F32).view(np.uint32)
    rounded = (u + (((u >> 16) & 1) + np.uint32(0x7FFF))) & np.uint32(0xFFFF0000)
    return np.where(np.isnan(u.view(F32)), u, rounded).view(F32).reshape(np.shape(x))


def srs(acc: np.ndarray, shift: int, bits: int = 16) -> np.ndarray:
    """Shift-round-saturate: ``acc / 2**shift`` rounded half to even, saturated to a signed ``bits`` integer."""
    if shift < 0:
        raise ValueError(f"SRS shift must be >= 0, got {shift}")
    a = np.asarray(acc, dtype=np.int64)
    if shift:
        floor = a >> shift
        rem = a - (floor << shift)
        half = np.int64(1) << (shift - 1)
        up = (rem > half) | ((rem == half) & (floor & 1 == 1))
        a = floor + up
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return np.clip(a, lo, hi).astype(np.int16 if bits <= 16 else np.int32)


def quantize_rows_i8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per row: ``q`` (int8) and ``scale`` (float32, per row) with x ~= q * scale."""
    x = np.asarray(x, dtype=F32)
    amax = np.max(np.abs(x), axis=-1, keepdims=True)
    scale = np.where(amax > 0, amax / F32(127.0), F32(1.0)).astype(F32)
    q = np.clip(np.rint(x / scale), -127, 127).astype(np.int8)
    return q, scale.reshape(x.shape[:-1])


def srs_shift(wq: np.ndarray, bits: int = 16) -> int:
    """The static SRS shift of an int8 GEMM with weights ``wq`` (N x K): the smallest that cannot
    saturate for any int8 activation (|acc| <= 127 * sum |w| over a row)."""
    bound = 127 * int(np.abs(wq.astype(np.int64)).sum(axis=-1).max(initial=0))
    return max(0, bound.bit_length() - (bits - 1))
