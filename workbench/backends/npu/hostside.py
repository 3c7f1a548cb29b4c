"""The host side of the NPU designs: the buffer layouts their runtime sequences read and write, and the
host steps around the kernels.

Each ``pack_*`` writes what one host buffer of a design's runtime sequence (``rt.sequence(...)`` in
:mod:`workbench.backends.npu.iron`) must hold, in the order its fills stream it; each ``unpack_*`` reads an
output buffer back. bf16 travels as its 16 bits (``uint16``). The host steps the emulator runs too live
here once: int8 activations in, int16 results dequantized (:func:`dequantize_i16`), and the merge of the
attention design's per-split states (:func:`merge_splits`).

Layouts (``M``/``N`` padded as the schedule pads them; padding is zeros unless said otherwise):

- GEMM: ``A`` the activations, ``M_pad x K`` row-major; ``B`` the weight (``N x K``) pretiled: column ``c``
  of the array takes the contiguous slice of its ``n``-row blocks ``g * columns + c``, each as its ``K / k``
  tiles of ``n x k`` row-major (int8: in ``mm_i8.cc``'s MAC-tile order, each followed by the weight's int32
  SRS shift; :func:`pack_gemm_weight`); ``C`` ``M_pad x N_pad`` row-major.
- GEMV: ``W`` pretiled the same way with blocks of ``m * rows`` rows (:func:`pack_gemv_weight`); ``X`` the
  ``K`` values; ``Y`` ``N_pad`` fp32.
- RMSNorm: ``X`` and ``Y`` the rows padded to ``columns * calls * rows * rows_per_call``; ``W`` the weight.
- Attention: ``Q`` one object per (KV head, query tile): the tile's queries token-major (the group's heads
  per token) then their int32 positions (padding -1); ``KV`` per (KV head, key split) its chunks, each the
  chunk's keys, their int32 positions (padding ``INT32_MAX``) and its values; ``Out`` per (KV head, query
  tile, split) the state ``rows x (head_dim + 2)`` fp32: unnormalized output, running max, sum.
"""

from __future__ import annotations

import numpy as np

from .emulator.numerics import F32, to_bf16
from .schedule import SHIFT_BYTES, Schedule

