"""Functional execution of NPU schedules in numpy, with the NPU's numerics.

Each function runs the tiling of its :class:`~workbench.backends.npu.schedule.Schedule`: the reduction
dimension in the schedule's steps (that is where accumulation order and precision matter), all tiles of a
step at once (tile rows are independent, so computing them together gives the same values). Buffers are
checked against the array's memories first (:meth:`Schedule.check`).

- bf16: inputs rounded to bfloat16, products accumulated in fp32, outputs fp32 (matmuls, attention) or
  rounded to bf16 (norms), as the kernels write them; RMSNorm step by step as ``mlir/kernels/rmsnorm.cc``
  computes it
- int8: int8 x int8 products accumulated exactly in int32, shift-round-saturated to int16 with a static
  shift, then scaled back by the row scales

A schedule may be for more rows, queries or keys than given (designs are built for padded shapes, see
:mod:`workbench.backends.npu.designs`): rows are independent and padding keys are masked, so the result
is that of the given ones. The host steps around the kernels (int8 dequantization, the merge of attention
splits) are :mod:`workbench.backends.npu.hostside`'s, which the XRT path runs too.
"""

from __future__ import annotations

import numpy as np

from .. import hostside
from ..arch import AieArray
from ..schedule import NORM_LANES, Schedule
from .numerics import F32, quantize_rows_i8, srs, to_bf16


def _steps(schedule: Schedule, K: int) -> range:
    k = schedule.tile["k"]
    if K % k:
        raise ValueError(f"{schedule.op}: K={K} is not a multiple of the schedule's k={k}")
    return range(0, K, k)


def matmul_bf16(schedule: Schedule, array: AieArray, x: np.ndarray, w_bf16: np.ndarray) -> np.ndarray:
    """x (M x K) @ w.T (w: N x K, already bf16 values) for a gemm or gemv schedule."""
    schedule.check(array)
    xb = to_bf16(x)
    k = schedule.tile["k"]
    acc = np.zeros((x.shape[0], w_bf16.shape[0]), F32)
    for k0 in _steps(schedule, x.shape[1]):
        acc += xb[:, k0 : k0 + k] @ w_bf16[:, k0 : k0 + k].T
    return acc


def matmul_i8(
    schedule: Schedule, array: AieArray, x: np.ndarray, wq: np.ndarray, w_scale: np.ndarray, shift: int
) -> np.ndarray:
    """Int8 GEMM/GEMV: activations quantized per row to int8, :func:`matmul_i8_acc`, dequantized with the
    activation and weight row scales. ``wq`` holds the int8 weights as float32 (exact)."""
    xq, sx = quantize_rows_i8(x)
    return hostside.dequantize_i16(matmul_i8_acc(schedule, array, xq, wq, shift), shift, sx, w_scale)


def matmul_i8_acc(
    schedule: Schedule, array: AieArray, xq: np.ndarray, wq: np.ndarray, shift: int
) -> np.ndarray:
    """What the int8 design computes (``mlir/kernels/mm_i8.cc``): int8 ``xq`` (M x K) times ``wq`` (N x K,
    int8 values) accumulated in int32 over the k-steps, shift-round-saturated to int16 by ``shift`` once
    (ties to even, saturating). Each k-step (k <= 1024: |partial| < 2**24) is exact in fp32 BLAS."""
    schedule.check(array)
    if schedule.tile["k"] > 1024:
        raise ValueError("int8 emulation needs k <= 1024 (exact fp32 partial sums)")
    xf, wf = xq.astype(F32), wq.astype(F32)
    k = schedule.tile["k"]
    acc = np.zeros((xq.shape[0], wq.shape[0]), np.int64)
    for k0 in _steps(schedule, xq.shape[1]):
        acc += (xf[:, k0 : k0 + k] @ wf[:, k0 : k0 + k].T).astype(np.int64)
    if np.abs(acc).max(initial=0) >= 2**31:
        raise OverflowError("int32 accumulator overflow in the int8 GEMM")
    return srs(acc, shift)


