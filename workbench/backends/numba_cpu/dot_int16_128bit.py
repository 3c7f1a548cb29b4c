"""Decode dot products of GGUF blocks with int16 activations (the decode matvec's hot loop), per format.

Activations are quantized per 32-value block to int16 (:func:`.matvec.quantize_rows_i16`). Weight bytes
are widened to words 8 at a time (``vpmovsxbw`` / ``vpmovzxbw`` from memory) or built as words by byte
unpacks, multiplied with ``vpmaddwd`` (8 word pairs -> 4 x i32), summed per block, converted to float
once and FMA'd with the block's combined scale (weight scale x activation scale) into float accumulators
kept across the row; one horizontal sum per row.

All vectors are 128 bits wide: on cores that split 256-bit operations in two (AVX2 with 128-bit
datapaths) that is faster than 256-bit code (full-width AVX2 cores run Q4_K and Q6_K_I8 rows by
:mod:`.dot_int16_256bit`, with these kernels' bits), and int16 activations, the more accurate ones, cost no more
than llama.cpp's int8 ``vpmaddubsw`` form (figures: docs/backend-cpu.md#128-bit-kernels). Tricks that save
operations:

* nibbles are masked in place after widening: ``word & 0x0F`` is the low nibble, ``word & 0xF0`` sixteen
  times the high one; the factor 16 goes into the float scale (exact);
* Q5_0 builds its words ``16 x (value - 16)`` by unpacking bytes: 16 x the nibble as the low byte, -1 or 0
  (the inverted fifth bit) as the high byte;
* constant offsets (Q4_0: 8) are subtracted once per block as ``offset x scale x sum(x)`` (``xs``: per-block
  sums of the int16 activations), as are the k-quants' mins.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ...quant.formats import GGMLType
from ...quant.repack import Q6_K_I8_BYTES
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
    hsum,
    load_at,
    load_f32x8,
    load_half,
    pmaddwd,
    ptr,
    splat,
    vt,
)
from .simd import Q6_K_I8, k_scales_mins

ACCS = 2  # float accumulators per row (independent FMA chains)
LANES = 4  # float lanes of an accumulator
PREFETCH_AHEAD = 2048  # bytes of the weight stream prefetched ahead (docs/backend-cpu.md#prefetching)


def _bytes(v: int, n: int = 16) -> ir.Constant:
    return const_vec(I8, [v if v < 128 else v - 256] * n)


def _wide(b: ir.IRBuilder, v: ir.Value, signed: bool) -> ir.Value:
    return (b.sext if signed else b.zext)(v, vt(I16, 8))


def _sum(b: ir.IRBuilder, vals: list[ir.Value]) -> ir.Value:
    """Pairwise sum of integer vectors (a balanced tree: short dependency chains)."""
    while len(vals) > 1:
        vals = [b.add(vals[i], vals[i + 1], flags=("nsw",)) if i + 1 < len(vals) else vals[i]
                for i in range(0, len(vals), 2)]  # fmt: skip
    return vals[0]


def _resize(b: ir.IRBuilder, v: ir.Value, n: int) -> ir.Value:
    """A float vector to ``n`` lanes: zero-padded, or its lane groups of ``n`` added."""
    m = v.type.count
    if m < n:
        return b.shuffle_vector(
            v, ir.Constant(v.type, [0.0] * m), const_vec(I32, [*range(m), *[m] * (n - m)])
        )
    while m > n:
        m //= 2
        v = b.fadd(b.shuffle_vector(v, v, const_vec(I32, range(m))), b.shuffle_vector(v, v, const_vec(I32, range(m, 2 * m))),
                   flags=FAST)  # fmt: skip
    return v


class _Row:
    """Codegen state of one row's dot product: the pointers, accumulators and helpers the bodies share."""

    def __init__(self, b: ir.IRBuilder, args, corr: bool):
        w_a, xq_a, xd_a, xs_a, self.n = args
        self.b = b
        self.w = as_ptr(b, w_a, I8)
        self.xq = as_ptr(b, xq_a, vt(I16, 8))  # four vectors per 32-value block
        self.xd, self.xs = as_ptr(b, xd_a, F32), as_ptr(b, xs_a, F32)
        zero = ir.Constant(vt(F32, LANES), [0.0] * LANES)
        self.acc = [cgutils.alloca_once_value(b, zero) for _ in range(ACCS)]
        # offsets and mins, subtracted at the end
        self.corr = cgutils.alloca_once_value(b, zero) if corr else None

    def x(self, block: ir.Value, quarter: int) -> ir.Value:
        """Activation words 8 quarter .. 8 quarter + 7 of 32-value ``block``."""
        idx = self.b.add(self.b.mul(block, ir.Constant(I64, 4)), ir.Constant(I64, quarter))
        return self.b.load(self.b.gep(self.xq, [idx]), align=2)

    def vec8(self, p: ir.Value, u: ir.Value) -> ir.Value:
        """<8 x float> at ``p[u]`` (xd or xs of 8 blocks)."""
        return load_f32x8(self.b, p, u)

    def add(self, slot: int, p: ir.Value, scale: ir.Value) -> None:
        """acc += float(p) * scale (one FMA; ``p`` <4 x i32>, ``scale`` a float, splatted)."""
        b, acc = self.b, self.acc[slot % ACCS]
        term = b.fmul(b.sitofp(p, vt(F32, LANES)), splat(b, scale, LANES), flags=FAST)
        b.store(b.fadd(b.load(acc), term, flags=FAST), acc)

    def sub(self, v: ir.Value) -> None:
        """Subtract the lanes of float vector or scalar ``v`` from the result."""
        b = self.b
        if not isinstance(v.type, ir.VectorType):
            v = b.insert_element(ir.Constant(vt(F32, 1), [0.0]), v, ir.Constant(I32, 0))
        b.store(b.fadd(b.load(self.corr), _resize(b, v, LANES), flags=FAST), self.corr)

    def result(self) -> ir.Value:
        b = self.b
        total = b.load(self.acc[0])
        for a in self.acc[1:]:
            total = b.fadd(total, b.load(a), flags=FAST)
        if self.corr is not None:
            total = b.fsub(total, b.load(self.corr), flags=FAST)
        return hsum(b, total)


