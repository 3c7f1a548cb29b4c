"""Hand-built vector code for the quantized kernels: numba intrinsics that emit LLVM IR.

numba's auto-vectorizer turns block-wise quantized dot products into scalar code or per-block horizontal
reductions (docs/backend-cpu.md#why-hand-built-vector-code). Here each GGUF block format has a *decoder*
that turns the bytes of a block, read in place from the GGUF layout, into 32 signed 16-bit values plus a
scale (and, for the k-quants, a min). These consumers use the decoded blocks:

* ``f32``: exact float activations: values converted to float and multiplied in float (the exact path).
* ``dequant``: values times scales (minus mins) stored as float32 (prefill dequantizes into a tile).
* the batched kernels of :mod:`.dot_f32_rows8`.

The int16-activation decode kernels (the default path) decode each format their own way (:mod:`.dot_int16_128bit`).

LLVM picks the widest vectors the host has (AVX-512 or AVX2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ...quant.formats import GGMLType
from ...quant.repack import Q5_0_X4_BYTES, Q5_0_X4_VALUES, Q6_K_I8_BYTES
from .llvm_ir import (
    F32,
    FAST,
    I8,
    I16,
    I32,
    I64,
    PREFETCH_AHEAD,
    as_ptr,
    concat,
    const_vec,
    emit_prefetch,
    for_units,
    hsum,
    load_at,
    load_half,
    nibbles,
    scale_vec,
    splat,
    vt,
)


@dataclass
class Decoded:
    """One decoded 32-value block: ``values`` <32 x i16>; scales for values 0-15 and 16-31; optional min.

    The block's float values are ``scale * values - min``; ``xblock`` is the block's index in the row (IR i64).
    """

    values: ir.Value
    scale_lo: ir.Value
    scale_hi: ir.Value
    min: ir.Value | None
    xblock: ir.Value


# -- decoders: (builder, unit base pointer, unit index) -> decoded 32-value blocks -----------------------
def _q8_0(b, base, u):
    d = load_half(b, base, 0)
    vals = b.sext(load_at(b, base, 2, vt(I8, 32)), vt(I16, 32))
    return [Decoded(vals, d, d, None, u)]


def _q4_0(b, base, u):
    d = load_half(b, base, 0)
    lo, hi = nibbles(b, load_at(b, base, 2, vt(I8, 16)))
    vals = b.sub(b.zext(concat(b, lo, hi), vt(I16, 32)), const_vec(I16, [8] * 32))
    return [Decoded(vals, d, d, None, u)]


def _bits_to_bytes(b, qh32: ir.Value) -> ir.Value:
    """<32 x i1>: bit j of a 32-bit word (byte shuffle, mask, compare: cheaper than 32 variable shifts)."""
    bytes4 = b.bitcast(qh32, vt(I8, 4))
    spread = b.shuffle_vector(bytes4, bytes4, const_vec(I32, [j // 8 for j in range(32)]))
    masked = b.and_(
        spread, const_vec(I8, [(1 << (j % 8)) - 256 if j % 8 == 7 else 1 << (j % 8) for j in range(32)])
    )
    return b.icmp_unsigned("!=", masked, const_vec(I8, [0] * 32))


def _five_bit_values(b, nib: ir.Value, qh32: ir.Value) -> ir.Value:
    """<32 x i16> Q5_0 values - 16 from their low nibbles (<32 x i8>) and their fifth bits (a 32-bit word)."""
    offset = b.select(_bits_to_bytes(b, qh32), const_vec(I8, [0] * 32), const_vec(I8, [-16] * 32))
    return b.sext(b.add(nib, offset), vt(I16, 32))


def _q5_0(b, base, u):
    d = load_half(b, base, 0)
    lo, hi = nibbles(b, load_at(b, base, 6, vt(I8, 16)))
    return [Decoded(_five_bit_values(b, concat(b, lo, hi), load_at(b, base, 2, I32)), d, d, None, u)]


def k_scale_min_bytes(b, base) -> tuple[ir.Value, ir.Value]:
    """The 8 six-bit scales and mins of a Q4_K/Q5_K superblock (bytes 4-15) as two <8 x i8> (ggml's
    unpacking done on three 32-bit words, as its SIMD code does): the one unpacking of the k-quant scales."""
    u0, u1, u2 = (load_at(b, base, 4 + 4 * i, I32) for i in range(3))

    def c(v):
        return ir.Constant(I32, v)

    m1, m2, m3 = c(0x3F3F3F3F), c(0x0F0F0F0F), c(0x03030303)
    sc_lo = b.and_(u0, m1)
    sc_hi = b.or_(b.and_(u2, m2), b.shl(b.and_(b.lshr(u0, c(6)), m3), c(4)))
    mn_lo = b.and_(u1, m1)
    mn_hi = b.or_(b.and_(b.lshr(u2, c(4)), m2), b.shl(b.and_(b.lshr(u1, c(6)), m3), c(4)))

    def as_bytes(lo, hi):
        pair = b.insert_element(b.insert_element(ir.Constant(vt(I32, 2), None), lo, c(0)), hi, c(1))
        return b.bitcast(pair, vt(I8, 8))

    return as_bytes(sc_lo, sc_hi), as_bytes(mn_lo, mn_hi)


def k_scales_mins(b, base) -> tuple[ir.Value, ir.Value]:
    """:func:`k_scale_min_bytes` as two <8 x float>, for the decoders here and the int16/int8 kernels."""
    return tuple(b.uitofp(b.zext(v, vt(I32, 8)), vt(F32, 8)) for v in k_scale_min_bytes(b, base))


def _kquant(b, base, u, with_high_bits: bool):
    d, dmin = load_half(b, base, 0), load_half(b, base, 2)
    sc, mn = k_scales_mins(b, base)
    qs_off = 48 if with_high_bits else 16
    qh = load_at(b, base, 16, vt(I8, 32)) if with_high_bits else None
    out = []
    for c in range(4):
        lo, hi = nibbles(b, load_at(b, base, qs_off + 32 * c, vt(I8, 32)))
        for k, nib in ((0, lo), (1, hi)):
            j = 2 * c + k
            v = b.zext(nib, vt(I16, 32))
            if qh is not None:
                bit = b.and_(b.lshr(qh, const_vec(I8, [j] * 32)), const_vec(I8, [1] * 32))
                v = b.or_(v, b.shl(b.zext(bit, vt(I16, 32)), const_vec(I16, [4] * 32)))
            scale = b.fmul(d, b.extract_element(sc, ir.Constant(I32, j)), flags=FAST)
            xb = b.add(b.mul(u, ir.Constant(I64, 8)), ir.Constant(I64, j))
            mj = b.extract_element(mn, ir.Constant(I32, j))
            out.append(Decoded(v, scale, scale, b.fmul(dmin, mj, flags=FAST), xb))
    return out


def _q4_k(b, base, u):
    return _kquant(b, base, u, False)


def _q5_k(b, base, u):
    return _kquant(b, base, u, True)


def _q6_k(b, base, u):
    d = load_half(b, base, 208)
    out = []
    for h in range(2):
        ql = [load_at(b, base, 64 * h + 32 * i, vt(I8, 32)) for i in range(2)]
        qh = load_at(b, base, 128 + 32 * h, vt(I8, 32))
        for k in range(4):
            src = ql[k % 2]
            nib = b.and_(src, const_vec(I8, [15] * 32)) if k < 2 else b.lshr(src, const_vec(I8, [4] * 32))
            high = b.and_(b.lshr(qh, const_vec(I8, [2 * k] * 32)), const_vec(I8, [3] * 32))
            q = b.or_(nib, b.shl(high, const_vec(I8, [4] * 32)))
            vals = b.sub(b.zext(q, vt(I16, 32)), const_vec(I16, [32] * 32))
            s_idx = 8 * h + 2 * k
            s_lo = b.fmul(d, b.sitofp(load_at(b, base, 192 + s_idx, I8), F32), flags=FAST)
            s_hi = b.fmul(d, b.sitofp(load_at(b, base, 192 + s_idx + 1, I8), F32), flags=FAST)
            xb = b.add(b.mul(u, ir.Constant(I64, 8)), ir.Constant(I64, 4 * h + k))
            out.append(Decoded(vals, s_lo, s_hi, None, xb))
    return out


def _q6_k_i8(b, base, u):
    """Q6_K_I8 (:mod:`workbench.quant.repack`): d at 0, 16 int8 scales at 2, int8 codes at 18."""
    d = load_half(b, base, 0)
    out = []
    for g in range(8):
        vals = b.sext(load_at(b, base, 18 + 32 * g, vt(I8, 32)), vt(I16, 32))
        s_lo, s_hi = (
            b.fmul(d, b.sitofp(load_at(b, base, 2 + 2 * g + k, I8), F32), flags=FAST) for k in range(2)
        )
        xb = b.add(b.mul(u, ir.Constant(I64, 8)), ir.Constant(I64, g))
        out.append(Decoded(vals, s_lo, s_hi, None, xb))
    return out


def _q5_0_x4(b, base, u):
    """Q5_0_X4 (:mod:`workbench.quant.repack`): 4 fp16 scales at 0, 4 fifth-bit words at 8, two 32-byte
    nibble pairs at 24 (block 2p in the low nibbles of pair p, block 2p + 1 in the high ones)."""
    out = []
    for g in range(4):
        d = load_half(b, base, 2 * g)
        lo, hi = nibbles(b, load_at(b, base, 24 + 32 * (g // 2), vt(I8, 32)))
        vals = _five_bit_values(b, hi if g % 2 else lo, load_at(b, base, 8 + 4 * g, I32))
        out.append(Decoded(vals, d, d, None, b.add(b.mul(u, ir.Constant(I64, 4)), ir.Constant(I64, g))))
    return out


@dataclass(frozen=True)
class FormatCode:
    decode: Callable
    unit_bytes: int  # bytes of one decode unit (a block or a superblock)
    unit_values: int


DECODERS: dict[GGMLType, FormatCode] = {
    GGMLType.Q8_0: FormatCode(_q8_0, 34, 32),
    GGMLType.Q4_0: FormatCode(_q4_0, 18, 32),
    GGMLType.Q5_0: FormatCode(_q5_0, 22, 32),
    GGMLType.Q4_K: FormatCode(_q4_k, 144, 256),
    GGMLType.Q5_K: FormatCode(_q5_k, 176, 256),
    GGMLType.Q6_K: FormatCode(_q6_k, 210, 256),
}
# layouts the backend repacks GGUF blocks into at load (ids above the GGML type ids, below qformats' planar id)
Q6_K_I8, Q5_0_X4 = 900, 901
REPACKED: dict[int, FormatCode] = {
    Q6_K_I8: FormatCode(_q6_k_i8, Q6_K_I8_BYTES, 256),
    Q5_0_X4: FormatCode(_q5_0_x4, Q5_0_X4_BYTES, Q5_0_X4_VALUES),
}
# layouts that interleave 16 rows (dot_int16_interleaved.py); each the GGUF type its rows are read back as
Q8_0_R16, Q5_0_R16, Q4_K_R16 = 902, 903, 904
INTERLEAVED: dict[int, GGMLType] = {Q8_0_R16: GGMLType.Q8_0, Q5_0_R16: GGMLType.Q5_0, Q4_K_R16: GGMLType.Q4_K}
R16_FMTS = tuple(INTERLEAVED)  # for compiled code


def format_code(fmt: int) -> FormatCode:
    """The decoder of a GGML block type or of a repacked layout; of an interleaved layout, that of its GGUF
    type (its sizes per row hold; its rows are not contiguous, so only interleaved.py and dot_int16_interleaved.py decode it)."""
    if fmt in INTERLEAVED:
        return DECODERS[INTERLEAVED[fmt]]
    return DECODERS[fmt] if fmt in DECODERS else REPACKED[fmt]


# -- intrinsic factories -------------------------------------------------------------------------------
def make_dot_f32(qtype: int):
    """``dot(w_addr, x_addr, xs_addr, n_units) -> float32``: exact float activations ``x`` (xs: block sums)."""
    code = format_code(qtype)

    @intrinsic
    def dot(typingctx, w, x, xs, n):
        sig = types.float32(types.intp, types.intp, types.intp, types.intp)

        def codegen(context, b, signature, args):
            w_a, x_a, xs_a, n_u = args
            wp = as_ptr(b, w_a, I8)
            xp, xsp = as_ptr(b, x_a, vt(F32, 32)), as_ptr(b, xs_a, F32)
            accv = [cgutils.alloca_once_value(b, ir.Constant(vt(F32, 32), [0.0] * 32)) for _ in range(2)]
            accs = cgutils.alloca_once_value(b, ir.Constant(F32, 0.0))

            def body(u, slot):
                base = b.gep(wp, [b.mul(u, ir.Constant(I64, code.unit_bytes))])
                emit_prefetch(b, base, PREFETCH_AHEAD)
                for j, blk in enumerate(code.decode(b, base, u)):
                    acc = accv[(slot + j) % 2]
                    x = b.load(b.gep(xp, [blk.xblock]), align=4)
                    prod = b.fmul(b.sitofp(blk.values, vt(F32, 32)), x, flags=FAST)
                    sv = scale_vec(b, blk.scale_lo, blk.scale_hi, 32)
                    b.store(b.fadd(b.load(acc), b.fmul(prod, sv, flags=FAST), flags=FAST), acc)
                    if blk.min is not None:
                        xs = b.load(b.gep(xsp, [blk.xblock]))
                        b.store(b.fsub(b.load(accs), b.fmul(blk.min, xs, flags=FAST), flags=FAST), accs)

            for_units(b, n_u, body)
            total = b.fadd(b.load(accv[0]), b.load(accv[1]), flags=FAST)
            return b.fadd(hsum(b, total), b.load(accs), flags=FAST)

        return sig, codegen

    return dot


def make_dequant(qtype: int):
    """``dequant(w_addr, out_addr, n_units)``: one row of ``qtype`` to float32 (ggml's arithmetic order)."""
    code = format_code(qtype)

    @intrinsic
    def dequant(typingctx, w, out, n):
        sig = types.void(types.intp, types.intp, types.intp)

        def codegen(context, b, signature, args):
            w_a, o_a, n_u = args
            wp, op = as_ptr(b, w_a, I8), as_ptr(b, o_a, vt(F32, 32))

            def body(u, slot):
                base = b.gep(wp, [b.mul(u, ir.Constant(I64, code.unit_bytes))])
                for blk in code.decode(b, base, u):
                    v = b.fmul(
                        b.sitofp(blk.values, vt(F32, 32)), scale_vec(b, blk.scale_lo, blk.scale_hi, 32)
                    )
                    if blk.min is not None:
                        v = b.fsub(v, splat(b, blk.min, 32))
                    b.store(v, b.gep(op, [blk.xblock]), align=4)

            for_units(b, n_u, body)
            return context.get_dummy_value()

        return sig, codegen

    return dequant
