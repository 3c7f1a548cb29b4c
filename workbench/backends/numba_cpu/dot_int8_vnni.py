"""Decode dot products with int8 activations on AVX512-VNNI hosts: 64 weight bytes by 64 activation bytes per
``vpdpbusd``.

With ``act_quant="int8"`` (llama.cpp's numerics: activations rounded to 127 levels per 32-value block) the
quantizer also writes each activation row as int8 (:func:`.matvec.quantize_rows_i16`), and these kernels
multiply the weights' codes, made unsigned (Q8_0 + 128, Q5_0 + 16, Q6_K + 32, Q4_K's nibbles as they are),
with those bytes: one ``vpdpbusd`` sums 4 products into each of 16 int32 lanes. A weight offset is taken
back per block as ``offset x weight scale x activation scale x sum(activations)`` (``xs``), as dot_int16_128bit.py
takes back Q4_0's; Q6_K's per-16 scales take theirs back in the integer lanes. The integers are those of
the int16 kernels at 127 levels, so the two agree up to the order of float sums.

The int8 copy orders each group of 4 blocks as blocks 0, 2, 1, 3 (:data:`VNNI_ORDER`; a last partial group
keeps its order): the low nibbles of 64 bytes of Q4_K (or of Q5_0_X4) are blocks 0 and 2 of a group, the
high ones blocks 1 and 3, so each pair of blocks meets 64 contiguous activation bytes. Q8_0 and Q6_K_I8
gather their pairs from two 32-byte loads.

Figures against the int16 kernels: docs/backend-cpu.md#int8-activations-by-vnni.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ...quant.formats import GGMLType
from ...quant.repack import Q5_0_X4_BYTES, Q6_K_I8_BYTES
from .dot_int16_512bit import WideRow
from .llvm_ir import (
    F32,
    FAST,
    HALF,
    I8,
    I16,
    I32,
    I64,
    concat,
    const_vec,
    host_has,
    load_at,
    load_f32x8,
    ptr,
    vt,
)
from .simd import Q5_0_X4, Q6_K_I8, k_scales_mins

VNNI_ORDER = (0, 2, 1, 3)  # the int8 copy's order of the blocks of a group of 4 (its own inverse)
LANES = 16
# values per decode unit of the formats with a kernel here (the int8 copy sits after 2 x that many bytes
# of int16 codes per unit)
UNIT_VALUES = {int(GGMLType.Q8_0): 32, Q5_0_X4: 128, int(GGMLType.Q4_K): 256, Q6_K_I8: 256}


def host_has_vnni() -> bool:
    """Whether the host's LLVM features include AVX512-VNNI (``vpdpbusd`` on 512-bit vectors)."""
    return host_has("avx512vnni")


HAS_VNNI = host_has_vnni()


def _dpbusd(b: ir.IRBuilder, acc: ir.Value, u: ir.Value, s: ir.Value) -> ir.Value:
    """acc + per int32 lane the sum of 4 products of unsigned bytes ``u`` by signed bytes ``s`` (<64 x i8>):
    ``vpdpbusd``, or on a host without it the same in plain IR (correct anywhere; LLVM cannot select the
    instruction where the host lacks it)."""
    if not HAS_VNNI:
        prod = b.mul(b.zext(u, vt(I32, 64)), b.sext(s, vt(I32, 64)))
        for k in range(4):
            acc = b.add(acc, b.shuffle_vector(prod, prod, const_vec(I32, range(k, 64, 4))))
        return acc
    name = "llvm.x86.avx512.vpdpbusd.512"
    fn = b.module.globals.get(name) or ir.Function(
        b.module, ir.FunctionType(vt(I32, LANES), [vt(I32, LANES)] * 3), name
    )
    return b.call(fn, [acc, b.bitcast(u, vt(I32, LANES)), b.bitcast(s, vt(I32, LANES))])


def _pair_lanes(b: ir.IRBuilder, scales: ir.Value, i: int, j: int) -> ir.Value:
    """16 lanes: ``scales[i]`` in the first 8 (block i's 32 values), ``scales[j]`` in the last 8."""
    return b.shuffle_vector(scales, scales, const_vec(I32, [i] * 8 + [j] * 8))


class _VnniRow(WideRow):
    """dot_int16_512bit's row (its loop over units, float accumulators, offsets and result) over the int8 copy of
    the activations: one 64-byte vector per pair of blocks, multiplied by ``vpdpbusd``."""

    ZERO = ir.Constant(vt(I32, LANES), [0] * LANES)

    def __init__(self, b: ir.IRBuilder, args):
        super().__init__(b, args)
        self.xq = b.bitcast(self.xq, ptr(vt(I8, 64)))

    def x(self, pair: ir.Value) -> ir.Value:
        return self.b.load(self.b.gep(self.xq, [pair]), align=1)

    def pair(self, x0: ir.Value, k: int) -> ir.Value:
        """The index of the ``k``-th pair of blocks from block ``x0`` (a multiple of 4)."""
        return self.b.add(self.b.lshr(x0, ir.Constant(I64, 1)), ir.Constant(I64, k))

    def dot(self, u: ir.Value, pair: ir.Value) -> ir.Value:
        """<16 x i32>: the weight bytes ``u`` by the activation bytes of ``pair``."""
        return _dpbusd(self.b, self.ZERO, u, self.x(pair))

    def add_int(self, slot: int, p: ir.Value, scales: ir.Value) -> None:
        """acc += float(p) * scales (``p`` <16 x i32>, ``scales`` <16 x float>)."""
        b, acc = self.b, self.acc[slot % len(self.acc)]
        f = b.sitofp(p, vt(F32, LANES))
        b.store(b.fadd(b.load(acc), b.fmul(f, scales, flags=FAST), flags=FAST), acc)


