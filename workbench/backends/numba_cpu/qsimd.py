"""Hand-built vector code (numba intrinsics) for the planar int4 format of :mod:`workbench.quant.planar`.

numba's auto-vectorizer leaves the nibble unpacking of group-wise int4 scalar (~0.1-3 GB/s measured), so,
as :mod:`.simd` does for the GGUF blocks, each group is unpacked into <32 x i8> code vectors in LLVM IR:
with the split-halves layout the low nibbles of a group's bytes are its first values and the high nibbles
its second half. Two consumers per (group size, symmetric/asymmetric):

* ``f32``: codes to float times float activations, scaled per group into a float vector accumulator; the
  zero point is subtracted once per group as ``scale * zero * sum(x over the group)``.
* ``i8``: codes times int8 activations (per-token quantized) with ``vpmaddwd``-style pair sums.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .llvm_ir import (
    F32,
    FAST,
    HALF,
    I8,
    I16,
    I32,
    I64,
    PREFETCH_AHEAD,
    as_ptr,
    concat,
    emit_prefetch,
    for_units,
    hsum,
    load_at,
    nibbles,
    pmaddwd,
    splat,
    vt,
)


def _codes(b, wbase, group: int) -> list[tuple[ir.Value, int]]:
    """The group's unsigned 4-bit codes as (<32 x i8>, offset of their first value in the group)."""
    if group == 32:
        lo, hi = nibbles(b, load_at(b, wbase, 0, vt(I8, 16)))
        return [(concat(b, lo, hi), 0)]
    out = []
    for c in range(group // 64):
        lo, hi = nibbles(b, load_at(b, wbase, 32 * c, vt(I8, 32)))
        out += [(lo, 32 * c), (hi, group // 2 + 32 * c)]
    return out


def _group_scale_zero(b, sp, zp, g, asym: bool) -> tuple[ir.Value, ir.Value]:
    scale = b.fpext(b.bitcast(b.load(b.gep(sp, [g])), HALF), F32)
    zero = b.uitofp(b.load(b.gep(zp, [g])), F32) if asym else ir.Constant(F32, 8.0)
    return scale, zero


def make_dot_int4(group: int, asym: bool, int8_act: bool):
    """``dot(w, scale, zero, x, xg, n_groups) -> float32`` for one row (addresses as intp).

    f32 activations: ``x`` float32, ``xg`` float32 sums of x per group. int8 activations: ``x`` int8 codes,
    ``xg`` int32 sums of the codes per group; the caller multiplies the result by the token's scale."""

    @intrinsic
    def dot(typingctx, w, s, z, x, xg, n):
        sig = types.float32(types.intp, types.intp, types.intp, types.intp, types.intp, types.intp)

        def codegen(context, b, signature, args):
            w_a, s_a, z_a, x_a, xg_a, n_g = args
            wp, sp, zp = as_ptr(b, w_a, I8), as_ptr(b, s_a, I16), as_ptr(b, z_a, I8)
            lanes = 16 if int8_act else 32
            xp = as_ptr(b, x_a, vt(I8, 32) if int8_act else vt(F32, 32))
            xgp = as_ptr(b, xg_a, I32 if int8_act else F32)
            accv = [
                cgutils.alloca_once_value(b, ir.Constant(vt(F32, lanes), [0.0] * lanes)) for _ in range(2)
            ]
            accs = cgutils.alloca_once_value(b, ir.Constant(F32, 0.0))

            def body(g, slot):
                wbase = b.gep(wp, [b.mul(g, ir.Constant(I64, group // 2))])
                emit_prefetch(b, wbase, PREFETCH_AHEAD)
                scale, zero = _group_scale_zero(b, sp, zp, g, asym)
                first = b.mul(g, ir.Constant(I64, group // 32))
                isum = None
                for codes, off in _codes(b, wbase, group):
                    xv = b.load(b.gep(xp, [b.add(first, ir.Constant(I64, off // 32))]), align=1)
                    if int8_act:
                        p = pmaddwd(b, b.zext(codes, vt(I16, 32)), b.sext(xv, vt(I16, 32)))
                        isum = p if isum is None else b.add(isum, p)
                    else:
                        prod = b.fmul(b.uitofp(codes, vt(F32, 32)), xv, flags=FAST)
                        acc = accv[slot]
                        b.store(
                            b.fadd(b.load(acc), b.fmul(prod, splat(b, scale, 32), flags=FAST), flags=FAST),
                            acc,
                        )
                if int8_act:
                    acc = accv[slot]
                    scaled = b.fmul(b.sitofp(isum, vt(F32, 16)), splat(b, scale, 16), flags=FAST)
                    b.store(b.fadd(b.load(acc), scaled, flags=FAST), acc)
                xg_g = b.load(b.gep(xgp, [g]))
                xg_f = b.sitofp(xg_g, F32) if int8_act else xg_g
                corr = b.fmul(b.fmul(scale, zero, flags=FAST), xg_f, flags=FAST)
                b.store(b.fsub(b.load(accs), corr, flags=FAST), accs)

            for_units(b, n_g, body)
            total = b.fadd(b.load(accv[0]), b.load(accv[1]), flags=FAST)
            return b.fadd(hsum(b, total), b.load(accs), flags=FAST)

        return sig, codegen

    return dot
