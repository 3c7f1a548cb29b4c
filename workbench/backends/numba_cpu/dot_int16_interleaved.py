"""Decode matvecs on rows interleaved 16 at a time (Q8_0_R16, Q5_0_R16, Q4_K_R16; :mod:`workbench.quant.repack`).

The row-by-row kernels (:mod:`.dot_int16_512bit`) spend per 32-value block of a row one ``vpmaddwd``, one conversion
to float and one FMA, plus the block's decoding. Here a 512-bit vector holds values ``2k, 2k + 1`` of 16
rows, and the activations' pair ``2k, 2k + 1`` is one broadcast int32: ``vpdpwssd`` accumulates the pair's
products into the 16 rows' int32 lanes, 16 such per block, then one conversion and one FMA (by the 16 rows'
scales times the block's activation scale) per block *of 16 rows*; Q4_K's 6-bit scales and mins are
unpacked once per superblock for the 16 rows at once. The integer sums are those of the row kernels
(exact), so only the order of the float sums differs.

Figures against the row kernels: docs/backend-cpu.md#rows-interleaved-16-at-a-time.

On a host without AVX512-VNNI the same arithmetic is emitted as plain IR (``vpmaddwd`` and an add):
correct anywhere, and the backend interleaves by default only where ``vpdpwssd`` exists."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ...numba_jit import numba
from ...quant.repack import Q4_K_BYTES, Q5_0_BYTES, Q8_0_BYTES, ROW_GROUP
from .dot_int8_vnni import HAS_VNNI
from .dot_int16_512bit import PREFETCH_AHEAD, nibble_words
from .llvm_ir import (
    F32,
    FAST,
    HALF,
    I8,
    I16,
    I32,
    I64,
    as_ptr,
    const_vec,
    emit_prefetch,
    load_at,
    pmaddwd,
    ptr,
    splat,
    vt,
)
from .simd import INTERLEAVED, Q4_K_R16, Q5_0_R16, Q8_0_R16

njit = numba.njit
LANES = ROW_GROUP  # int32 / float lanes: one per row
GGUF_Q8_0, GGUF_Q5_0, GGUF_Q4_K = (int(INTERLEAVED[f]) for f in (Q8_0_R16, Q5_0_R16, Q4_K_R16))
# bytes of a unit (a block; a superblock for Q4_K) of 16 rows
_UNIT = {Q8_0_R16: ROW_GROUP * Q8_0_BYTES, Q5_0_R16: ROW_GROUP * Q5_0_BYTES, Q4_K_R16: ROW_GROUP * Q4_K_BYTES}


def _dpwssd(b: ir.IRBuilder, acc: ir.Value, w: ir.Value, x: ir.Value) -> ir.Value:
    """acc + per int32 lane the sum of 2 products of the int16 pairs of ``w`` and ``x`` (<32 x i16>):
    ``vpdpwssd``, or on a host without AVX512-VNNI the same in plain IR."""
    if not HAS_VNNI:
        return b.add(acc, pmaddwd(b, w, x), flags=("nsw",))
    name = "llvm.x86.avx512.vpdpwssd.512"
    fn = b.module.globals.get(name) or ir.Function(
        b.module, ir.FunctionType(vt(I32, LANES), [vt(I32, LANES)] * 3), name
    )
    return b.call(fn, [acc, b.bitcast(w, vt(I32, LANES)), b.bitcast(x, vt(I32, LANES))])


def _q8_0_slots(b: ir.IRBuilder, base: ir.Value) -> list[ir.Value]:
    """The 16 pair slots of a Q8_0_R16 block as <32 x i16> (``vpmovsxbw`` from memory)."""
    return [b.sext(load_at(b, base, 32 + 32 * k, vt(I8, 32)), vt(I16, 32)) for k in range(16)]


def _q5_0_slots(b: ir.IRBuilder, base: ir.Value) -> list[ir.Value]:
    """The 16 pair slots of a Q5_0_R16 block as <32 x i16> values - 16: each nibble slot widened once
    (``vpmovzxbw``), masked and shifted into slots p and p + 8; nibble - 16 where the fifth bit (a ``kmovd``
    mask from memory) is clear."""
    slots: list[ir.Value] = [None] * 16
    for p in range(8):
        lo, hi = nibble_words(b, base, 96 + 32 * p)
        for k, nib in ((p, lo), (p + 8, hi)):
            bits = b.bitcast(load_at(b, base, 32 + 4 * k, I32), vt(ir.IntType(1), 32))
            slots[k] = b.select(bits, nib, b.sub(nib, const_vec(I16, [16] * 32)))
    return slots


class _Group:
    """Codegen state of 16 interleaved rows' dot products: pointers, two 16-lane float accumulators and one
    for the k-quants' mins."""

    def __init__(self, b: ir.IRBuilder, args):
        w_a, xq_a, xd_a, xs_a, self.n, self.out = args
        self.b = b
        self.w, self.xq = as_ptr(b, w_a, I8), as_ptr(b, xq_a, I32)
        self.xd, self.xs = as_ptr(b, xd_a, F32), as_ptr(b, xs_a, F32)
        zero = ir.Constant(vt(F32, LANES), [0.0] * LANES)
        self.acc = [cgutils.alloca_once_value(b, zero) for _ in range(2)]
        self.corr = cgutils.alloca_once_value(b, zero)

    def unit(self, u: ir.Value, unit_bytes: int) -> ir.Value:
        """Unit ``u``'s first byte, its lines prefetched PREFETCH_AHEAD bytes ahead."""
        b = self.b
        base = b.gep(self.w, [b.mul(u, ir.Constant(I64, unit_bytes))])
        for off in range(0, unit_bytes, 64):
            emit_prefetch(b, base, PREFETCH_AHEAD + off)
        return base

    def xd_splat(self, blk: ir.Value, sums: bool = False) -> ir.Value:
        """Block ``blk``'s activation scale (``sums``: times the sum of its codes) in 16 lanes."""
        b = self.b
        v = b.load(b.gep(self.xd, [blk]))
        if sums:
            v = b.fmul(v, b.load(b.gep(self.xs, [blk])), flags=FAST)
        return splat(b, v, LANES)

    def dot(self, slots: list[ir.Value], blk: ir.Value) -> ir.Value:
        """<16 x i32>: per row the integer dot product of its 32 values in ``slots`` with block ``blk``'s codes
        (each activation pair one broadcast int32), in four chains of ``vpdpwssd``."""
        b = self.b
        parts = [ir.Constant(vt(I32, LANES), [0] * LANES)] * 4
        for k, v in enumerate(slots):
            pair = b.load(
                b.gep(self.xq, [b.add(b.mul(blk, ir.Constant(I64, 16)), ir.Constant(I64, k))]), align=4
            )
            parts[k % 4] = _dpwssd(b, parts[k % 4], v, b.bitcast(splat(b, pair, LANES), vt(I16, 32)))
        return b.add(b.add(parts[0], parts[1]), b.add(parts[2], parts[3]))

    def add(self, slot: int, total: ir.Value, scales: ir.Value) -> None:
        """acc[slot] += float(total) * scales (16 rows' combined scales)."""
        b, acc = self.b, self.acc[slot]
        b.store(
            b.fadd(b.load(acc), b.fmul(b.sitofp(total, vt(F32, LANES)), scales, flags=FAST), flags=FAST), acc
        )

    def store(self) -> None:
        b = self.b
        total = b.fsub(
            b.fadd(b.load(self.acc[0]), b.load(self.acc[1]), flags=FAST), b.load(self.corr), flags=FAST
        )
        b.store(total, b.inttoptr(self.out, ptr(vt(F32, LANES))), align=4)