INT32_MAX = 2**31 - 1


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to bfloat16, as its 16 bits."""
    return np.ascontiguousarray((to_bf16(x).view(np.uint32) >> 16).astype(np.uint16))


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits back to float32 values."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(F32)


def _pad_rows(x: np.ndarray, rows: int) -> np.ndarray:
    if x.shape[0] > rows:
        raise ValueError(f"{x.shape[0]} rows do not fit a design for {rows}")
    out = np.zeros((rows, *x.shape[1:]), x.dtype)
    out[: x.shape[0]] = x
    return out


def _column_tiles(w: np.ndarray, n_pad: int, block: int, columns: int, k: int) -> np.ndarray:
    """``w`` (N x K) padded to ``n_pad`` rows, as column ``c`` streams it: its blocks ``g * columns + c`` of
    ``block`` rows, each as ``K / k`` row-major tiles of ``block x k``."""
    K = w.shape[1]
    if K % k:
        raise ValueError(f"K={K} is not a multiple of the tile's k={k}")
    tiles = _pad_rows(w, n_pad).reshape(n_pad // (block * columns), columns, block, K // k, k)
    return np.ascontiguousarray(tiles.transpose(1, 0, 3, 2, 4)).reshape(-1)


def pack_gemm_weight(s: Schedule, w: np.ndarray, shift: int | None = None) -> np.ndarray:
    """A GEMM's ``B`` buffer from the weight ``w`` (N x K, in the device dtype). int8 (``shift``: the
    weight's SRS shift, required): each n x k tile in ``mlir/kernels/mm_i8.cc``'s order (blocks of the MAC
    tile's s x t, row-major, k-blocks of an n-block in order) followed by ``shift`` as int32."""
    t = s.tile
    tiles = _column_tiles(w, t["N_pad"], t["n"], s.columns, t["k"])
    if s.dtype_in != "i8":
        if shift is not None:
            raise ValueError(f"only int8 GEMMs take an SRS shift, not {s.dtype_in}")
        return tiles
    if shift is None or not 0 <= shift < 32:
        raise ValueError(f"an int8 GEMM's B needs the weight's SRS shift (0..31), got {shift}")
    n, k, st, tt = t["n"], t["k"], t["s"], t["t"]
    blocks = tiles.reshape(-1, n // tt, tt, k // st, st).transpose(0, 1, 3, 4, 2).reshape(-1, n * k)
    tail = np.broadcast_to(np.array([shift], "<i4").view(np.int8), (blocks.shape[0], SHIFT_BYTES))
    return np.ascontiguousarray(np.concatenate([blocks.astype(np.int8), tail], axis=1)).reshape(-1)


def pack_gemv_weight(s: Schedule, w: np.ndarray) -> np.ndarray:
    """A GEMV's ``W`` buffer from the weight ``w`` (N x K, in the device dtype)."""
    return _column_tiles(w, s.tile["N_pad"], s.tile["m"] * s.rows, s.columns, s.tile["k"])


def pack_gemm_rows(s: Schedule, x: np.ndarray) -> np.ndarray:
    """A GEMM's ``A`` buffer: the activation rows (device dtype) padded to ``M_pad``."""
    return _pad_rows(x, s.tile["M_pad"]).reshape(-1)


def unpack_matmul(s: Schedule, out: np.ndarray, rows: int) -> np.ndarray:
    """The ``rows x N`` result from a GEMM's ``C`` (``M_pad x N_pad``) or a GEMV's ``Y`` (``N_pad``)."""
    n_pad = s.tile["N_pad"]
    return out.reshape(-1, n_pad)[:rows, : s.problem["N"]]


def dequantize_i16(c16: np.ndarray, shift: int, x_scale: np.ndarray, w_scale: np.ndarray) -> np.ndarray:
    """An int8 GEMM's int16 results (shift-round-saturated by ``shift``) back to fp32 with the activation
    row scales and the weight row scales."""
    out = c16.astype(F32) * F32(2.0**shift)
    return out * x_scale[:, None].astype(F32) * w_scale[None, :].astype(F32)


def rowwise_rows(s: Schedule) -> int:
    """Rows a row-wise design's ``X``/``Y`` buffers hold (the schedule's rows padded to whole calls)."""
    return s.columns * s.calls_per_core * s.rows * s.tile["rows_per_call"]


def pack_rows(s: Schedule, x: np.ndarray) -> np.ndarray:
    """A row-wise design's ``X`` buffer (bf16 bits) from rows of ``L`` values."""
    return bf16_bits(_pad_rows(x.reshape(-1, s.problem["L"]), rowwise_rows(s))).reshape(-1)


def unpack_rows(s: Schedule, y: np.ndarray, rows: int) -> np.ndarray:
    """The first ``rows`` rows of a row-wise design's ``Y`` buffer (bf16 bits) as fp32 values."""
    return from_bf16_bits(y.reshape(-1, s.problem["L"])[:rows])


def _attention_dims(s: Schedule) -> tuple[int, int, int, int, int, int, int]:
    p, t = s.problem, s.tile
    nkv = p["n_kv_heads"]
    q_tiles = -(-p["T"] // t["q_tile"])
    return nkv, p["n_heads"] // nkv, p["head_dim"], t["q_tile"], q_tiles, t["splits"], t["kv_chunk"]


def _positions(pos: np.ndarray, n: int, pad: int) -> np.ndarray:
    out = np.full(n, pad, np.int32)
    out[: len(pos)] = pos
    return out


def pack_attention_q(s: Schedule, q: np.ndarray, q_pos: np.ndarray) -> np.ndarray:
    """The attention design's ``Q`` buffer from queries ``q`` (T x n_heads * head_dim) at ``q_pos``."""
    nkv, group, d, q_tile, q_tiles, _, _ = _attention_dims(s)
    qb = bf16_bits(_pad_rows(q, q_tiles * q_tile)).reshape(q_tiles, q_tile, nkv, group * d)
    pos = _positions(q_pos, q_tiles * q_tile, -1).reshape(q_tiles, q_tile)
    data = qb.transpose(2, 0, 1, 3).reshape(nkv, q_tiles, -1)
    pos_slots = np.broadcast_to(pos.view(np.uint16).reshape(1, q_tiles, -1), (nkv, q_tiles, 2 * q_tile))
    return np.concatenate([data, pos_slots], axis=2).reshape(-1)


def pack_attention_kv(s: Schedule, keys: np.ndarray, values: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
    """The attention design's ``KV`` buffer from ``keys``/``values`` (S x n_kv_heads * head_dim) at
    ``k_pos``: split ``i`` takes keys ``[i * chunks * kv_chunk, ...)``, as :func:`key_splits` says."""
    nkv, _, d, _, _, splits, chunk = _attention_dims(s)
    chunks = s.notes["chunks_per_item"]
    slots = splits * chunks * chunk
    kb = bf16_bits(_pad_rows(keys, slots)).reshape(splits, chunks, chunk, nkv, d).transpose(3, 0, 1, 2, 4)
    vb = bf16_bits(_pad_rows(values, slots)).reshape(splits, chunks, chunk, nkv, d).transpose(3, 0, 1, 2, 4)
    pos = _positions(k_pos, slots, INT32_MAX).view(np.uint16).reshape(1, splits, chunks, 2 * chunk)
    shape = (nkv, splits, chunks, -1)
    parts = [kb.reshape(shape), np.broadcast_to(pos, (nkv, splits, chunks, 2 * chunk)), vb.reshape(shape)]
    return np.concatenate(parts, axis=3).reshape(-1)


def key_splits(s: Schedule, n_keys: int) -> list[range]:
    """The key index ranges of the attention design's splits (the last ones may be short or empty)."""
    per_split = s.notes["chunks_per_item"] * s.tile["kv_chunk"]
    return [range(i * per_split, min(n_keys, (i + 1) * per_split)) for i in range(s.tile["splits"])]


def attention_out_size(s: Schedule) -> int:
    """fp32 values of the attention design's ``Out`` buffer."""
    nkv, group, d, q_tile, q_tiles, splits, _ = _attention_dims(s)
    return nkv * q_tiles * splits * q_tile * group * (d + 2)


def unpack_attention_states(s: Schedule, out: np.ndarray, t: int) -> tuple[list, list, list]:
    """Per split: running max ``(t, n_kv, group)``, sum (same) and unnormalized output ``(t, n_kv, group,
    head_dim)`` of the first ``t`` queries, from the design's ``Out`` buffer."""
    nkv, group, d, q_tile, q_tiles, splits, _ = _attention_dims(s)
    st = out.reshape(nkv, q_tiles, splits, q_tile, group, d + 2).transpose(2, 1, 3, 0, 4, 5)
    st = st.reshape(splits, q_tiles * q_tile, nkv, group, d + 2)[:, :t]
    return list(st[..., d]), list(st[..., d + 1]), list(st[..., :d])


def merge_splits(ms: list, ls: list, accs: list) -> np.ndarray:
    """The attention output from the splits' states (log-sum-exp merge): ``(t, n_kv, group, head_dim)``."""
    m_all = np.max(ms, axis=0)
    base = np.where(np.isfinite(m_all), m_all, F32(0.0))
    num = np.zeros_like(accs[0], dtype=F32)
    den = np.zeros_like(ls[0], dtype=F32)
    for m, l_sum, acc in zip(ms, ls, accs):
        wgt = np.exp(m - base)
        num += acc * wgt[..., None]
        den += l_sum * wgt
    return num / den[..., None]