def _offset_scales(r: _VnniRow, dw: ir.Value, x0: ir.Value, offset: float) -> ir.Value:
    """The 4 blocks' combined scales (weight scale ``dw`` x activation scale) from block ``x0``; subtracts
    ``offset`` x scale x activation sum per block."""
    b = r.b
    xd = b.load(b.bitcast(b.gep(r.xd, [x0]), ptr(vt(F32, 4))), align=4)
    xs = b.load(b.bitcast(b.gep(r.xs, [x0]), ptr(vt(F32, 4))), align=4)
    s = b.fmul(dw, xd, flags=FAST)
    corr = b.fmul(s, b.fmul(xs, ir.Constant(vt(F32, 4), [offset] * 4), flags=FAST), flags=FAST)
    r.sub(b.shuffle_vector(corr, ir.Constant(corr.type, [0.0] * 4), const_vec(I32, range(8))))
    return s


# -- Q8_0: groups of 4 GGUF blocks (34 bytes each) -------------------------------------------------------
def _q8_0_body(r: _VnniRow) -> ir.Value:
    """Blocks 0 and 2, then 1 and 3, of each group of 4 loaded as 32 + 32 bytes, made unsigned (+ 128: the
    sign bit flipped); the row has a whole number of groups (the caller checks)."""
    b = r.b
    flip = const_vec(I8, [-128] * 64)
    with r.units(4 * 34, 4) as (base, x0):
        bits = ir.Constant(vt(I16, 4), [0] * 4)
        for j in range(4):
            bits = b.insert_element(bits, load_at(b, base, 34 * j, I16), ir.Constant(I32, j))
        dw = b.fpext(b.bitcast(bits, vt(HALF, 4)), vt(F32, 4))
        s = _offset_scales(r, dw, x0, 128.0)
        for k in range(2):
            i, j = VNNI_ORDER[2 * k], VNNI_ORDER[2 * k + 1]
            w = concat(b, load_at(b, base, 34 * i + 2, vt(I8, 32)), load_at(b, base, 34 * j + 2, vt(I8, 32)))
            r.add_int(k, r.dot(b.xor(w, flip), r.pair(x0, k)), _pair_lanes(b, s, i, j))
    return r.result()


# -- Q5_0_X4 (workbench.quant.repack): 4 blocks in 88 bytes -----------------------------------------------
def _q5_0_x4_body(r: _VnniRow) -> ir.Value:
    """The 64 nibble bytes: low nibbles blocks 0 and 2, high ones 1 and 3; + 16 where a value's fifth bit
    (two fifth-bit words as one ``kmovq`` mask) is set: value + 16, unsigned."""
    b = r.b
    low, sixteen = const_vec(I8, [15] * 64), const_vec(I8, [16] * 64)
    with r.units(Q5_0_X4_BYTES, 4) as (base, x0):
        dw = b.fpext(load_at(b, base, 0, vt(HALF, 4)), vt(F32, 4))
        s = _offset_scales(r, dw, x0, 16.0)
        qh = load_at(b, base, 8, vt(I64, 2))  # fifth-bit words 0 | 1 << 32, 2 | 3 << 32
        q01, q23 = (b.extract_element(qh, ir.Constant(I32, i)) for i in (0, 1))
        lo32 = ir.Constant(I64, 0xFFFFFFFF)
        masks = (
            b.or_(b.and_(q01, lo32), b.shl(q23, ir.Constant(I64, 32))),  # blocks 0, 2
            b.or_(b.lshr(q01, ir.Constant(I64, 32)), b.and_(q23, ir.Constant(I64, 0xFFFFFFFF00000000))),
        )
        nib = load_at(b, base, 24, vt(I8, 64))
        halves = (b.and_(nib, low), b.and_(b.lshr(nib, const_vec(I8, [4] * 64)), low))
        for k in range(2):
            bits = b.bitcast(masks[k], vt(ir.IntType(1), 64))
            u = b.select(bits, b.or_(halves[k], sixteen), halves[k])
            r.add_int(k, r.dot(u, r.pair(x0, k)), _pair_lanes(b, s, VNNI_ORDER[2 * k], VNNI_ORDER[2 * k + 1]))
    return r.result()