def _halves(b: ir.IRBuilder, base: ir.Value, offset: int) -> ir.Value:
    """16 fp16 values at ``offset`` as <16 x float> (``vcvtph2ps``)."""
    return b.fpext(load_at(b, base, offset, vt(HALF, LANES)), vt(F32, LANES))


def _one_scale_body(fmt: int):
    """Q8_0_R16, Q5_0_R16: a unit is one block of 16 rows, its 16 fp16 scales first; consecutive blocks
    alternate accumulators."""
    unit, slots = _UNIT[fmt], _q8_0_slots if fmt == Q8_0_R16 else _q5_0_slots

    def body(g: _Group) -> None:
        b = g.b

        def block(u: ir.Value, slot: int) -> None:
            base = g.unit(u, unit)
            g.add(slot, g.dot(slots(b, base), u), b.fmul(_halves(b, base, 0), g.xd_splat(u), flags=FAST))

        pairs = b.udiv(g.n, ir.Constant(I64, 2))
        with cgutils.for_range(b, pairs) as loop:
            for s in range(2):
                block(b.add(b.mul(loop.index, ir.Constant(I64, 2)), ir.Constant(I64, s)), s)
        with cgutils.if_unlikely(b, b.icmp_unsigned("!=", b.mul(pairs, ir.Constant(I64, 2)), g.n)):
            block(b.sub(g.n, ir.Constant(I64, 1)), 0)

    return body


