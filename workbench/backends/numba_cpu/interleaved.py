"""Decode matvecs on rows interleaved 16 at a time (Q8_0_R16, Q5_0_R16; :mod:`workbench.quant.repack`).

The row-by-row kernels (:mod:`.dotwide`) spend per 32-value block of a row one ``vpmaddwd``, one conversion
to float and one FMA, plus the block's decoding. Here a 512-bit vector holds values ``2k, 2k + 1`` of 16
rows, and the activations' pair ``2k, 2k + 1`` is one broadcast int32: ``vpdpwssd`` accumulates the pair's
products into the 16 rows' int32 lanes, 16 such per block, then one conversion and one FMA (by the 16 rows'
scales times the block's activation scale) per block *of 16 rows*. The integer sums are those of the row
kernels (exact), so only the order of the float sums differs.

Measured on the 2-vCPU Zen 5 VM (one thread, 256 x 2048 weights in L2, ns per 32 values of a row): Q8_0
0.746 -> 0.432, Q5_0 (against Q5_0_X4) 0.856 -> 0.501.

On a host without AVX512-VNNI the same arithmetic is emitted as plain IR (``vpmaddwd`` and an add):
correct anywhere, and the backend interleaves by default only where ``vpdpwssd`` exists.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..._numba import numba
from ...quant.repack import Q5_0_BYTES, Q8_0_BYTES, ROW_GROUP
from .addr import u8_ptr
from .dotvnni import HAS_VNNI
from .dotwide import PREFETCH_AHEAD
from .simd import (
    F32,
    FAST,
    HALF,
    I8,
    I16,
    I32,
    I64,
    Q5_0_R16,
    Q8_0_R16,
    _as_ptr,
    _const_vec,
    _load,
    _pmaddwd,
    _prefetch,
    _splat,
    ptr,
    vt,
)

njit = numba.njit
LANES = ROW_GROUP  # int32 / float lanes: one per row
_UNIT = {Q8_0_R16: ROW_GROUP * Q8_0_BYTES, Q5_0_R16: ROW_GROUP * Q5_0_BYTES}  # bytes of a block of 16 rows


def _dpwssd(b: ir.IRBuilder, acc: ir.Value, w: ir.Value, x: ir.Value) -> ir.Value:
    """acc + per int32 lane the sum of 2 products of the int16 pairs of ``w`` and ``x`` (<32 x i16>):
    ``vpdpwssd``, or on a host without AVX512-VNNI the same in plain IR."""
    if not HAS_VNNI:
        return b.add(acc, _pmaddwd(b, w, x), flags=("nsw",))
    name = "llvm.x86.avx512.vpdpwssd.512"
    fn = b.module.globals.get(name) or ir.Function(
        b.module, ir.FunctionType(vt(I32, LANES), [vt(I32, LANES)] * 3), name
    )
    return b.call(fn, [acc, b.bitcast(w, vt(I32, LANES)), b.bitcast(x, vt(I32, LANES))])


def _q8_0_slots(b: ir.IRBuilder, base: ir.Value) -> list[ir.Value]:
    """The 16 pair slots of a Q8_0_R16 block as <32 x i16> (``vpmovsxbw`` from memory)."""
    return [b.sext(_load(b, base, 32 + 32 * k, vt(I8, 32)), vt(I16, 32)) for k in range(16)]


def _q5_0_slots(b: ir.IRBuilder, base: ir.Value) -> list[ir.Value]:
    """The 16 pair slots of a Q5_0_R16 block as <32 x i16> values - 16: each nibble slot widened once
    (``vpmovzxbw``), masked and shifted into slots p and p + 8; nibble - 16 where the fifth bit (a ``kmovd``
    mask from memory) is clear."""
    slots: list[ir.Value] = [None] * 16
    for p in range(8):
        w = b.zext(_load(b, base, 96 + 32 * p, vt(I8, 32)), vt(I16, 32))
        for k, nib in (
            (p, b.and_(w, _const_vec(I16, [0x0F] * 32))),
            (p + 8, b.lshr(w, _const_vec(I16, [4] * 32))),
        ):
            bits = b.bitcast(_load(b, base, 32 + 4 * k, I32), vt(ir.IntType(1), 32))
            slots[k] = b.select(bits, nib, b.sub(nib, _const_vec(I16, [16] * 32)))
    return slots


def _body(b: ir.IRBuilder, args, fmt: int) -> None:
    w_a, xq_a, xd_a, n, out_a = args
    unit, slots = _UNIT[fmt], _q8_0_slots if fmt == Q8_0_R16 else _q5_0_slots
    w, xq, xd = _as_ptr(b, w_a, I8), _as_ptr(b, xq_a, I32), _as_ptr(b, xd_a, F32)
    zero = ir.Constant(vt(F32, LANES), [0.0] * LANES)
    accs = [cgutils.alloca_once_value(b, zero) for _ in range(2)]

    def block(u: ir.Value, slot: int) -> None:
        base = b.gep(w, [b.mul(u, ir.Constant(I64, unit))])
        for off in range(0, unit, 64):
            _prefetch(b, base, PREFETCH_AHEAD + off)
        xscale = _splat(b, b.load(b.gep(xd, [u])), LANES)
        scales = b.fmul(b.fpext(_load(b, base, 0, vt(HALF, LANES)), vt(F32, LANES)), xscale, flags=FAST)
        parts = [ir.Constant(vt(I32, LANES), [0] * LANES)] * 4  # four chains of vpdpwssd
        for k, v in enumerate(slots(b, base)):
            pair = b.load(b.gep(xq, [b.add(b.mul(u, ir.Constant(I64, 16)), ir.Constant(I64, k))]), align=4)
            parts[k % 4] = _dpwssd(b, parts[k % 4], v, b.bitcast(_splat(b, pair, LANES), vt(I16, 32)))
        total = b.add(b.add(parts[0], parts[1]), b.add(parts[2], parts[3]))
        acc = accs[slot]
        b.store(
            b.fadd(b.load(acc), b.fmul(b.sitofp(total, vt(F32, LANES)), scales, flags=FAST), flags=FAST), acc
        )

    pairs = b.udiv(n, ir.Constant(I64, 2))
    with cgutils.for_range(b, pairs) as loop:
        for s in range(2):
            block(b.add(b.mul(loop.index, ir.Constant(I64, 2)), ir.Constant(I64, s)), s)
    with cgutils.if_unlikely(b, b.icmp_unsigned("!=", b.mul(pairs, ir.Constant(I64, 2)), n)):
        block(b.sub(n, ir.Constant(I64, 1)), 0)
    result = b.fadd(b.load(accs[0]), b.load(accs[1]), flags=FAST)
    b.store(result, b.inttoptr(out_a, ptr(vt(F32, LANES))), align=4)


def make_dot_r16(fmt: int):
    """``dot16(w_addr, xq_addr, xd_addr, n_blocks, out_addr)``: 16 interleaved rows of ``fmt`` (their group's
    first byte at ``w_addr``) against int16 activations with per-block scales ``xd``; the 16 dot products
    stored as float32 at ``out_addr``."""

    @intrinsic
    def dot16(typingctx, w, xq, xd, n, out):
        sig = types.void(types.intp, types.intp, types.intp, types.intp, types.intp)

        def codegen(context, b, signature, args):
            _body(b, args, fmt)
            return context.get_dummy_value()

        return sig, codegen

    return dot16


dot16_q8_0, dot16_q5_0 = make_dot_r16(Q8_0_R16), make_dot_r16(Q5_0_R16)


@njit(cache=True)
def _dot16(fmt, ga, q, d, n_blocks, oa):  # pragma: no cover - compiled
    if fmt == Q8_0_R16:
        dot16_q8_0(ga, q, d, n_blocks, oa)
    else:
        dot16_q5_0(ga, q, d, n_blocks, oa)


@njit(cache=True)
def rows_i16(fmt, wa, rb, n_blocks, r0, r1, xq, xd, out, c0):  # pragma: no cover - compiled
    """out[t, c0 + n - r0] = row n of the interleaved weight at ``wa`` (``rb`` bytes a row) . activation
    row t (int16 codes at the start of each row of ``xq``), for rows r0..r1. Whole groups inside r0..r1
    are stored in place; a group cut by r0 or r1 is computed whole and the rows asked for copied."""
    buf = np.empty(0, np.float32)
    for t in range(xq.shape[0]):
        q, d = xq.ctypes.data + t * xq.strides[0], xd.ctypes.data + t * xd.strides[0]
        row = out.ctypes.data + t * out.strides[0]
        for g in range(r0 // ROW_GROUP, (r1 + ROW_GROUP - 1) // ROW_GROUP):
            n0 = g * ROW_GROUP
            ga = wa + n0 * rb
            if n0 >= r0 and n0 + ROW_GROUP <= r1 and out.strides[1] == 4:
                _dot16(fmt, ga, q, d, n_blocks, row + (c0 + n0 - r0) * 4)
            else:
                if buf.shape[0] == 0:
                    buf = np.empty(ROW_GROUP, np.float32)
                _dot16(fmt, ga, q, d, n_blocks, buf.ctypes.data)
                for n in range(max(n0, r0), min(n0 + ROW_GROUP, r1)):
                    out[t, c0 + n - r0] = buf[n - n0]


@njit(cache=True)
def gguf_row(fmt, wa, rb, n, dst):  # pragma: no cover - compiled
    """Write row ``n`` of the interleaved weight at ``wa`` into ``dst`` (uint8, ``rb`` bytes) as its GGUF
    blocks (Q8_0 or Q5_0), for the kernels that read rows one by one."""
    lane = n % ROW_GROUP
    src = numba.carray(u8_ptr(wa + (n - lane) * rb), (ROW_GROUP * rb,))
    if fmt == Q8_0_R16:
        unit = ROW_GROUP * Q8_0_BYTES
        for blk in range(rb // Q8_0_BYTES):
            s, o = blk * unit, blk * Q8_0_BYTES
            dst[o], dst[o + 1] = src[s + 2 * lane], src[s + 2 * lane + 1]
            for k in range(16):
                for j in range(2):
                    dst[o + 2 + 2 * k + j] = src[s + 32 + 32 * k + 2 * lane + j]
    else:
        unit = ROW_GROUP * Q5_0_BYTES
        for blk in range(rb // Q5_0_BYTES):
            s, o = blk * unit, blk * Q5_0_BYTES
            dst[o], dst[o + 1] = src[s + 2 * lane], src[s + 2 * lane + 1]
            qh = np.uint32(0)
            for k in range(16):
                w = s + 32 + 4 * k
                word = (np.uint32(src[w]) | (np.uint32(src[w + 1]) << 8) | (np.uint32(src[w + 2]) << 16)
                        | (np.uint32(src[w + 3]) << 24))  # fmt: skip
                qh |= ((word >> np.uint32(2 * lane)) & np.uint32(3)) << np.uint32(2 * k)
            for i in range(4):
                dst[o + 2 + i] = np.uint8((qh >> np.uint32(8 * i)) & np.uint32(0xFF))
            for p in range(8):
                for j in range(2):
                    dst[o + 6 + 2 * p + j] = src[s + 96 + 32 * p + 2 * lane + j]