def rmsnorm(
    schedule: Schedule, array: AieArray, x: np.ndarray, w_bf16: np.ndarray, eps: float, group: int | None
) -> np.ndarray:
    """RMSNorm over rows (or groups of ``group`` values) step by step as ``mlir/kernels/rmsnorm.cc`` computes
    each row of the schedule: bf16 in; sum of squares in :data:`NORM_LANES` fp32 lanes (each lane adding its
    values in order, bf16 squares exact), the lanes added pairwise (``aie::reduce_add``, modeled as a halving
    tree); ``inv = 1 / sqrt(sum * (1 / L) + eps)`` in fp32 (``aie::invsqrt`` modeled as exact); ``x * hi +
    x * lo`` with ``inv`` split into two bf16 scalars, accumulated in fp32 and rounded to bf16; times the bf16
    weight, rounded to bf16."""
    schedule.check(array)
    length = schedule.problem["L"]
    g = group or x.shape[-1]
    if g != length or x.size > schedule.problem["R"] * length:
        raise ValueError(
            f"rmsnorm: schedule is for {schedule.problem['R']} rows of {length}, got {x.size // g} rows of {g}"
        )
    xs = to_bf16(x).reshape(-1, length // NORM_LANES, NORM_LANES)
    squares = xs * xs  # exact: bf16 x bf16 fits fp32
    lanes = np.zeros((xs.shape[0], NORM_LANES), F32)
    for c in range(xs.shape[1]):
        lanes += squares[:, c]
    while lanes.shape[1] > 1:
        half = lanes.shape[1] // 2
        lanes = lanes[:, :half] + lanes[:, half:]
    mean = lanes * (F32(1.0) / F32(length)) + F32(eps)
    inv = F32(1.0) / np.sqrt(mean)
    hi = to_bf16(inv)
    lo = to_bf16(inv - hi)
    normed = to_bf16(xs * hi[:, :, None] + xs * lo[:, :, None])
    return to_bf16(normed * w_bf16.reshape(1, -1, NORM_LANES)).reshape(x.shape)


def attention(
    schedule: Schedule,
    array: AieArray,
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    q_pos: np.ndarray,
    k_pos: np.ndarray,
    scale: float,
) -> np.ndarray:
    """Causal (sliding-window) GQA attention as the schedule tiles it: :func:`attention_states`, then the
    splits merged by log-sum-exp on the host (:func:`~workbench.backends.npu.hostside.merge_splits`).
    Returns (T, n_heads * head_dim) fp32."""
    out = hostside.merge_splits(*attention_states(schedule, array, q, keys, values, q_pos, k_pos, scale))
    return out.reshape(q.shape[0], -1).astype(F32)


def attention_states(
    schedule: Schedule,
    array: AieArray,
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    q_pos: np.ndarray,
    k_pos: np.ndarray,
    scale: float,
) -> tuple[list, list, list]:
    """What the attention design's cores compute, as ``mlir/kernels/attention.cc`` does: split ``i`` takes
    keys ``[i * chunks * kv_chunk, ...)`` (:func:`~workbench.backends.npu.hostside.key_splits`), in chunks
    of ``kv_chunk`` keys with an online softmax in fp32 (scores from bf16 q and K, probabilities rounded to
    bf16 for P @ V), keys masked by position (``k <= q`` and, with the schedule's ``window``, ``k > q -
    window``) inside each chunk. Returns per split the running max and sum ``(T, n_kv, group)`` and the
    unnormalized output ``(T, n_kv, group, head_dim)``."""
    schedule.check(array)
    p = schedule.problem
    nkv, d = p["n_kv_heads"], p["head_dim"]
    g = p["n_heads"] // nkv
    t, s, window = q.shape[0], keys.shape[0], p["window"]
    if t > p["T"] or s > p["S"]:
        raise ValueError(f"attention: schedule is for T={p['T']} S={p['S']}, got T={t} S={s}")
    qh = to_bf16(q).reshape(t, nkv, g, d)
    kh = to_bf16(keys).reshape(s, nkv, d)
    vh = to_bf16(values).reshape(s, nkv, d)
    visible = k_pos[None, :] <= q_pos[:, None]
    if window:
        visible &= k_pos[None, :] > q_pos[:, None] - window
    chunk = schedule.tile["kv_chunk"]
    ms, ls, accs = [], [], []
    for split in hostside.key_splits(schedule, s):
        m = np.full((t, nkv, g), -np.inf, F32)
        l_sum = np.zeros((t, nkv, g), F32)
        acc = np.zeros((t, nkv, g, d), F32)
        for c0 in range(split.start, split.stop, chunk):
            c1 = min(split.stop, c0 + chunk)
            sc = np.einsum("tkgd,skd->tkgs", qh, kh[c0:c1], optimize=True) * F32(scale)
            sc = np.where(visible[:, None, None, c0:c1], sc, F32(-np.inf))
            m_new = np.maximum(m, sc.max(axis=-1))
            base = np.where(np.isfinite(m_new), m_new, F32(0.0))
            alpha = np.exp(m - base)
            pr = np.exp(sc - base[..., None])
            l_sum = l_sum * alpha + pr.sum(axis=-1, dtype=F32)
            acc = acc * alpha[..., None] + np.einsum("tkgs,skd->tkgd", to_bf16(pr), vh[c0:c1], optimize=True)
            m = m_new
        ms.append(m)
        ls.append(l_sum)
        accs.append(acc)
    return ms, ls, accs