def _q4_k_body(g: _Group) -> None:
    """Q4_K_R16: per superblock the 16 rows' d and dmin, then their 6-bit scales and mins decoded from the
    12 byte planes in 16 lanes (ggml's unpacking, lane-wise); each nibble slot widened once into a pair slot
    of sub-blocks 2c (low nibbles) and 2c + 1 (high ones); mins subtracted as dmin x min x activation scale
    x sum of the sub-block's codes."""
    b = g.b

    def c32(v: int) -> ir.Constant:
        return const_vec(I32, [v] * LANES)

    with cgutils.for_range(b, g.n) as loop:
        base = g.unit(loop.index, _UNIT[Q4_K_R16])
        x0 = b.mul(loop.index, ir.Constant(I64, 8))
        d, dmin = _halves(b, base, 0), _halves(b, base, 32)
        p = [b.zext(load_at(b, base, 64 + 16 * i, vt(I8, LANES)), vt(I32, LANES)) for i in range(12)]
        scales = []
        for j in range(8):
            if j < 4:
                sc, mn = b.and_(p[j], c32(63)), b.and_(p[j + 4], c32(63))
            else:
                top = (b.shl(b.lshr(p[j - 4], c32(6)), c32(4)), b.shl(b.lshr(p[j], c32(6)), c32(4)))
                sc = b.or_(b.and_(p[j + 4], c32(0x0F)), top[0])
                mn = b.or_(b.lshr(p[j + 4], c32(4)), top[1])
            blk = b.add(x0, ir.Constant(I64, j))
            scales.append(
                b.fmul(b.fmul(b.sitofp(sc, vt(F32, LANES)), d, flags=FAST), g.xd_splat(blk), flags=FAST)
            )
            mins = b.fmul(
                b.fmul(b.sitofp(mn, vt(F32, LANES)), dmin, flags=FAST), g.xd_splat(blk, sums=True), flags=FAST
            )
            b.store(b.fadd(b.load(g.corr), mins, flags=FAST), g.corr)
        for c in range(4):
            lo, hi = zip(*(nibble_words(b, base, 256 + 32 * (16 * c + k)) for k in range(16)), strict=True)
            for half, slots in enumerate((lo, hi)):
                j = 2 * c + half
                g.add(half, g.dot(list(slots), b.add(x0, ir.Constant(I64, j))), scales[j])


_BODIES = {Q8_0_R16: _one_scale_body(Q8_0_R16), Q5_0_R16: _one_scale_body(Q5_0_R16), Q4_K_R16: _q4_k_body}


def make_dot_r16(fmt: int):
    """``dot16(w_addr, xq_addr, xd_addr, xs_addr, n_units, out_addr)``: 16 interleaved rows of ``fmt`` (their
    group's first byte at ``w_addr``; units: blocks, or superblocks for Q4_K) against int16 activations with
    per-block scales ``xd`` and code sums ``xs``; the 16 dot products stored as float32 at ``out_addr``."""
    body = _BODIES[fmt]

    @intrinsic
    def dot16(typingctx, w, xq, xd, xs, n, out):
        sig = types.void(types.intp, types.intp, types.intp, types.intp, types.intp, types.intp)

        def codegen(context, b, signature, args):
            g = _Group(b, args)
            body(g)
            g.store()
            return context.get_dummy_value()

        return sig, codegen

    return dot16