# -- one-scale 32-value blocks: Q8_0, Q4_0, Q5_0 ------------------------------------------------------
def _q8_0_block(r: _Row, base, u) -> ir.Value:
    """Four 8-byte quarters widened by vpmovsxbw from memory, all at 128 bits (fewer cycles than the 256-bit
    form where 256-bit operations are split in two)."""
    b = r.b
    return _sum(
        b, [pmaddwd(b, _wide(b, load_at(b, base, 2 + 8 * i, vt(I8, 8)), True), r.x(u, i)) for i in range(4)]
    )


def _q4_0_block(r: _Row, base, u) -> ir.Value:
    """Each 8 bytes widened once: low nibbles (values 0-15) and 16 x the high ones (values 16-31); the low
    sums are scaled by 16 (a shift) to match; <4 x i32>."""
    b = r.b
    lo, hi = [], []
    for i in range(2):
        w = _wide(b, load_at(b, base, 2 + 8 * i, vt(I8, 8)), False)
        lo.append(pmaddwd(b, b.and_(w, const_vec(I16, [0x0F] * 8)), r.x(u, i)))
        hi.append(pmaddwd(b, b.and_(w, const_vec(I16, [0xF0] * 8)), r.x(u, 2 + i)))
    return b.add(b.shl(_sum(b, lo), const_vec(I32, [4] * 4)), _sum(b, hi), flags=("nsw",))


def _q5_0_block(r: _Row, base, u) -> ir.Value:
    """Words 16 x (value - 16), built by byte unpacks: the low byte 16 x the nibble (the high nibbles in
    place), the high byte -1 where the value's qh bit is clear, else 0; <4 x i32> pair sums."""
    b = r.b
    q = load_at(b, base, 6, vt(I8, 16))
    nib16 = (b.and_(b.shl(q, _bytes(4)), _bytes(0xF0)), b.and_(q, _bytes(0xF0)))  # values 0-15, 16-31
    qh = b.bitcast(splat(b, load_at(b, base, 2, I32), 4), vt(I8, 16))
    bit = const_vec(I8, [(1 << k) - 256 if k == 7 else 1 << k for k in range(8)] * 2)
    parts = []
    for half, nib in enumerate(nib16):
        spread = b.shuffle_vector(qh, qh, const_vec(I32, [2 * half] * 8 + [2 * half + 1] * 8))
        clear = b.sext(b.icmp_unsigned("==", b.and_(spread, bit), _bytes(0)), vt(I8, 16))
        for k in range(2):  # bytes 0-7 / 8-15 of the half as words
            sel = [i for j in range(8 * k, 8 * k + 8) for i in (j, 16 + j)]
            w = b.bitcast(b.shuffle_vector(nib, clear, const_vec(I32, sel)), vt(I16, 8))
            parts.append(pmaddwd(b, w, r.x(u, 2 * half + k)))
    return _sum(b, parts)


