"""``cpu`` matvec of compressed N:M sparse weights (:mod:`workbench.quant.nm_store`): each row reads only its
kept values (fp32, fp16, bf16 or int8 per channel) and their 4-bit positions, and multiplies them with the
activations at those positions, so the pruned weights cost neither memory traffic nor multiplications.

2:4 has a vector kernel (:func:`make_dot_2_4`). A group of four inputs keeps one of 6 position pairs, so a
pair of groups keeps one of 36 combinations: per activation row a table holds, for every pair of groups and
every combination, the four activations it keeps (:func:`pair_table`, built once per matvec and shared by
all rows). Each row stores one code byte per pair of groups (repacked at load from the stored 4-bit
positions); the kernel loads the table entry the code selects and multiplies it with four stored values in
one FMA: no gathers, no permutes.
Other patterns, and rows whose groups do not pair up, run a scalar loop.
Prefill (many rows) dequantizes rows into float32 tiles for BLAS like every planar format: the weight is a
:class:`~workbench.backends.numba_cpu.qformats.NMWeight`, a planar weight whose matvec runs these kernels.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ...numba_jit import numba
from .llvm_ir import F32, FAST, I8, I16, I32, I64, as_ptr, emit_prefetch, hsum, ptr, vt

njit, prange = numba.njit, numba.prange
# the values plane's dtype as the kernels see it selects the decoder at compile time: float32, int8 (times
# the row scale), fp16 bits as uint16, bf16 bits as int16
VALUE_VIEW = {"fp32": np.float32, "int8": np.int8, "fp16": np.uint16, "bf16": np.int16}


def _to_float(b: ir.IRBuilder, raw: ir.Value, kind: str) -> ir.Value:
    """Stored ``kind`` values (a scalar or a vector) as float32: fp32 as is, int8 converted, fp16 / bf16 bits
    widened."""
    lanes = raw.type.count if isinstance(raw.type, ir.VectorType) else 0

    def of(t: ir.Type) -> ir.Type:
        return vt(t, lanes) if lanes else t

    if kind == "int8":
        return b.sitofp(raw, of(F32))
    if kind == "fp16":
        return b.fpext(b.bitcast(raw, of(ir.HalfType())), of(F32))
    if kind == "bf16":
        sixteen = ir.Constant(of(I32), [16] * lanes if lanes else 16)
        return b.bitcast(b.shl(b.zext(raw, of(I32)), sixteen), of(F32))
    return raw


_KIND_OF_TYPE = {types.float32: "fp32", types.int8: "int8", types.uint16: "fp16", types.int16: "bf16"}


@intrinsic
def _widen(typingctx, v):
    """A stored value as float32, by its type (:data:`VALUE_VIEW`): float32, int8, uint16 fp16 bits, int16 bf16 bits."""
    if v not in _KIND_OF_TYPE:
        return None

    def codegen(context, b, signature, args):
        return _to_float(b, args[0], _KIND_OF_TYPE[v])

    return types.float32(v), codegen


UNROLL = 4  # group pairs per loop iteration (their code bytes in one 32-bit load; one accumulator each)
PREFETCH_AHEAD = 1024  # bytes of the value stream prefetched ahead
VALUE_BYTES = {kind: np.dtype(t).itemsize for kind, t in VALUE_VIEW.items()}
# the 2:4 position pairs of a group, numbered; a pair of groups keeping combos (a, b) has code a + 6 b
COMBOS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))
PAIR_COMBOS = len(COMBOS) ** 2
_COMBO_OF = {pair: c for c, pair in enumerate(COMBOS)}


def _four_values(b: ir.IRBuilder, vp: ir.Value, pair: ir.Value, kind: str) -> ir.Value:
    """The four stored values of group pair ``pair`` as <4 x float>."""
    t = {"fp32": F32, "int8": I8}.get(kind, I16)
    addr = b.gep(vp, [b.mul(pair, ir.Constant(I64, 4 * VALUE_BYTES[kind]))])
    return _to_float(b, b.load(b.bitcast(addr, ptr(vt(t, 4))), align=1), kind)


def make_dot_2_4(kind: str):
    """``dot(v_addr, code_addr, table_addr, n_pairs) -> float32``: one 2:4 row of ``kind`` values against
    one activation row given as its pair table (:func:`pair_table`)."""

    @intrinsic
    def dot(typingctx, v, c, tab, n):
        sig = types.float32(types.intp, types.intp, types.intp, types.intp)

        def codegen(context, b, signature, args):
            v_a, c_a, t_a, n_pairs = args
            f4, i64 = vt(F32, 4), (lambda k: ir.Constant(I64, k))
            vp, cp, tp = as_ptr(b, v_a, I8), as_ptr(b, c_a, I8), as_ptr(b, t_a, f4)
            acc = [cgutils.alloca_once_value(b, ir.Constant(f4, [0.0] * 4)) for _ in range(UNROLL)]

            def pair(p: ir.Value, code: ir.Value, slot: int) -> None:
                """acc += the four values of pair ``p`` times the kept activations of its two groups."""
                entry = b.add(b.mul(p, i64(PAIR_COMBOS)), b.zext(code, I64))
                kept = b.load(b.gep(tp, [entry]), align=16)
                term = b.fmul(_four_values(b, vp, p, kind), kept, flags=FAST)
                b.store(b.fadd(b.load(acc[slot]), term, flags=FAST), acc[slot])

            n_iter = b.udiv(n_pairs, i64(UNROLL))
            with cgutils.for_range(b, n_iter) as loop:
                p0 = b.mul(loop.index, i64(UNROLL))
                emit_prefetch(b, b.gep(vp, [b.mul(p0, i64(4 * VALUE_BYTES[kind]))]), PREFETCH_AHEAD)
                word = b.load(b.bitcast(b.gep(cp, [p0]), ptr(I32)), align=1)
                for k in range(UNROLL):
                    pair(b.add(p0, i64(k)), b.trunc(b.lshr(word, ir.Constant(I32, 8 * k)), I8), k)
            with cgutils.for_range_slice(b, b.mul(n_iter, i64(UNROLL)), n_pairs, i64(1)) as (p, _):
                pair(p, b.load(b.gep(cp, [p])), 0)
            total = b.load(acc[0])
            for a in acc[1:]:
                total = b.fadd(total, b.load(a), flags=FAST)
            return hsum(b, total)

        return sig, codegen

    return dot


F32_V, F16_V, BF16_V, I8_V = 0, 1, 2, 3
KIND_CODE = {"fp32": F32_V, "fp16": F16_V, "bf16": BF16_V, "int8": I8_V}
dot_f32, dot_f16, dot_bf16, dot_i8 = (make_dot_2_4(k) for k in KIND_CODE)
# table column of each lane of each pair code: lanes 0, 1 from the first group, 2, 3 from the second
_PAIR_COLS = np.array(
    [[*COMBOS[c % len(COMBOS)], *(4 + i for i in COMBOS[c // len(COMBOS)])] for c in range(PAIR_COMBOS)],
    np.int64,
)


@njit(cache=True)
def pair_table(x, out):  # pragma: no cover - compiled
    """out[t, p, c] = the four activations of pair p (inputs 8p .. 8p+7) that pair code c keeps."""
    for t in range(x.shape[0]):
        for p in range(out.shape[1]):
            for c in range(PAIR_COMBOS):
                for lane in range(4):
                    out[t, p, c, lane] = x[t, 8 * p + _PAIR_COLS[c, lane]]


@njit(cache=True)
def _dot_pairs(kind, v, c, tab, n_pairs):  # pragma: no cover - compiled
    if kind == F16_V:
        return dot_f16(v, c, tab, n_pairs)
    if kind == I8_V:
        return dot_i8(v, c, tab, n_pairs)
    if kind == BF16_V:
        return dot_bf16(v, c, tab, n_pairs)
    return dot_f32(v, c, tab, n_pairs)


@njit(parallel=True, cache=True)
def matvec_2_4(kind, v, codes, scale, tab, out, rpt):  # pragma: no cover - compiled
    """out[t, r] = scale[r] * (row r . x[t]) for 2:4 rows of paired groups (``codes``: one byte a pair),
    ``tab`` the activations' pair tables."""
    rows, n_pairs = codes.shape
    for i in prange((rows + rpt - 1) // rpt):
        for r in range(i * rpt, min(rows, (i + 1) * rpt)):
            va = v.ctypes.data + r * v.strides[0]
            ca = codes.ctypes.data + r * codes.strides[0]
            for t in range(tab.shape[0]):
                out[t, r] = scale[r] * _dot_pairs(kind, va, ca, tab.ctypes.data + t * tab.strides[0], n_pairs)


def pair_codes(idx: np.ndarray) -> np.ndarray:
    """2:4 positions (one byte a group: first kept low nibble, second high) as one byte a pair of groups:
    ``a + 6 b`` for the combos (:data:`COMBOS`) ``a`` of its first group and ``b`` of its second."""
    lut = np.zeros(256, np.uint8)
    for (a, b), c in _COMBO_OF.items():
        lut[a | b << 4] = c
    combo = lut[idx]
    return np.ascontiguousarray(combo[:, 0::2] + combo[:, 1::2] * np.uint8(len(COMBOS)))


@njit(cache=True, fastmath=True)
def _dot_nm(v, idx, x, n, m):  # pragma: no cover - compiled
    """One N:M row: slot k's position is nibble k of ``idx`` (low nibble first)."""
    acc = np.float32(0.0)
    for g in range(v.shape[0] // n):
        for s in range(n):
            k = g * n + s
            pos = (np.int64(idx[k >> 1]) >> ((k & 1) * 4)) & 15
            acc += _widen(v[k]) * x[g * m + pos]
    return acc


@njit(parallel=True, cache=True)
def matvec_nm(v, idx, scale, x, n, m, out, rpt):  # pragma: no cover - compiled
    """out[t, r] = scale[r] * (row r . x[t]) over the kept values (scale: ones for float values)."""
    rows = v.shape[0]
    for i in prange((rows + rpt - 1) // rpt):
        for r in range(i * rpt, min(rows, (i + 1) * rpt)):
            for t in range(x.shape[0]):
                out[t, r] = _dot_nm(v[r], idx[r], x[t], n, m) * scale[r]
