"""Decode dot products of GGUF blocks with int16 activations (the decode matvec's hot loop), per format.

Activations are quantized per 32-value block to int16 (:func:`.matvec.quantize_rows_i16`). Each weight
block is decoded to bytes at 128-bit width, widened to two vectors of 16 words (``vpmovsxbw`` /
``vpmovzxbw``, from memory where the bytes are stored as they are used), multiplied with ``vpmaddwd``
(16 word pairs -> 8 x i32), converted to float once and FMA'd with the block's combined scale (weight
scale x activation scale) into float accumulators kept across the row; one horizontal sum per row.

On Zen1 (AVX2, each 256-bit operation two micro-ops) the count of micro-ops per block sets the speed:
measured with hand-written loops on this machine, a Q8_0 block costs ~6.8 cycles this way and ~6.9 with
llama.cpp's int8 ``vpmaddubsw`` path, so int16 activations (more accurate) cost nothing extra. Tricks that
save micro-ops:

* nibbles are masked in place after widening where possible: ``word & 0x0F`` is the low nibble,
  ``word & 0xF0`` sixteen times the high one; the factor 16 goes into the float scale (exact);
* Q5_0 builds signed bytes in one step (ggml's trick): ``nibble | (bit ? 0 : 0xF0)`` is value - 16;
* constant offsets that would cost an operation per byte (Q4_0: 8) are subtracted once per block as
  ``offset x scale x sum(x)`` (``xs``: per-block sums of the int16 activations).
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ...quant.formats import GGMLType
from .simd import (
    F32,
    FAST,
    HALF,
    I8,
    I16,
    I32,
    I64,
    _as_ptr,
    _const_vec,
    _half,
    _hsum,
    _load,
    _prefetch,
    _splat,
    ptr,
    vt,
)

ACCS = 2  # float accumulators per row (independent FMA chains)
PREFETCH_AHEAD = 2048  # bytes of the weight stream prefetched ahead (measured: 1-4 KB alike, none 20% slower)


def _bytes(v: int, n: int = 16) -> ir.Constant:
    return _const_vec(I8, [v if v < 128 else v - 256] * n)


def _words(v: int) -> ir.Constant:
    return _const_vec(I16, [v] * 16)


def _madd(b: ir.IRBuilder, w: ir.Value, x: ir.Value) -> ir.Value:
    """<8 x i32> pair sums of two <16 x i16> products (lowered to vpmaddwd)."""
    m = b.mul(b.sext(w, vt(I32, 16)), b.sext(x, vt(I32, 16)), flags=("nsw",))
    even = b.shuffle_vector(m, m, _const_vec(I32, range(0, 16, 2)))
    odd = b.shuffle_vector(m, m, _const_vec(I32, range(1, 16, 2)))
    return b.add(even, odd, flags=("nsw",))


def _wide(b: ir.IRBuilder, v: ir.Value, signed: bool) -> ir.Value:
    return (b.sext if signed else b.zext)(v, vt(I16, 16))


def _resize(b: ir.IRBuilder, v: ir.Value, n: int) -> ir.Value:
    """A float vector to ``n`` lanes: zero-padded, or its lane groups of ``n`` added."""
    m = v.type.count
    if m < n:
        return b.shuffle_vector(
            v, ir.Constant(v.type, [0.0] * m), _const_vec(I32, [*range(m), *[m] * (n - m)])
        )
    while m > n:
        m //= 2
        v = b.fadd(b.shuffle_vector(v, v, _const_vec(I32, range(m))), b.shuffle_vector(v, v, _const_vec(I32, range(m, 2 * m))),
                   flags=FAST)  # fmt: skip
    return v


def _halves(b: ir.IRBuilder, v: ir.Value) -> tuple[ir.Value, ir.Value]:
    """The two <16 x i8> halves of a <32 x i8>."""
    return (
        b.shuffle_vector(v, v, _const_vec(I32, range(16))),
        b.shuffle_vector(v, v, _const_vec(I32, range(16, 32))),
    )


class _Row:
    """Codegen state of one row's dot product: the pointers, accumulators and helpers the bodies share."""

    def __init__(self, b: ir.IRBuilder, args, corr: bool, lanes: int):
        w_a, xq_a, xd_a, xs_a, self.n = args
        self.b, self.lanes = b, lanes
        self.w = _as_ptr(b, w_a, I8)
        self.xq = _as_ptr(b, xq_a, vt(I16, 16))  # two vectors per 32-value block
        self.xq8 = _as_ptr(b, xq_a, vt(I16, 8))  # four
        self.xd, self.xs = _as_ptr(b, xd_a, F32), _as_ptr(b, xs_a, F32)
        zero = ir.Constant(vt(F32, lanes), [0.0] * lanes)
        self.acc = [cgutils.alloca_once_value(b, zero) for _ in range(ACCS)]
        # offsets and mins, subtracted at the end
        self.corr = cgutils.alloca_once_value(b, zero) if corr else None

    def x(self, block: ir.Value, half: int) -> ir.Value:
        """Activation words 16 half .. 16 half + 15 of 32-value ``block``."""
        idx = self.b.add(self.b.mul(block, ir.Constant(I64, 2)), ir.Constant(I64, half))
        return self.b.load(self.b.gep(self.xq, [idx]), align=2)

    def x8(self, block: ir.Value, quarter: int) -> ir.Value:
        """Activation words 8 quarter .. 8 quarter + 7 of 32-value ``block``."""
        idx = self.b.add(self.b.mul(block, ir.Constant(I64, 4)), ir.Constant(I64, quarter))
        return self.b.load(self.b.gep(self.xq8, [idx]), align=2)

    def dot(self, block: ir.Value, w0: ir.Value, w1: ir.Value) -> ir.Value:
        """<8 x i32>: a 32-value block's words against its activations."""
        b = self.b
        return b.add(_madd(b, w0, self.x(block, 0)), _madd(b, w1, self.x(block, 1)), flags=("nsw",))

    def vec8(self, p: ir.Value, u: ir.Value) -> ir.Value:
        """<8 x float> at ``p[u]`` (xd or xs of 8 blocks)."""
        return self.b.load(self.b.bitcast(self.b.gep(p, [u]), ptr(vt(F32, 8))), align=4)

    def add(self, slot: int, p: ir.Value, scale: ir.Value) -> None:
        """acc += float(p) * scale (one FMA; ``scale`` a float, splatted; p has the accumulators' lanes)."""
        b, acc, n = self.b, self.acc[slot % ACCS], self.lanes
        term = b.fmul(b.sitofp(p, vt(F32, n)), _splat(b, scale, n), flags=FAST)
        b.store(b.fadd(b.load(acc), term, flags=FAST), acc)

    def sub(self, v: ir.Value) -> None:
        """Subtract the lanes of <8 x float> ``v`` from the result."""
        self.b.store(self.b.fadd(self.b.load(self.corr), v, flags=FAST), self.corr)

    def sub1(self, v: ir.Value) -> None:
        self.sub(
            self.b.insert_element(
                ir.Constant(vt(F32, self.lanes), [0.0] * self.lanes), v, ir.Constant(I32, 0)
            )
        )

    def result(self) -> ir.Value:
        b = self.b
        total = b.load(self.acc[0])
        for a in self.acc[1:]:
            total = b.fadd(total, b.load(a), flags=FAST)
        if self.corr is not None:
            total = b.fsub(total, b.load(self.corr), flags=FAST)
        return _hsum(b, total)


