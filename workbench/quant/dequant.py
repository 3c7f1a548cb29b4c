"""Vectorized numpy dequantizers for GGML block formats (the reference semantics of each format).

Each function takes the raw bytes of whole blocks as a ``uint8`` array and returns float32 values.
The arithmetic order follows ggml's reference C code, so results are bit-identical to
``gguf.quants.dequantize``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .formats import FORMATS, GGMLType, UnsupportedQuantError

_F16 = np.dtype("<f2")
_U32 = np.dtype("<u4")


def _blocks(raw: np.ndarray, block_bytes: int) -> np.ndarray:
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if raw.size % block_bytes:
        raise ValueError(f"{raw.size} bytes is not a whole number of {block_bytes}-byte blocks")
    return raw.reshape(-1, block_bytes)


def _f16(cols: np.ndarray) -> np.ndarray:
    """Column pair of bytes -> float32 of shape (n_blocks, 1)."""
    return np.ascontiguousarray(cols).view(_F16).astype(np.float32)


def _f32(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view("<f4").astype(np.float32, copy=False).reshape(-1)


def _f16_plain(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(_F16).astype(np.float32).reshape(-1)


def _bf16(raw: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(raw).view("<u2").astype(np.uint32) << 16
    return bits.view(np.float32).reshape(-1)


def _q8_0(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, 34)
    d = _f16(b[:, 0:2])
    q = b[:, 2:].view(np.int8).astype(np.float32)
    return (d * q).reshape(-1)


def _q4_0(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, 18)
    d = _f16(b[:, 0:2])
    qs = b[:, 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int8) - np.int8(8)
    return (d * q.astype(np.float32)).reshape(-1)


def _q4_1(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, 20)
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    qs = b[:, 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
    return (d * q + m).reshape(-1)


def q5_bits(qh_bytes: np.ndarray) -> np.ndarray:
    """The 32 high bits of a Q5_0/Q5_1 block, as (n_blocks, 32) values 0/1."""
    qh = np.ascontiguousarray(qh_bytes).view(_U32)
    return ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _q5_0(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, 22)
    d = _f16(b[:, 0:2])
    qs = b[:, 6:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1) | (q5_bits(b[:, 2:6]) << 4)
    return (d * (q.astype(np.int8) - np.int8(16)).astype(np.float32)).reshape(-1)


def _q5_1(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, 24)
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    qs = b[:, 8:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1) | (q5_bits(b[:, 4:8]) << 4)
    return (d * q.astype(np.float32) + m).reshape(-1)


def k_scales_mins(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 12-byte 6-bit scales/mins of Q4_K/Q5_K into two (n_blocks, 8) uint8 arrays."""
    s = scales
    sc = np.empty((s.shape[0], 8), dtype=np.uint8)
    mn = np.empty((s.shape[0], 8), dtype=np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn


def _q4_k(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, 144)
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = k_scales_mins(b[:, 4:16])
    qs = b[:, 16:].reshape(-1, 4, 1, 32)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float32)
    dl = (d * sc.astype(np.float32))[:, :, None]
    ml = (dmin * mn.astype(np.float32))[:, :, None]
    return (dl * q - ml).reshape(-1)


def _q5_k(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, 176)
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = k_scales_mins(b[:, 4:16])
    qh = b[:, 16:48]
    qs = b[:, 48:].reshape(-1, 4, 1, 32)
    nib = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    q = (nib + (high << 4)).astype(np.float32)
    dl = (d * sc.astype(np.float32))[:, :, None]
    ml = (dmin * mn.astype(np.float32))[:, :, None]
    return (dl * q - ml).reshape(-1)


def q6_k_codes(b: np.ndarray) -> np.ndarray:
    """The 256 signed codes (q - 32, in value order) of each 210-byte Q6_K superblock: (n, 256) int8."""
    ql = b[:, 0:128].reshape(-1, 2, 1, 2, 32)  # half, nibble, lo/hi 32, l
    qh = b[:, 128:192].reshape(-1, 2, 1, 32)
    nib = np.concatenate([ql & 0x0F, ql >> 4], axis=2).reshape(-1, 2, 4, 32)
    high = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]) & 3
    return ((nib | (high << 4)).astype(np.int8) - np.int8(32)).reshape(-1, 256)


def _q6_k(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, 210)
    sc = b[:, 192:208].view(np.int8).astype(np.float32).reshape(-1, 16, 1)
    d = _f16(b[:, 208:210])[:, :, None]
    return ((d * sc) * q6_k_codes(b).reshape(-1, 16, 16).astype(np.float32)).reshape(-1)


DEQUANTIZERS: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {
    GGMLType.F32: _f32,
    GGMLType.F16: _f16_plain,
    GGMLType.BF16: _bf16,
    GGMLType.Q8_0: _q8_0,
    GGMLType.Q4_0: _q4_0,
    GGMLType.Q4_1: _q4_1,
    GGMLType.Q5_0: _q5_0,
    GGMLType.Q5_1: _q5_1,
    GGMLType.Q4_K: _q4_k,
    GGMLType.Q5_K: _q5_k,
    GGMLType.Q6_K: _q6_k,
}

DEQUANTIZABLE = frozenset(DEQUANTIZERS)


def dequantize(raw: np.ndarray, qtype: GGMLType | int, what: str = "tensor") -> np.ndarray:
    """Float32 values of whole blocks of ``qtype`` stored in ``raw`` (bytes)."""
    qtype = GGMLType(qtype)
    fn = DEQUANTIZERS.get(qtype)
    if fn is None:
        raise UnsupportedQuantError(
            f"{what}: type {qtype.name} cannot be dequantized (supported: "
            f"{', '.join(t.name for t in DEQUANTIZERS)})"
        )
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raw = raw.view(np.uint8)
    fmt = FORMATS[qtype]
    if raw.size % fmt.block_bytes:
        raise ValueError(f"{what}: {raw.size} bytes is not a whole number of {qtype.name} blocks")
    return fn(raw)
