"""One weight row against 8 int16 activation rows: each weight block is decoded once for all of them.

The int16 twin of :mod:`.dot_f32_rows8` (used when the backend quantizes activations, its default): activation rows
are quantized per 32-value block as single-token decode quantizes them (:func:`.matvec.quantize_rows_i16`),
a weight block is decoded to 32 words once, and each row takes its integer dot product with ``vpmaddwd``
(8 MACs an instruction on one pipe: on cores with 128-bit datapaths the MAC rate of float FMAs too, but the
activations load half the bytes and no weight value is converted to float). Per row and block: the integer
sum times (weight scale x activation scale), accumulated with explicit FMAs and no fast-math flags, the
k-quants' mins subtracted as ``min x scale x sum(xq)``; each row runs the same code in any slot of any
batch, so a row's result does not depend on the batch. Figures: docs/backend-cpu.md#batched-kernels.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ...numba_jit import numba
from .dot_f32_rows8 import strict_hsum
from .llvm_ir import (
    F32,
    I16,
    I32,
    I64,
    PREFETCH_AHEAD,
    as_ptr,
    const_vec,
    emit_prefetch,
    for_units,
    pmaddwd,
    splat,
    vt,
)
from .simd import format_code

njit, prange = numba.njit, numba.prange


def _fma(mod: ir.Module, t: ir.Type) -> ir.Function:
    name = f"llvm.fma.v{t.count}f32" if isinstance(t, ir.VectorType) else "llvm.fma.f32"
    return mod.globals.get(name) or ir.Function(mod, ir.FunctionType(t, [t, t, t]), name)


def _lanes(b: ir.IRBuilder, v: ir.Value, first: int, n: int) -> ir.Value:
    return b.shuffle_vector(v, v, const_vec(I32, range(first, first + n)))


def make_dot_rows_i16(qtype: int, n_rows: int):
    """``dot_rows(w_addr, xq_addr, xq_stride, xd_addr, xs_addr, xd_stride, n_units, out_addr, out_stride)``:
    one weight row of ``qtype`` against ``n_rows`` int16 activation rows (``xd``: per-block scales, ``xs``:
    per-block sums of ``xq`` as floats; strides in bytes); ``out[t]`` the row's dot product."""
    code = format_code(qtype)

    @intrinsic
    def dot_rows(typingctx, w, xq, xq_st, xd, xs, xd_st, n_units, out, out_st):
        sig = types.void(*([types.intp] * 9))

        def codegen(context, b, signature, args):
            w_a, xq_a, xq_s, xd_a, xs_a, xd_s, n_u, o_a, o_s = args
            wp = as_ptr(b, w_a, ir.IntType(8))
            v4 = vt(F32, 4)
            fma4, fma1 = _fma(b.module, v4), _fma(b.module, F32)
            accs = [cgutils.alloca_once_value(b, ir.Constant(v4, [0.0] * 4)) for _ in range(n_rows)]
            corr = [cgutils.alloca_once_value(b, ir.Constant(F32, 0.0)) for _ in range(n_rows)]

            def row(base, t: int, stride, ty: ir.Type) -> ir.Value:
                return as_ptr(b, b.add(base, b.mul(ir.Constant(I64, t), stride)), ty)

            xqs = [row(xq_a, t, xq_s, vt(I16, 32)) for t in range(n_rows)]
            xds = [row(xd_a, t, xd_s, F32) for t in range(n_rows)]
            xss = [row(xs_a, t, xd_s, F32) for t in range(n_rows)]

            def add(t: int, isum: ir.Value, scale: ir.Value) -> None:
                term = [b.sitofp(isum, v4), splat(b, scale, 4), b.load(accs[t])]
                b.store(b.call(fma4, term), accs[t])

            def body(u, slot):
                base = b.gep(wp, [b.mul(u, ir.Constant(I64, code.unit_bytes))])
                emit_prefetch(b, base, PREFETCH_AHEAD)
                for blk in code.decode(b, base, u):
                    for t in range(n_rows):
                        m = pmaddwd(b, blk.values, b.load(b.gep(xqs[t], [blk.xblock]), align=2))  # <16 x i32>
                        xd = b.load(b.gep(xds[t], [blk.xblock]))
                        halves = [b.add(_lanes(b, m, 8 * h, 4), _lanes(b, m, 8 * h + 4, 4)) for h in range(2)]
                        if blk.scale_lo is blk.scale_hi:
                            add(t, b.add(halves[0], halves[1]), b.fmul(blk.scale_lo, xd))
                        else:  # values 0-15 and 16-31 under their own scales (Q6_K)
                            add(t, halves[0], b.fmul(blk.scale_lo, xd))
                            add(t, halves[1], b.fmul(blk.scale_hi, xd))
                        if blk.min is not None:
                            xs = b.load(b.gep(xss[t], [blk.xblock]))
                            b.store(b.call(fma1, [b.fmul(blk.min, xd), xs, b.load(corr[t])]), corr[t])

            for_units(b, n_u, body, unroll=1)
            for t in range(n_rows):
                out_p = as_ptr(b, b.add(o_a, b.mul(ir.Constant(I64, t), o_s)), F32)
                b.store(b.fsub(strict_hsum(b, b.load(accs[t])), b.load(corr[t])), out_p)
            return context.get_dummy_value()

        return sig, codegen

    return dot_rows