# -- one-scale 32-value blocks: Q8_0, Q4_0, Q5_0 ------------------------------------------------------
def _fold(b: ir.IRBuilder, p: ir.Value) -> ir.Value:
    """<8 x i32> -> <4 x i32>: lanes i + lanes i + 4 (an extract and an add instead of a 256-bit
    conversion and FMA: fewer micro-ops on Zen1)."""
    return b.add(b.shuffle_vector(p, p, _const_vec(I32, range(4))), b.shuffle_vector(p, p, _const_vec(I32, range(4, 8))),
                 flags=("nsw",))  # fmt: skip


def _q8_0_block(r: _Row, base, u) -> ir.Value:
    b = r.b
    w0, w1 = (_wide(b, _load(b, base, off, vt(I8, 16)), True) for off in (2, 18))
    return _fold(b, r.dot(u, w0, w1))


def _q4_0_block(r: _Row, base, u) -> ir.Value:
    b = r.b
    q = _load(b, base, 2, vt(I8, 16))
    return r.dot(u, _wide(b, b.and_(q, _bytes(0x0F)), False), _wide(b, b.lshr(q, _bytes(4)), False))


def _q5_0_block(r: _Row, base, u) -> ir.Value:
    """Words 16 x (value - 16), built by byte unpacks: the low byte 16 x the nibble (the high nibbles in
    place), the high byte -1 where the value's qh bit is clear, else 0; <4 x i32> pair sums."""
    b = r.b
    q = _load(b, base, 6, vt(I8, 16))
    nib16 = (b.and_(b.shl(q, _bytes(4)), _bytes(0xF0)), b.and_(q, _bytes(0xF0)))  # values 0-15, 16-31
    qh = b.bitcast(_splat(b, _load(b, base, 2, I32), 4), vt(I8, 16))
    bit = _const_vec(I8, [(1 << k) - 256 if k == 7 else 1 << k for k in range(8)] * 2)
    total = None
    for half, nib in enumerate(nib16):
        spread = b.shuffle_vector(qh, qh, _const_vec(I32, [2 * half] * 8 + [2 * half + 1] * 8))
        clear = b.sext(b.icmp_unsigned("==", b.and_(spread, bit), _bytes(0)), vt(I8, 16))
        for k in range(2):  # bytes 0-7 / 8-15 of the half as words
            sel = [i for j in range(8 * k, 8 * k + 8) for i in (j, 16 + j)]
            w = b.bitcast(b.shuffle_vector(nib, clear, _const_vec(I32, sel)), vt(I16, 8))
            m = b.mul(b.sext(w, vt(I32, 8)), b.sext(r.x8(u, 2 * half + k), vt(I32, 8)), flags=("nsw",))
            p = b.add(b.shuffle_vector(m, m, _const_vec(I32, range(0, 8, 2))),
                      b.shuffle_vector(m, m, _const_vec(I32, range(1, 8, 2))), flags=("nsw",))  # fmt: skip
            total = p if total is None else b.add(total, p, flags=("nsw",))
    return total