# -- Q4_K: 256-value superblocks ---------------------------------------------------------------------------
def _q4_k_body(r: _VnniRow) -> ir.Value:
    """Chunks 2c and 2c + 1 (64 bytes): low nibbles sub-blocks 4c and 4c + 2, high ones 4c + 1 and 4c + 3
    (unsigned as they are); scales d x scale x activation scale, mins subtracted as dmin x min x activation
    scale x activation sum."""
    b = r.b
    low = const_vec(I8, [15] * 64)
    with r.units(144, 8) as (base, x0):
        sc, mn = k_scales_mins(b, base)
        xd = load_f32x8(b, r.xd, x0)
        dd = b.fpext(load_at(b, base, 0, vt(HALF, 4)), vt(F32, 4))
        d, dmin = (b.shuffle_vector(dd, dd, const_vec(I32, [i] * 8)) for i in (0, 1))
        s = b.fmul(b.fmul(sc, d, flags=FAST), xd, flags=FAST)
        mins = b.fmul(b.fmul(mn, dmin, flags=FAST), xd, flags=FAST)
        r.sub(b.fmul(mins, load_f32x8(b, r.xs, x0), flags=FAST))
        for c in range(2):
            nib = load_at(b, base, 16 + 64 * c, vt(I8, 64))
            halves = (b.and_(nib, low), b.and_(b.lshr(nib, const_vec(I8, [4] * 64)), low))
            for k in range(2):
                i, j = 4 * c + VNNI_ORDER[2 * k], 4 * c + VNNI_ORDER[2 * k + 1]
                r.add_int(k, r.dot(halves[k], r.pair(x0, 2 * c + k)), _pair_lanes(b, s, i, j))
    return r.result()


# -- Q6_K_I8 (workbench.quant.repack): int8 codes, a scale per 16 values -----------------------------------
def _q6_k_i8_body(r: _VnniRow) -> ir.Value:
    """Blocks i and j of a group as 32 + 32 codes, + 32 (unsigned); the offset taken back in the lanes
    (32 x the sum of each lane's 4 activations, by one more ``vpdpbusd``), as the 16-value scales differ
    within a block; lanes 0-3, 4-7, 8-11, 12-15: values 0-15 and 16-31 of block i, then of block j."""
    b = r.b
    off = const_vec(I8, [32] * 64)
    with r.units(Q6_K_I8_BYTES, 8) as (base, x0):
        d = b.fpext(load_at(b, base, 0, vt(HALF, 4)), vt(F32, 4))
        sc = b.sitofp(b.sext(load_at(b, base, 2, vt(I8, 16)), vt(I32, LANES)), vt(F32, LANES))
        sc = b.fmul(sc, b.shuffle_vector(d, d, const_vec(I32, [0] * LANES)), flags=FAST)
        xd = load_f32x8(b, r.xd, x0)
        s = b.fmul(sc, b.shuffle_vector(xd, xd, const_vec(I32, [i // 2 for i in range(LANES)])), flags=FAST)
        for grp in range(2):
            for k in range(2):
                i, j = 4 * grp + VNNI_ORDER[2 * k], 4 * grp + VNNI_ORDER[2 * k + 1]
                w = concat(
                    b, load_at(b, base, 18 + 32 * i, vt(I8, 32)), load_at(b, base, 18 + 32 * j, vt(I8, 32))
                )
                x = r.x(r.pair(x0, 2 * grp + k))
                p = b.sub(_dpbusd(b, r.ZERO, b.add(w, off), x), _dpbusd(b, r.ZERO, off, x))
                lanes = [2 * i] * 4 + [2 * i + 1] * 4 + [2 * j] * 4 + [2 * j + 1] * 4
                r.add_int(k, p, b.shuffle_vector(s, s, const_vec(I32, lanes)))
    return r.result()


BODIES: dict[int, Callable[[_VnniRow], ir.Value]] = {
    int(GGMLType.Q8_0): _q8_0_body,
    Q5_0_X4: _q5_0_x4_body,
    int(GGMLType.Q4_K): _q4_k_body,
    Q6_K_I8: _q6_k_i8_body,
}


def make_dot_vnni(qtype: int):
    """``dot(w_addr, xq8_addr, xd_addr, xs_addr, n_units) -> float32`` for Q8_0 (n_units a multiple of 4),
    Q5_0_X4, Q4_K and Q6_K_I8 rows, with the activations' int8 copy in :data:`VNNI_ORDER` at ``xq8_addr``."""
    body = BODIES[qtype]
    n_div = 4 if qtype == GGMLType.Q8_0 else 1  # Q8_0's loop runs over groups of 4 blocks

    @intrinsic
    def dot(typingctx, w, xq8, xd, xs, n):
        sig = types.float32(types.intp, types.intp, types.intp, types.intp, types.intp)

        def codegen(context, b, signature, args):
            w_a, xq_a, xd_a, xs_a, n_a = args
            if n_div > 1:
                n_a = b.udiv(n_a, ir.Constant(I64, n_div))
            return body(_VnniRow(b, (w_a, xq_a, xd_a, xs_a, n_a)))

        return sig, codegen

    return dot