# (unit bytes, block -> <4 x i32>, blocks per group (their scales converted at once; more spill
#  registers), offset subtracted as offset x scale x sum(x), factor of the scale)
_ONE_SCALE: dict[GGMLType, tuple[int, Callable, int, int, float]] = {
    GGMLType.Q8_0: (34, _q8_0_block, 8, 0, 1.0),
    GGMLType.Q4_0: (18, _q4_0_block, 4, 8, 1 / 16),
    GGMLType.Q5_0: (22, _q5_0_block, 4, 0, 1 / 16),
}


def _one_scale_body(qtype: GGMLType):
    unit, block, group_n, offset, factor = _ONE_SCALE[qtype]

    def group(r: _Row, u0: ir.Value, n: int) -> None:
        """Blocks u0 .. u0 + n - 1 (n = 8 or 4): their fp16 scales converted at once (one vcvtph2ps)."""
        b = r.b
        gbase = b.gep(r.w, [b.mul(u0, ir.Constant(I64, unit))])
        for off in range(0, n * unit, 64):
            emit_prefetch(b, gbase, PREFETCH_AHEAD + off)
        bits = ir.Constant(vt(I16, n), [0] * n)
        for j in range(n):
            bits = b.insert_element(bits, load_at(b, gbase, j * unit, I16), ir.Constant(I32, j))
        xd = b.load(b.bitcast(b.gep(r.xd, [u0]), ptr(vt(F32, n))), align=4)
        scales = b.fmul(b.fpext(b.bitcast(bits, vt(HALF, n)), vt(F32, n)), xd, flags=FAST)
        if factor != 1.0:
            scales = b.fmul(scales, const_vec(F32, [factor] * n), flags=FAST)
        for j in range(n):
            p = block(r, b.gep(gbase, [ir.Constant(I64, j * unit)]), b.add(u0, ir.Constant(I64, j)))
            r.add(j, p, b.extract_element(scales, ir.Constant(I32, j)))
        if offset:
            xs = b.load(b.bitcast(b.gep(r.xs, [u0]), ptr(vt(F32, n))), align=4)
            corr = b.fmul(b.fmul(scales, xs, flags=FAST), const_vec(F32, [offset / factor] * n), flags=FAST)
            r.sub(corr)

    def codegen(r: _Row) -> ir.Value:
        b = r.b
        n_groups = b.udiv(r.n, ir.Constant(I64, group_n))
        with cgutils.for_range(b, n_groups) as loop:
            group(r, b.mul(loop.index, ir.Constant(I64, group_n)), group_n)
        done = b.mul(n_groups, ir.Constant(I64, group_n))
        rest = done
        if group_n == 8:
            with cgutils.if_likely(b, b.icmp_unsigned(">=", b.sub(r.n, done), ir.Constant(I64, 4))):
                group(r, done, 4)
            rest = b.add(done, b.mul(b.udiv(b.sub(r.n, done), ir.Constant(I64, 4)), ir.Constant(I64, 4)))
        with cgutils.for_range_slice(b, rest, r.n, ir.Constant(I64, 1)) as (u, _):
            base = b.gep(r.w, [b.mul(u, ir.Constant(I64, unit))])
            scale = b.fmul(b.fmul(load_half(b, base, 0), b.load(b.gep(r.xd, [u])), flags=FAST), ir.Constant(F32, factor),
                           flags=FAST)  # fmt: skip
            r.add(0, block(r, base, u), scale)
            if offset:
                xs = b.load(b.gep(r.xs, [u]))
                r.sub(b.fmul(b.fmul(scale, xs, flags=FAST), ir.Constant(F32, offset / factor), flags=FAST))
        return r.result()

    return codegen


# -- k-quants: 256-value superblocks -------------------------------------------------------------------
def kquant_scales(
    b: ir.IRBuilder, base: ir.Value, xd: ir.Value, xs: ir.Value, x0: ir.Value
) -> tuple[ir.Value, ir.Value]:
    """A Q4_K/Q5_K superblock's 8 scales (d x scale x activation scale; odd sub-blocks / 16, read as 16 x the
    high nibbles) as <8 x float>, and its mins (dmin x min x activation scale x code sum) in 4 lanes."""
    d, dmin = load_half(b, base, 0), load_half(b, base, 2)
    sc, mn = k_scales_mins(b, base)
    xdv = load_f32x8(b, xd, x0)
    scales = b.fmul(b.fmul(sc, splat(b, d, 8), flags=FAST), xdv, flags=FAST)
    parity = const_vec(F32, [1.0, 1 / 16] * 4)
    mins = b.fmul(b.fmul(mn, splat(b, dmin, 8), flags=FAST), xdv, flags=FAST)
    mins = _resize(b, b.fmul(mins, load_f32x8(b, xs, x0), flags=FAST), LANES)
    return b.fmul(scales, parity, flags=FAST), mins


