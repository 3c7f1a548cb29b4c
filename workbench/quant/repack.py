"""Lossless conversions between GGUF block formats, done at load time where a backend computes one format
faster than another.

Q5_0 -> Q8_0: a Q5_0 block holds an fp16 scale ``d`` and 32 five-bit codes ``q`` (``w = d * (q - 16)``); a
Q8_0 block holds an fp16 scale and 32 int8 values (``w = d * v``). With the same ``d`` and ``v = q - 16``
(-16..15) the weights are identical, in 34 bytes instead of 22.

Q6_K -> Q6_K_I8 (a layout of the cpu backend, not a GGUF type): a Q6_K superblock holds 256 six-bit codes
split into low-nibble and high-bit planes, 16 int8 scales and an fp16 ``d`` (``w = d * scale * (q - 32)``,
one scale per 16 values). Q6_K_I8 keeps ``d`` and the scales and stores the codes ``q - 32`` as int8 in
value order: ``[d: 2 bytes][scales: 16][codes: 256]``, 274 bytes instead of 210, the same weights.

Q5_0 -> Q5_0_X4 (a layout of the cpu backend): four Q5_0 blocks (128 values) in 88 bytes, the same bytes
regrouped: ``[4 fp16 scales: 8][4 fifth-bit words: 16][2 x 32 nibble bytes]``, where nibble byte ``j`` of a
pair of blocks holds value ``j`` of the first block in its low nibble and value ``j`` of the second in its
high one (as Q4_K pairs its sub-blocks). A kernel widens 32 bytes once and masks or shifts out two whole
blocks in value order, where a GGUF Q5_0 block splits its values 0-15 and 16-31 over the nibbles of 16 bytes.
"""

from __future__ import annotations

import numpy as np

from .dequant import _q5_bits, q6_k_codes

Q5_0_BYTES, Q8_0_BYTES = 22, 34
Q6_K_BYTES, Q6_K_I8_BYTES = 210, 274
Q5_0_X4_BYTES, Q5_0_X4_VALUES = 88, 128


def q5_0_to_q8_0(raw: np.ndarray) -> np.ndarray:
    """Q5_0 rows (rows, blocks * 22 bytes) as Q8_0 rows (rows, blocks * 34 bytes) of the same weights."""
    if raw.ndim != 2 or raw.shape[1] % Q5_0_BYTES:
        raise ValueError(f"Q5_0 rows must be (rows, a multiple of {Q5_0_BYTES} bytes), got {raw.shape}")
    b = np.ascontiguousarray(raw).reshape(-1, Q5_0_BYTES)
    qs = b[:, 6:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1) | (_q5_bits(b[:, 2:6]) << 4)
    out = np.empty((len(b), Q8_0_BYTES), np.uint8)
    out[:, :2] = b[:, :2]
    out[:, 2:] = (q.astype(np.int8) - np.int8(16)).view(np.uint8)
    return out.reshape(raw.shape[0], -1)


def q6_k_to_i8(raw: np.ndarray) -> np.ndarray:
    """Q6_K rows (rows, superblocks * 210 bytes) as Q6_K_I8 rows (rows, superblocks * 274 bytes)."""
    if raw.ndim != 2 or raw.shape[1] % Q6_K_BYTES:
        raise ValueError(f"Q6_K rows must be (rows, a multiple of {Q6_K_BYTES} bytes), got {raw.shape}")
    b = np.ascontiguousarray(raw).reshape(-1, Q6_K_BYTES)
    out = np.empty((len(b), Q6_K_I8_BYTES), np.uint8)
    out[:, 0:2] = b[:, 208:210]
    out[:, 2:18] = b[:, 192:208]
    out[:, 18:] = q6_k_codes(b).view(np.uint8)
    return out.reshape(raw.shape[0], -1)


def q5_0_to_x4(raw: np.ndarray) -> np.ndarray:
    """Q5_0 rows (rows, blocks * 22 bytes; blocks a multiple of 4) as Q5_0_X4 rows (rows, blocks / 4 * 88)."""
    if raw.ndim != 2 or raw.shape[1] % (4 * Q5_0_BYTES):
        raise ValueError(f"Q5_0 rows must be (rows, a multiple of {4 * Q5_0_BYTES} bytes), got {raw.shape}")
    b = np.ascontiguousarray(raw).reshape(-1, 4, Q5_0_BYTES)
    qs = b[:, :, 6:]
    nib = np.concatenate([qs & 0x0F, qs >> 4], axis=2)  # (units, 4 blocks, 32 values)
    out = np.empty((len(b), Q5_0_X4_BYTES), np.uint8)
    out[:, 0:8] = b[:, :, 0:2].reshape(-1, 8)
    out[:, 8:24] = b[:, :, 2:6].reshape(-1, 16)
    out[:, 24:] = (nib[:, 0::2] | (nib[:, 1::2] << 4)).reshape(-1, 64)
    return out.reshape(raw.shape[0], -1)