# (unit bytes, block -> <lanes x i32>, blocks per group (scales converted at once; more spill registers),
#  accumulator lanes, offset subtracted as offset x scale x sum(x), factor of the scale)
_ONE_SCALE: dict[GGMLType, tuple[int, Callable, int, int, int, float]] = {
    GGMLType.Q8_0: (34, _q8_0_block, 8, 4, 0, 1.0),
    GGMLType.Q4_0: (18, _q4_0_block, 4, 8, 8, 1.0),
    GGMLType.Q5_0: (22, _q5_0_block, 4, 4, 0, 1 / 16),
}


def _one_scale_body(qtype: GGMLType):
    unit, block, group_n, _, offset, factor = _ONE_SCALE[qtype]

    def group(r: _Row, u0: ir.Value, n: int) -> None:
        """Blocks u0 .. u0 + n - 1 (n = 8 or 4): their fp16 scales converted at once (one vcvtph2ps)."""
        b = r.b
        gbase = b.gep(r.w, [b.mul(u0, ir.Constant(I64, unit))])
        for off in range(0, n * unit, 64):
            _prefetch(b, gbase, PREFETCH_AHEAD + off)
        bits = ir.Constant(vt(I16, n), [0] * n)
        for j in range(n):
            bits = b.insert_element(bits, _load(b, gbase, j * unit, I16), ir.Constant(I32, j))
        xd = b.load(b.bitcast(b.gep(r.xd, [u0]), ptr(vt(F32, n))), align=4)
        scales = b.fmul(b.fpext(b.bitcast(bits, vt(HALF, n)), vt(F32, n)), xd, flags=FAST)
        if factor != 1.0:
            scales = b.fmul(scales, _const_vec(F32, [factor] * n), flags=FAST)
        for j in range(n):
            p = block(r, b.gep(gbase, [ir.Constant(I64, j * unit)]), b.add(u0, ir.Constant(I64, j)))
            r.add(j, p, b.extract_element(scales, ir.Constant(I32, j)))
        if offset:
            xs = b.load(b.bitcast(b.gep(r.xs, [u0]), ptr(vt(F32, n))), align=4)
            corr = b.fmul(b.fmul(scales, xs, flags=FAST), _const_vec(F32, [offset / factor] * n), flags=FAST)
            r.sub(_resize(b, corr, r.lanes))

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
            scale = b.fmul(b.fmul(_half(b, base, 0), b.load(b.gep(r.xd, [u])), flags=FAST), ir.Constant(F32, factor),
                           flags=FAST)  # fmt: skip
            r.add(0, block(r, base, u), scale)
            if offset:
                xs = b.load(b.gep(r.xs, [u]))
                r.sub1(b.fmul(b.fmul(scale, xs, flags=FAST), ir.Constant(F32, offset / factor), flags=FAST))
        return r.result()

    return codegen


