"""Lossless conversions between GGUF block formats, done at load time where a backend computes one format
faster than another.

Q5_0 -> Q8_0: a Q5_0 block holds an fp16 scale ``d`` and 32 five-bit codes ``q`` (``w = d * (q - 16)``); a
Q8_0 block holds an fp16 scale and 32 int8 values (``w = d * v``). With the same ``d`` and ``v = q - 16``
(-16..15) the weights are identical, in 34 bytes instead of 22.
"""

from __future__ import annotations

import numpy as np

from .dequant import _q5_bits

Q5_0_BYTES, Q8_0_BYTES = 22, 34


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