def _kquant_body(high_bits: bool):
    """Q4_K (``high_bits`` False) and Q5_K: chunk c's 32 bytes hold sub-block 2c in the low nibbles and
    2c + 1 in the high nibbles (plus, for Q5_K, bits 2c and 2c + 1 of the 32 qh bytes): each 8 bytes are
    widened once (vpmovzxbw), then masked to the low nibbles and to 16 x the high ones."""
    unit, qs_off = (176, 48) if high_bits else (144, 16)

    def words8(v: int) -> ir.Constant:
        return const_vec(I16, [v] * 8)

    def codegen(r: _Row) -> ir.Value:
        b = r.b
        stack = cgutils.alloca_once(b, vt(F32, 8))
        with cgutils.for_range(b, r.n) as loop:
            u = loop.index
            base = b.gep(r.w, [b.mul(u, ir.Constant(I64, unit))])
            for off in range(0, unit, 64):
                emit_prefetch(b, base, PREFETCH_AHEAD + off)
            x0 = b.mul(u, ir.Constant(I64, 8))
            scales, mins = kquant_scales(b, base, r.xd, r.xs, x0)
            b.store(scales, stack)
            r.sub(mins)
            scale = b.bitcast(stack, ptr(F32))
            for c in range(4):
                lo, hi = [], []
                blk = [b.add(x0, ir.Constant(I64, 2 * c + k)) for k in range(2)]
                for i in range(4):
                    w = _wide(b, load_at(b, base, qs_off + 32 * c + 8 * i, vt(I8, 8)), False)
                    lw, hw = b.and_(w, words8(0x0F)), b.and_(w, words8(0xF0))
                    if high_bits:  # bit 2c: +16 on the low nibble; bit 2c + 1: +256 on 16 x the high one
                        qh = _wide(b, load_at(b, base, 16 + 8 * i, vt(I8, 8)), False)
                        for bit, add in ((1 << (2 * c), 16), (2 << (2 * c), 256)):
                            set_ = b.icmp_unsigned("!=", b.and_(qh, words8(bit)), words8(0))
                            term = b.select(set_, words8(add), words8(0))
                            lw, hw = (b.or_(lw, term), hw) if add == 16 else (lw, b.add(hw, term))
                    lo.append(pmaddwd(b, lw, r.x(blk[0], i)))
                    hi.append(pmaddwd(b, hw, r.x(blk[1], i)))
                for k, parts in enumerate((lo, hi)):
                    r.add(k, _sum(b, parts), b.load(b.gep(scale, [ir.Constant(I64, 2 * c + k)])))
        return r.result()

    return codegen


def sixteen_scales(
    b: ir.IRBuilder, base: ir.Value, d_off: int, sc_off: int, xd: ir.Value, dup: ir.Constant
) -> ir.Value:
    """A Q6_K superblock's 16 combined scales as <16 x float>: d (fp16 at ``d_off``) x the int8 scale (16 at
    ``sc_off``) x the activation scale of its 32-value block (``xd`` <8 x float>, lanes picked by ``dup``)."""
    d = load_half(b, base, d_off)
    sc = b.sitofp(b.sext(load_at(b, base, sc_off, vt(I8, 16)), vt(I32, 16)), vt(F32, 16))
    return b.fmul(b.fmul(sc, splat(b, d, 16), flags=FAST), b.shuffle_vector(xd, xd, dup), flags=FAST)