# -- k-quants: 256-value superblocks -------------------------------------------------------------------
def _k_scales_mins(b, base) -> tuple[ir.Value, ir.Value]:
    """The 8 six-bit scales and mins of a Q4_K/Q5_K superblock (bytes 4-15) as two <8 x float>
    (ggml's unpacking done on three 32-bit words, as its SIMD code does)."""
    u0, u1, u2 = (_load(b, base, 4 + 4 * i, I32) for i in range(3))

    def c(v):
        return ir.Constant(I32, v)

    m1, m2, m3 = c(0x3F3F3F3F), c(0x0F0F0F0F), c(0x03030303)
    sc_lo = b.and_(u0, m1)
    sc_hi = b.or_(b.and_(u2, m2), b.shl(b.and_(b.lshr(u0, c(6)), m3), c(4)))
    mn_lo = b.and_(u1, m1)
    mn_hi = b.or_(b.and_(b.lshr(u2, c(4)), m2), b.shl(b.and_(b.lshr(u1, c(6)), m3), c(4)))

    def floats(lo, hi):
        pair = b.insert_element(b.insert_element(ir.Constant(vt(I32, 2), None), lo, c(0)), hi, c(1))
        return b.uitofp(b.zext(b.bitcast(pair, vt(I8, 8)), vt(I32, 8)), vt(F32, 8))

    return floats(sc_lo, sc_hi), floats(mn_lo, mn_hi)


def _kquant_body(high_bits: bool):
    """Q4_K (``high_bits`` False) and Q5_K: chunk c's 32 bytes hold sub-block 2c in the low nibbles and
    2c + 1 in the high nibbles (plus, for Q5_K, bits 2c and 2c + 1 of the 32 qh bytes): each half of the
    chunk is widened once, then masked to the low nibbles and to 16 x the high ones."""
    unit, qs_off = (176, 48) if high_bits else (144, 16)
    parity = _const_vec(F32, [1.0, 1 / 16] * 4)  # sub-blocks 2c + 1 are read as 16 x their values

    def codegen(r: _Row) -> ir.Value:
        b = r.b
        stack = cgutils.alloca_once(b, vt(F32, 8))
        with cgutils.for_range(b, r.n) as loop:
            u = loop.index
            base = b.gep(r.w, [b.mul(u, ir.Constant(I64, unit))])
            for off in range(0, unit, 64):
                _prefetch(b, base, PREFETCH_AHEAD + off)
            x0 = b.mul(u, ir.Constant(I64, 8))
            d, dmin = _half(b, base, 0), _half(b, base, 2)
            sc, mn = _k_scales_mins(b, base)
            xd = r.vec8(r.xd, x0)
            b.store(
                b.fmul(b.fmul(b.fmul(sc, _splat(b, d, 8), flags=FAST), xd, flags=FAST), parity, flags=FAST),
                stack,
            )
            mins = b.fmul(b.fmul(mn, _splat(b, dmin, 8), flags=FAST), xd, flags=FAST)
            r.sub(b.fmul(mins, r.vec8(r.xs, x0), flags=FAST))
            scale = b.bitcast(stack, ptr(F32))
            for c in range(4):
                lo, hi = [], []
                for half in range(2):
                    w = _wide(b, _load(b, base, qs_off + 32 * c + 16 * half, vt(I8, 16)), False)
                    lw, hw = b.and_(w, _words(0x0F)), b.and_(w, _words(0xF0))
                    if (
                        high_bits
                    ):  # +16 on the low nibble for bit 2c, +256 on 16 x the high one for bit 2c + 1
                        qh = _wide(b, _load(b, base, 16 + 16 * half, vt(I8, 16)), False)
                        for bit, add in ((1 << (2 * c), 16), (2 << (2 * c), 256)):
                            set_ = b.icmp_unsigned("!=", b.and_(qh, _words(bit)), _words(0))
                            term = b.select(set_, _words(add), _words(0))
                            if add == 16:
                                lw = b.or_(lw, term)
                            else:
                                hw = b.add(hw, term)
                    lo.append(lw)
                    hi.append(hw)
                for k, (w0, w1) in enumerate((lo, hi)):
                    j = 2 * c + k
                    r.add(
                        k,
                        r.dot(b.add(x0, ir.Constant(I64, j)), w0, w1),
                        b.load(b.gep(scale, [ir.Constant(I64, j)])),
                    )
        return r.result()

    return codegen


