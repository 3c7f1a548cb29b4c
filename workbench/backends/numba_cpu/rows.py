"""Batched matrix-vector kernels: each quantized weight block is read and decoded once for all activation rows.

A decode step of a batch (several sequences, one token each) or a speculative verification step has a few
activation rows. Running the one-row kernels per row re-decodes every weight block per row; here a block is
decoded to float32 once (scale times value minus min, ggml's order, as the dequantizer does) and multiplied
into every row's accumulator with exact float activations. Each row's arithmetic is the same whatever the
number of rows (the rows are a runtime loop over one body), so a row's result does not depend on the batch.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..._numba import numba
from ...quant.formats import GGMLType
from .matvec import _tasks, rows_f32_by_dequant
from .simd import (
    F32,
    I64,
    PREFETCH_AHEAD,
    Q5_0_X4,
    Q6_K_I8,
    R16_FMTS,
    _as_ptr,
    _for_units,
    _prefetch,
    _scale_vec,
    _splat,
    format_code,
    vt,
)

njit, prange = numba.njit, numba.prange
ROWS = 8  # activation rows one call handles; callers pad the rows to a multiple of ROWS
_LANES = 8  # float32 lanes of one accumulator


def pad_rows(n: int) -> int:
    """Rows the kernels compute for ``n`` activation rows: a multiple of ROWS (one fixed group size keeps
    each row's arithmetic, and so its result, independent of the batch)."""
    return -(-n // ROWS) * ROWS


def _fma_v8(mod: ir.Module) -> ir.Function:
    v8 = vt(F32, _LANES)
    name = "llvm.fma.v8f32"
    return mod.globals.get(name) or ir.Function(mod, ir.FunctionType(v8, [v8, v8, v8]), name)


def _strict_hsum(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """Sum of the lanes in a fixed order (no fast-math flags: LLVM may not reassociate it per row)."""
    n = v.type.count
    while n > 1:
        half = n // 2
        lo = b.shuffle_vector(v, v, ir.Constant(vt(ir.IntType(32), half), list(range(half))))
        hi = b.shuffle_vector(v, v, ir.Constant(vt(ir.IntType(32), half), list(range(half, n))))
        v, n = b.fadd(lo, hi), half
    return b.extract_element(v, ir.Constant(ir.IntType(32), 0))


def make_dot_rows_f32(qtype: int, n_rows: int):
    """``dot_rows(w_addr, x_addr, x_stride, n_units, out_addr, out_stride)``: one weight row of ``qtype``
    against ``n_rows`` float32 activation rows; ``out[t] = dot(dequant(w), x[t])``, each row with its own
    accumulator and a strict float order (explicit FMAs, no fast-math flags), so a row's result is the same
    in any slot of any batch."""
    code = format_code(qtype)

    @intrinsic
    def dot_rows(typingctx, w, x, x_stride, n_units, out, out_stride):
        sig = types.void(*([types.intp] * 6))

        def codegen(context, b, signature, args):
            w_a, x_a, x_st, n_u, o_a, o_st = args
            wp = _as_ptr(b, w_a, ir.IntType(8))
            zero = ir.Constant(vt(F32, _LANES), [0.0] * _LANES)
            accs = [cgutils.alloca_once_value(b, zero) for _ in range(n_rows)]
            x_rows = [b.add(x_a, b.mul(ir.Constant(I64, t), x_st)) for t in range(n_rows)]
            fma = _fma_v8(b.module)
            picks = [
                ir.Constant(vt(ir.IntType(32), _LANES), list(range(i, i + _LANES))) for i in range(0, 32, 8)
            ]

            def body(u, slot):
                base = b.gep(wp, [b.mul(u, ir.Constant(I64, code.unit_bytes))])
                _prefetch(b, base, PREFETCH_AHEAD)
                for blk in code.decode(b, base, u):
                    wv = b.fmul(
                        b.sitofp(blk.values, vt(F32, 32)), _scale_vec(b, blk.scale_lo, blk.scale_hi, 32)
                    )
                    if blk.min is not None:
                        wv = b.fsub(wv, _splat(b, blk.min, 32))
                    parts = [b.shuffle_vector(wv, wv, pick) for pick in picks]
                    x_off = b.mul(blk.xblock, ir.Constant(I64, 32 * 4))
                    for t in range(n_rows):
                        xp = _as_ptr(b, b.add(x_rows[t], x_off), vt(F32, _LANES))
                        xv = [b.load(b.gep(xp, [ir.Constant(I64, i)]), align=4) for i in range(4)]
                        s01 = b.call(fma, [parts[1], xv[1], b.fmul(parts[0], xv[0])])
                        s23 = b.call(fma, [parts[3], xv[3], b.fmul(parts[2], xv[2])])
                        b.store(b.fadd(b.load(accs[t]), b.fadd(s01, s23)), accs[t])

            _for_units(b, n_u, body, unroll=1)
            for t in range(n_rows):
                out_p = _as_ptr(b, b.add(o_a, b.mul(ir.Constant(I64, t), o_st)), F32)
                b.store(_strict_hsum(b, b.load(accs[t])), out_p)
            return context.get_dummy_value()

        return sig, codegen

    return dot_rows


Q8_0, Q4_0, Q5_0, Q4_K, Q5_K = (int(t) for t in (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q4_K,
                                                  GGMLType.Q5_K))  # fmt: skip
_TYPES = (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K)
rows_q8_0, rows_q4_0, rows_q5_0, rows_q4_k, rows_q5_k, rows_q6_k = (
    make_dot_rows_f32(t, ROWS) for t in _TYPES
)
rows_q6_k_i8, rows_q5_0_x4 = make_dot_rows_f32(Q6_K_I8, ROWS), make_dot_rows_f32(Q5_0_X4, ROWS)


@njit(cache=True)
def _rows(fmt, w, n_units, r0, r1, x, out):  # pragma: no cover - compiled
    """out[:, n] = x @ row n of w for weight rows r0..r1; x has a multiple of ROWS rows."""
    wa, rb = w.ctypes.data, w.shape[1]
    if fmt in R16_FMTS:
        rows_f32_by_dequant(fmt, wa, rb, n_units, r0, r1, x, out, r0)
        return
    xs, os = x.strides[0], out.strides[0]
    for t0 in range(0, x.shape[0], ROWS):
        xa, oa = x.ctypes.data + t0 * xs, out.ctypes.data + t0 * os
        for n in range(r0, r1):
            args = (wa + n * rb, xa, xs, n_units, oa + n * 4, os)
            if fmt == Q8_0:
                rows_q8_0(*args)
            elif fmt == Q5_0:
                rows_q5_0(*args)
            elif fmt == Q4_K:
                rows_q4_k(*args)
            elif fmt == Q4_0:
                rows_q4_0(*args)
            elif fmt == Q5_K:
                rows_q5_k(*args)
            elif fmt == Q6_K_I8:
                rows_q6_k_i8(*args)
            elif fmt == Q5_0_X4:
                rows_q5_0_x4(*args)
            else:
                rows_q6_k(*args)


@njit(parallel=True, cache=True)
def matmul_rows3(f0, w0, u0, o0, f1, w1, u1, o1, f2, w2, u2, o2, x, rpt):  # pragma: no cover - compiled
    """Up to three projections of the same activation rows ``x`` (T, K), T a multiple of ROWS
    (:func:`pad_rows`), in one parallel loop over weight rows (unused slots pass weights with zero rows);
    each weight row is decoded once per ROWS activation rows."""
    t0, t1 = _tasks(w0.shape[0], rpt), _tasks(w1.shape[0], rpt)
    for i in prange(t0 + t1 + _tasks(w2.shape[0], rpt)):
        if i < t0:
            r0 = i * rpt
            _rows(f0, w0, u0, r0, min(w0.shape[0], r0 + rpt), x, o0)
        elif i < t0 + t1:
            r0 = (i - t0) * rpt
            _rows(f1, w1, u1, r0, min(w1.shape[0], r0 + rpt), x, o1)
        else:
            r0 = (i - t0 - t1) * rpt
            _rows(f2, w2, u2, r0, min(w2.shape[0], r0 + rpt), x, o2)