def _scaled_by_16(r: _Row, unit: int, d_off: int, sc_off: int, superblock) -> ir.Value:
    """The loop over 256-value superblocks of ``unit`` bytes whose every 16 values have an int8 scale (16 at
    ``sc_off``) under an fp16 ``d`` (at ``d_off``): Q6_K and Q6_K_I8. Per superblock the 16 scales times d
    times their block's activation scale are converted once into a table on the stack, then
    ``superblock(base, x0, scale)`` accumulates the values (``x0``: the superblock's first 32-value block,
    ``scale``: a float pointer to the table)."""
    b = r.b
    stack = cgutils.alloca_once(b, vt(F32, 16))
    dup = const_vec(I32, [i // 2 for i in range(16)])
    with cgutils.for_range(b, r.n) as loop:
        u = loop.index
        base = b.gep(r.w, [b.mul(u, ir.Constant(I64, unit))])
        for off in range(0, unit, 64):
            emit_prefetch(b, base, PREFETCH_AHEAD + off)
        x0 = b.mul(u, ir.Constant(I64, 8))
        b.store(sixteen_scales(b, base, d_off, sc_off, r.vec8(r.xd, x0), dup), stack)
        superblock(base, x0, b.bitcast(stack, ptr(F32)))
    return r.result()


def _q6_k_body(r: _Row) -> ir.Value:
    """Q6_K: per half h (128 values) ql bytes 64h..64h+63, qh bytes 128+32h..; value l of group k (0-3) has
    the low nibble (k < 2) or high nibble (k >= 2) of ql[l + 32 (k % 2)] and bits 2k, 2k + 1 of qh[l]; 16
    int8 scales (bytes 192-207), one per 16 values; d at 208. Each 16 values are built as signed bytes
    (value - 32), widened and summed under their own scale."""
    b = r.b

    def superblock(base, x0, scale):
        for h in range(2):
            for half in range(2):  # values l = 16 half .. 16 half + 15 of each group
                ql = [load_at(b, base, 64 * h + 32 * i + 16 * half, vt(I8, 16)) for i in range(2)]
                qh = load_at(b, base, 128 + 32 * h + 16 * half, vt(I8, 16))
                for k in range(4):
                    nib = b.and_(ql[k], _bytes(0x0F)) if k < 2 else b.lshr(ql[k - 2], _bytes(4))
                    shift = 4 - 2 * k
                    if shift > 0:
                        high = b.shl(qh, _bytes(shift))
                    else:
                        high = b.lshr(qh, _bytes(-shift)) if shift else qh
                    v = b.sub(b.or_(nib, b.and_(high, _bytes(0x30))), _bytes(32))
                    g = 4 * h + k
                    blk = b.add(x0, ir.Constant(I64, g))
                    parts = [
                        pmaddwd(b, _wide(b, b.shuffle_vector(v, v, const_vec(I32, range(8 * q, 8 * q + 8))), True),
                               r.x(blk, 2 * half + q))
                        for q in range(2)
                    ]  # fmt: skip
                    r.add(k, _sum(b, parts), b.load(b.gep(scale, [ir.Constant(I64, 2 * g + half)])))

    return _scaled_by_16(r, 210, 208, 192, superblock)


def _q6_k_i8_body(r: _Row) -> ir.Value:
    """Q6_K_I8 (Q6_K repacked at load, :mod:`workbench.quant.repack`): the int8 codes of each 32 values
    widened as Q8_0's (four ``vpmovsxbw``), each 16 summed under its own scale (d x scale x the block's
    activation scale, converted once per superblock): under half the cycles of decoding Q6_K's bit planes
    (docs/backend-cpu.md#128-bit-kernels)."""
    b = r.b

    def superblock(base, x0, scale):
        for g in range(8):
            blk = b.add(x0, ir.Constant(I64, g))
            parts = [pmaddwd(b, _wide(b, load_at(b, base, 18 + 32 * g + 8 * q, vt(I8, 8)), True), r.x(blk, q))
                     for q in range(4)]  # fmt: skip
            for half in range(2):
                s = b.load(b.gep(scale, [ir.Constant(I64, 2 * g + half)]))
                r.add(2 * g + half, _sum(b, parts[2 * half : 2 * half + 2]), s)

    return _scaled_by_16(r, Q6_K_I8_BYTES, 0, 2, superblock)


# body and whether it subtracts offsets or mins, per GGML type or repacked layout
BODIES: dict[int, tuple[Callable[[_Row], ir.Value], bool]] = {
    **{t: (_one_scale_body(t), v[3] > 0) for t, v in _ONE_SCALE.items()},
    GGMLType.Q4_K: (_kquant_body(False), True),
    GGMLType.Q5_K: (_kquant_body(True), True),
    GGMLType.Q6_K: (_q6_k_body, False),
    Q6_K_I8: (_q6_k_i8_body, False),
}


def make_dot_i16(qtype: int):
    """``dot(w_addr, xq_addr, xd_addr, xs_addr, n_units) -> float32``: one row of ``qtype`` against int16
    activations ``xq`` with per-block scales ``xd`` and per-block sums ``xs`` (float of sum(xq))."""
    body, corr = BODIES[qtype]

    @intrinsic
    def dot(typingctx, w, xq, xd, xs, n):
        sig = types.float32(types.intp, types.intp, types.intp, types.intp, types.intp)

        def codegen(context, b, signature, args):
            return body(_Row(b, args, corr))

        return sig, codegen

    return dot