def _q6_k_body(r: _Row) -> ir.Value:
    """Q6_K: per half h (128 values) ql bytes 64h..64h+63, qh bytes 128+32h..; value l of group k (0-3) has
    the low nibble (k < 2) or high nibble (k >= 2) of ql[l + 32 (k % 2)] and bits 2k, 2k + 1 of qh[l]; 16
    int8 scales (bytes 192-207), one per 16 values; d at 208. Each group is built as 32 signed bytes
    (value - 32) and widened; its two 16-value halves have their own scale."""
    b = r.b
    stack = cgutils.alloca_once(b, vt(F32, 16))
    dup = _const_vec(I32, [i // 2 for i in range(16)])
    with cgutils.for_range(b, r.n) as loop:
        u = loop.index
        base = b.gep(r.w, [b.mul(u, ir.Constant(I64, 210))])
        for off in range(0, 210, 64):
            _prefetch(b, base, PREFETCH_AHEAD + off)
        x0 = b.mul(u, ir.Constant(I64, 8))
        d = _half(b, base, 208)
        sc = b.sitofp(b.sext(_load(b, base, 192, vt(I8, 16)), vt(I32, 16)), vt(F32, 16))
        xd = r.vec8(r.xd, x0)
        b.store(
            b.fmul(b.fmul(sc, _splat(b, d, 16), flags=FAST), b.shuffle_vector(xd, xd, dup), flags=FAST), stack
        )
        scale = b.bitcast(stack, ptr(F32))
        for h in range(2):
            ql = [_load(b, base, 64 * h + 32 * i, vt(I8, 32)) for i in range(2)]
            qh = _load(b, base, 128 + 32 * h, vt(I8, 32))
            for k in range(4):
                nib = b.and_(ql[k], _bytes(0x0F, 32)) if k < 2 else b.lshr(ql[k - 2], _bytes(4, 32))
                shift = 4 - 2 * k
                high = (
                    b.shl(qh, _bytes(shift, 32))
                    if shift > 0
                    else b.lshr(qh, _bytes(-shift, 32))
                    if shift
                    else qh
                )
                v = b.sub(b.or_(nib, b.and_(high, _bytes(0x30, 32))), _bytes(32, 32))
                g = 4 * h + k
                blk = b.add(x0, ir.Constant(I64, g))
                for half, v16 in enumerate(_halves(b, v)):
                    p = _madd(b, _wide(b, v16, True), r.x(blk, half))
                    r.add(half, p, b.load(b.gep(scale, [ir.Constant(I64, 2 * g + half)])))
    return r.result()


# body, whether it subtracts offsets or mins, accumulator lanes
BODIES: dict[GGMLType, tuple[Callable[[_Row], ir.Value], bool, int]] = {
    **{t: (_one_scale_body(t), v[4] > 0, v[3]) for t, v in _ONE_SCALE.items()},
    GGMLType.Q4_K: (_kquant_body(False), True, 8),
    GGMLType.Q5_K: (_kquant_body(True), True, 8),
    GGMLType.Q6_K: (_q6_k_body, False, 8),
}


def make_dot_i16(qtype: GGMLType):
    """``dot(w_addr, xq_addr, xd_addr, xs_addr, n_units) -> float32``: one row of ``qtype`` against int16
    activations ``xq`` with per-block scales ``xd`` and per-block sums ``xs`` (float of sum(xq))."""
    body, corr, lanes = BODIES[qtype]

    @intrinsic
    def dot(typingctx, w, xq, xd, xs, n):
        sig = types.float32(types.intp, types.intp, types.intp, types.intp, types.intp)

        def codegen(context, b, signature, args):
            return body(_Row(b, args, corr, lanes))

        return sig, codegen

    return dot
