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

Q8_0, Q5_0, Q4_K -> Q8_0_R16, Q5_0_R16, Q4_K_R16 (layouts of the cpu backend): as many bytes, each 16 rows
interleaved so that one 512-bit vector holds a pair of values of 16 rows, and the kernel's 16 lanes are 16
rows (one ``vpdpwssd`` per 32 values, one conversion and FMA per 32-value block of 16 rows). The array keeps its shape (rows,
bytes per row); 16 rows at a time, block ``b`` of the group (``16 x`` the block's bytes) holds:

* Q8_0_R16 (544 bytes): ``[16 fp16 scales, row order: 32][16 pair slots of 32 bytes]``, slot ``k`` holding
  values ``2k, 2k + 1`` of rows 0..15 (two int8 per row);
* Q5_0_R16 (352 bytes): ``[16 fp16 scales: 32][16 fifth-bit words: 64][8 nibble slots of 32 bytes]``: word
  ``k`` holds in bits ``2r, 2r + 1`` the fifth bits of values ``2k, 2k + 1`` of row ``r``; nibble slot ``p``
  holds bytes ``2p, 2p + 1`` of each row's 16 nibble bytes, so its low nibbles are values ``2p, 2p + 1`` and
  its high ones values ``16 + 2p, 17 + 2p``;
* Q4_K_R16 (a superblock, 2304 bytes): ``[16 fp16 d: 32][16 fp16 dmin: 32][12 scale-byte planes of 16:
  192][64 nibble slots of 32 bytes]``: plane ``i`` holds scale byte ``i`` of each row; slot ``16c + k`` holds
  bytes ``32c + 2k, 32c + 2k + 1`` of each row's 128 nibble bytes: values ``2k, 2k + 1`` of sub-block ``2c``
  in its low nibbles, of sub-block ``2c + 1`` in its high ones.
"""

from __future__ import annotations

import numpy as np

from .dequant import q5_bits, q6_k_codes

Q5_0_BYTES, Q8_0_BYTES = 22, 34
Q6_K_BYTES, Q6_K_I8_BYTES = 210, 274
Q4_K_BYTES = 144
Q5_0_X4_BYTES, Q5_0_X4_VALUES = 88, 128
ROW_GROUP = 16  # rows interleaved by the _R16 layouts


def q5_0_to_q8_0(raw: np.ndarray) -> np.ndarray:
    """Q5_0 rows (rows, blocks * 22 bytes) as Q8_0 rows (rows, blocks * 34 bytes) of the same weights."""
    if raw.ndim != 2 or raw.shape[1] % Q5_0_BYTES:
        raise ValueError(f"Q5_0 rows must be (rows, a multiple of {Q5_0_BYTES} bytes), got {raw.shape}")
    b = np.ascontiguousarray(raw).reshape(-1, Q5_0_BYTES)
    qs = b[:, 6:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1) | (q5_bits(b[:, 2:6]) << 4)
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


def _row_groups(raw: np.ndarray, block_bytes: int, name: str) -> np.ndarray:
    """``raw`` (rows, blocks * block_bytes) as (groups, 16 rows, blocks, block_bytes), checked."""
    if raw.ndim != 2 or raw.shape[1] % block_bytes or raw.shape[0] % ROW_GROUP:
        raise ValueError(
            f"{name} rows to interleave must be (a multiple of {ROW_GROUP} rows, a multiple of {block_bytes} "
            f"bytes), got {raw.shape}"
        )
    return np.ascontiguousarray(raw).reshape(-1, ROW_GROUP, raw.shape[1] // block_bytes, block_bytes)


def _interleaved(g: np.ndarray, start: int, stop: int, granule: int) -> np.ndarray:
    """Bytes ``start:stop`` of each row's block of the row groups ``g`` (:func:`_row_groups`), in granules of
    ``granule`` bytes (1, 2 or 4; ``start`` and ``stop`` multiples of it), granule by granule and within one the
    16 rows: (groups, blocks, 16 * (stop - start)).

    Moved as whole granules (a uint16 view for 2 bytes), not byte by byte: the cpu backend repacks every weight
    each time it starts (figures: docs/backend-cpu.md)."""
    if start % granule or stop % granule:
        raise ValueError(f"bytes {start}:{stop} are not whole granules of {granule}")
    n_g, _, nb, _ = g.shape
    parts = g[:, :, :, start:stop].view({1: np.uint8, 2: np.uint16, 4: np.uint32}[granule])
    return np.ascontiguousarray(parts.transpose(0, 2, 3, 1)).reshape(n_g, nb, -1).view(np.uint8)


def q8_0_to_r16(raw: np.ndarray) -> np.ndarray:
    """Q8_0 rows (a multiple of 16 rows, blocks * 34 bytes) as Q8_0_R16 rows: the same shape and bytes, moved
    (the scales, then the values, each in 2-byte granules of the 16 rows: one interleave of the whole block)."""
    return _interleaved(_row_groups(raw, Q8_0_BYTES, "Q8_0"), 0, Q8_0_BYTES, 2).reshape(raw.shape)


def q5_0_to_r16(raw: np.ndarray) -> np.ndarray:
    """Q5_0 rows (a multiple of 16 rows, blocks * 22 bytes) as Q5_0_R16 rows of the same shape (the fifth bits
    regrouped by value pair)."""
    g = _row_groups(raw, Q5_0_BYTES, "Q5_0")
    n_g, _, nb, _ = g.shape
    out = np.empty((n_g, nb, ROW_GROUP * Q5_0_BYTES), np.uint8)
    out[:, :, 0:32] = _interleaved(g, 0, 2, 2)
    bits = q5_bits(g[:, :, :, 2:6].reshape(-1, 4)).reshape(n_g, ROW_GROUP, nb, 16, 2)  # (.., slot, 2 values)
    bits = bits.transpose(0, 2, 3, 1, 4).reshape(n_g, nb, 16, 32).astype(np.uint32)  # bit 2r + j of word k
    words = (bits << np.arange(32, dtype=np.uint32)).sum(axis=3, dtype=np.uint32)
    out[:, :, 32:96] = words.astype("<u4").view(np.uint8).reshape(n_g, nb, 64)
    out[:, :, 96:] = _interleaved(g, 6, 22, 2)
    return out.reshape(raw.shape)


def q4_k_to_r16(raw: np.ndarray) -> np.ndarray:
    """Q4_K rows (a multiple of 16 rows, superblocks * 144 bytes) as Q4_K_R16 rows: the same shape and bytes,
    moved."""
    g = _row_groups(raw, Q4_K_BYTES, "Q4_K")
    fields = (
        _interleaved(g, 0, 4, 2),  # d, then dmin
        _interleaved(g, 4, 16, 1),
        _interleaved(g, 16, 144, 2),
    )
    return np.concatenate(fields, axis=2).reshape(raw.shape)
