"""One weight row against 8 float32 activation rows: each quantized block is decoded once for all of them.

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

from ...numba_jit import numba
from .llvm_ir import F32, I64, PREFETCH_AHEAD, as_ptr, emit_prefetch, for_units, scale_vec, splat, vt
from .simd import format_code

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


def strict_hsum(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
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
            wp = as_ptr(b, w_a, ir.IntType(8))
            zero = ir.Constant(vt(F32, _LANES), [0.0] * _LANES)
            accs = [cgutils.alloca_once_value(b, zero) for _ in range(n_rows)]
            x_rows = [b.add(x_a, b.mul(ir.Constant(I64, t), x_st)) for t in range(n_rows)]
            fma = _fma_v8(b.module)
            picks = [
                ir.Constant(vt(ir.IntType(32), _LANES), list(range(i, i + _LANES))) for i in range(0, 32, 8)
            ]

            def body(u, slot):
                base = b.gep(wp, [b.mul(u, ir.Constant(I64, code.unit_bytes))])
                emit_prefetch(b, base, PREFETCH_AHEAD)
                for blk in code.decode(b, base, u):
                    wv = b.fmul(
                        b.sitofp(blk.values, vt(F32, 32)), scale_vec(b, blk.scale_lo, blk.scale_hi, 32)
                    )
                    if blk.min is not None:
                        wv = b.fsub(wv, splat(b, blk.min, 32))
                    parts = [b.shuffle_vector(wv, wv, pick) for pick in picks]
                    x_off = b.mul(blk.xblock, ir.Constant(I64, 32 * 4))
                    for t in range(n_rows):
                        xp = as_ptr(b, b.add(x_rows[t], x_off), vt(F32, _LANES))
                        xv = [b.load(b.gep(xp, [ir.Constant(I64, i)]), align=4) for i in range(4)]
                        s01 = b.call(fma, [parts[1], xv[1], b.fmul(parts[0], xv[0])])
                        s23 = b.call(fma, [parts[3], xv[3], b.fmul(parts[2], xv[2])])
                        b.store(b.fadd(b.load(accs[t]), b.fadd(s01, s23)), accs[t])

            for_units(b, n_u, body, unroll=1)
            for t in range(n_rows):
                out_p = as_ptr(b, b.add(o_a, b.mul(ir.Constant(I64, t), o_st)), F32)
                b.store(strict_hsum(b, b.load(accs[t])), out_p)
            return context.get_dummy_value()

        return sig, codegen

    return dot_rows
