"""Decode dot products with int16 activations for hosts with AVX-512BW: a whole 32-value block per instruction.

:mod:`.dot_int16_128bit` builds its kernels from 128-bit operations, the fastest form on cores that split wider ones
in two. A host with AVX-512BW executes 512-bit integer operations whole, so here each 32-value block is
decoded into one ``<32 x i16>`` vector and multiplied with the block's activations by one ``vpmaddwd``, and
its ``<16 x i32>`` pair sums go into 16-lane float accumulators by one conversion and one FMA. Q5_0's fifth
bits become a mask register (``kmovd``) that selects, per value, the nibble or the nibble - 16 in one masked
operation, where the 128-bit code spends a byte shuffle, a mask and a compare per 16 values.

Two layouts the backend repacks at load have kernels here too: Q5_0_X4 (Q5_0 regrouped so that 32 bytes
hold two whole blocks) and Q6_K_I8 (its codes as int8, each block's two 16-value scales applied by one
FMA). Q4_K's d and dmin are converted from memory: as scalar halves they merged into an accumulator's
register (``vpinsrw``) and chained the superblocks. Figures against the 128-bit kernels:
docs/backend-cpu.md#512-bit-kernels.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ...quant.formats import GGMLType
from ...quant.repack import Q5_0_X4_BYTES, Q6_K_I8_BYTES
from .llvm_ir import (
    F32,
    FAST,
    HALF,
    I8,
    I16,
    I32,
    I64,
    as_ptr,
    concat,
    const_vec,
    emit_prefetch,
    host_has,
    hsum,
    load_at,
    load_f32x8,
    load_half,
    pmaddwd,
    ptr,
    splat,
    vt,
)
from .simd import Q5_0_X4, Q6_K_I8, k_scales_mins

# bytes of the weight stream prefetched ahead: farther than dot_int16_128bit's 2 KB, which left the LM head slower on
# an AVX-512 host (figures: docs/backend-cpu.md#prefetching)
PREFETCH_AHEAD = 8192
LANES = 16  # float lanes of an accumulator (the <16 x i32> pair sums of one block)
ACCS = 4  # independent accumulators
GROUP = 8  # one-scale blocks whose fp16 scales are converted at once


class WideRow:
    """One row's dot product: pointers, 16-lane float accumulators and one for offsets and mins."""

    def __init__(self, b: ir.IRBuilder, args):
        w_a, xq_a, xd_a, xs_a, self.n = args
        self.b = b
        self.w = as_ptr(b, w_a, I8)
        self.xq = as_ptr(b, xq_a, vt(I16, 32))  # one vector per 32-value block
        self.xd, self.xs = as_ptr(b, xd_a, F32), as_ptr(b, xs_a, F32)
        zero = ir.Constant(vt(F32, LANES), [0.0] * LANES)
        self.acc = [cgutils.alloca_once_value(b, zero) for _ in range(ACCS)]
        self.corr = cgutils.alloca_once_value(b, ir.Constant(vt(F32, 8), [0.0] * 8))

    @contextmanager
    def units(self, unit_bytes: int, blocks: int) -> Iterator[tuple[ir.Value, ir.Value]]:
        """The loop over the row's units of ``unit_bytes`` bytes and ``blocks`` 32-value blocks, each unit's
        lines prefetched PREFETCH_AHEAD bytes ahead: (the unit's address, its first block's index)."""
        b = self.b
        with cgutils.for_range(b, self.n) as loop:
            base = b.gep(self.w, [b.mul(loop.index, ir.Constant(I64, unit_bytes))])
            for off in range(0, unit_bytes, 64):
                emit_prefetch(b, base, PREFETCH_AHEAD + off)
            yield base, b.mul(loop.index, ir.Constant(I64, blocks))

    def x(self, block: ir.Value) -> ir.Value:
        return self.b.load(self.b.gep(self.xq, [block]), align=2)

    def add(self, slot: int, w: ir.Value, block: ir.Value, scale: ir.Value) -> None:
        """acc += float(pair sums of w . x[block]) * scale (``w`` <32 x i16>, ``scale`` a float)."""
        self.add_lanes(slot, w, block, splat(self.b, scale, LANES))

    def add_lanes(self, slot: int, w: ir.Value, block: ir.Value, scales: ir.Value) -> None:
        """:meth:`add` with a scale per pair-sum lane (``scales`` <16 x float>)."""
        b, acc = self.b, self.acc[slot % ACCS]
        p = b.sitofp(pmaddwd(b, w, self.x(block)), vt(F32, LANES))
        b.store(b.fadd(b.load(acc), b.fmul(p, scales, flags=FAST), flags=FAST), acc)

    def sub(self, v: ir.Value) -> None:
        """Subtract the lanes of the <8 x float> ``v`` from the result."""
        b = self.b
        b.store(b.fadd(b.load(self.corr), v, flags=FAST), self.corr)

    def result(self) -> ir.Value:
        b = self.b
        total = b.load(self.acc[0])
        for a in self.acc[1:]:
            total = b.fadd(total, b.load(a), flags=FAST)
        return b.fsub(hsum(b, total), hsum(b, b.load(self.corr)), flags=FAST)


# -- one-scale 32-value blocks -------------------------------------------------------------------------
def _q8_0_words(b: ir.IRBuilder, base: ir.Value) -> ir.Value:
    return b.sext(load_at(b, base, 2, vt(I8, 32)), vt(I16, 32))


def _with_fifth_bits(b: ir.IRBuilder, nib: ir.Value, qh: ir.Value) -> ir.Value:
    """Q5_0 values - 16 as <32 x i16>: ``nib`` (the low 4 bits of each value) where the value's bit in the
    32-bit word ``qh`` is set, nib - 16 where it is clear (``qh`` a ``kmovd`` mask; a blend)."""
    bits = b.bitcast(qh, vt(ir.IntType(1), 32))
    return b.select(bits, nib, b.sub(nib, const_vec(I16, [16] * 32)))


def _q5_0_words(b: ir.IRBuilder, base: ir.Value) -> ir.Value:
    """value - 16 as words: the 16 bytes widened once (``vpmovzxbw``), low nibbles then high ones."""
    w = b.zext(load_at(b, base, 6, vt(I8, 16)), vt(I16, 16))
    nib = concat(b, b.and_(w, const_vec(I16, [0x0F] * 16)), b.lshr(w, const_vec(I16, [4] * 16)))
    return _with_fifth_bits(b, nib, load_at(b, base, 2, I32))


_ONE_SCALE: dict[int, tuple[int, Callable[[ir.IRBuilder, ir.Value], ir.Value]]] = {
    GGMLType.Q8_0: (34, _q8_0_words),
    GGMLType.Q5_0: (22, _q5_0_words),
}


def _one_scale_body(qtype: int):
    unit, words = _ONE_SCALE[qtype]

    def codegen(r: WideRow) -> ir.Value:
        b = r.b
        n_groups = b.udiv(r.n, ir.Constant(I64, GROUP))
        with cgutils.for_range(b, n_groups) as loop:
            u0 = b.mul(loop.index, ir.Constant(I64, GROUP))
            gbase = b.gep(r.w, [b.mul(u0, ir.Constant(I64, unit))])
            for off in range(0, GROUP * unit, 64):
                emit_prefetch(b, gbase, PREFETCH_AHEAD + off)
            bits = ir.Constant(vt(I16, GROUP), [0] * GROUP)
            for j in range(GROUP):
                bits = b.insert_element(bits, load_at(b, gbase, j * unit, I16), ir.Constant(I32, j))
            dw = b.fpext(b.bitcast(bits, vt(HALF, GROUP)), vt(F32, GROUP))
            scales = b.fmul(dw, load_f32x8(b, r.xd, u0), flags=FAST)
            for j in range(GROUP):
                base, u = b.gep(gbase, [ir.Constant(I64, j * unit)]), b.add(u0, ir.Constant(I64, j))
                r.add(j, words(b, base), u, b.extract_element(scales, ir.Constant(I32, j)))
        start = b.mul(n_groups, ir.Constant(I64, GROUP))
        with cgutils.for_range_slice(b, start, r.n, ir.Constant(I64, 1)) as (u, _):
            base = b.gep(r.w, [b.mul(u, ir.Constant(I64, unit))])
            r.add(0, words(b, base), u, b.fmul(load_half(b, base, 0), b.load(b.gep(r.xd, [u])), flags=FAST))
        return r.result()

    return codegen


# -- Q4_K: 256-value superblocks -----------------------------------------------------------------------
def nibble_words(b: ir.IRBuilder, base: ir.Value, offset: int) -> tuple[ir.Value, ir.Value]:
    """The low and the high nibbles of the 32 bytes at ``offset`` as two <32 x i16> (one ``vpmovzxbw``)."""
    w = b.zext(load_at(b, base, offset, vt(I8, 32)), vt(I16, 32))
    return b.and_(w, const_vec(I16, [0x0F] * 32)), b.lshr(w, const_vec(I16, [4] * 32))


def _q4_k_body(r: WideRow) -> ir.Value:
    """Chunk c's 32 bytes hold sub-block 2c in the low nibbles and 2c + 1 in the high ones: widened once
    (``vpmovzxbw``), masked and shifted into the two sub-blocks' words; the 8 scales (d x scale x the
    sub-block's activation scale) converted once per superblock into a table, mins subtracted as
    dmin x min x activation scale x sum of the sub-block's activations."""
    b = r.b
    table = cgutils.alloca_once(b, vt(F32, 8))
    with r.units(144, 8) as (base, x0):
        sc, mn = k_scales_mins(b, base)
        xd = load_f32x8(b, r.xd, x0)
        # d and dmin converted from memory with the next 4 bytes (``vcvtph2ps xmm, m64``): a scalar half
        # became a ``vpinsrw`` merging into the register of an accumulator, chaining superblocks
        dd = b.fpext(load_at(b, base, 0, vt(HALF, 4)), vt(F32, 4))
        d, dmin = (b.shuffle_vector(dd, dd, const_vec(I32, [i] * 8)) for i in (0, 1))
        b.store(b.fmul(b.fmul(sc, d, flags=FAST), xd, flags=FAST), table)
        mins = b.fmul(b.fmul(mn, dmin, flags=FAST), xd, flags=FAST)
        r.sub(b.fmul(mins, load_f32x8(b, r.xs, x0), flags=FAST))
        scale = b.bitcast(table, ptr(F32))
        for c in range(4):
            for k, words in enumerate(nibble_words(b, base, 16 + 32 * c)):
                blk = b.add(x0, ir.Constant(I64, 2 * c + k))
                r.add(k, words, blk, b.load(b.gep(scale, [ir.Constant(I64, 2 * c + k)])))
    return r.result()


# -- Q5_0_X4: four Q5_0 blocks regrouped at load (workbench.quant.repack) -------------------------------
def _q5_0_x4_body(r: WideRow) -> ir.Value:
    """Each 32-byte nibble pair widened once (``vpmovzxbw``) and masked or shifted into two whole blocks in
    value order (no cross-lane concatenation); nibble - 16 where a value's fifth bit (a ``kmovd`` mask) is
    clear; the 4 scales converted at once. (Scales from a table in memory as broadcast FMA operands instead
    of register shuffles: the same speed.)"""
    b = r.b
    with r.units(Q5_0_X4_BYTES, 4) as (base, x0):
        dw = b.fpext(load_at(b, base, 0, vt(HALF, 4)), vt(F32, 4))
        scales = b.fmul(dw, b.load(b.bitcast(b.gep(r.xd, [x0]), ptr(vt(F32, 4))), align=4), flags=FAST)
        for p in range(2):
            for k, nib in enumerate(nibble_words(b, base, 24 + 32 * p)):
                g = 2 * p + k
                words = _with_fifth_bits(b, nib, load_at(b, base, 8 + 4 * g, I32))
                blk = b.add(x0, ir.Constant(I64, g))
                r.add(g, words, blk, b.extract_element(scales, ir.Constant(I32, g)))
    return r.result()


# -- Q6_K_I8: Q6_K with int8 codes (workbench.quant.repack) ---------------------------------------------
def _q6_k_i8_body(r: WideRow) -> ir.Value:
    """Each 32 codes widened as Q8_0's (one ``vpmovsxbw``); their pair sums 0-7 and 8-15 cover values 0-15
    and 16-31, so one FMA applies both 16-value scales (d x scale x the block's activation scale, from the
    16 scales converted once per superblock)."""
    b = r.b
    with r.units(Q6_K_I8_BYTES, 8) as (base, x0):
        d = b.fpext(
            load_at(b, base, 0, vt(HALF, 4)), vt(F32, 4)
        )  # d and the first scale bytes (vcvtph2ps m64)
        sc = b.sitofp(b.sext(load_at(b, base, 2, vt(I8, 16)), vt(I32, 16)), vt(F32, LANES))
        sc = b.fmul(sc, b.shuffle_vector(d, d, const_vec(I32, [0] * LANES)), flags=FAST)
        xd = load_f32x8(b, r.xd, x0)
        for g in range(8):
            words = b.sext(load_at(b, base, 18 + 32 * g, vt(I8, 32)), vt(I16, 32))
            lanes = b.shuffle_vector(sc, sc, const_vec(I32, [2 * g] * 8 + [2 * g + 1] * 8))
            xg = b.shuffle_vector(xd, xd, const_vec(I32, [g] * LANES))
            r.add_lanes(g, words, b.add(x0, ir.Constant(I64, g)), b.fmul(lanes, xg, flags=FAST))
    return r.result()


BODIES: dict[int, Callable[[WideRow], ir.Value]] = {
    **{t: _one_scale_body(t) for t in _ONE_SCALE},
    GGMLType.Q4_K: _q4_k_body,
    Q5_0_X4: _q5_0_x4_body,
    Q6_K_I8: _q6_k_i8_body,
}


def make_dot_i16_wide(qtype: int):
    """``dot(w_addr, xq_addr, xd_addr, xs_addr, n_units) -> float32`` (the signature of
    :func:`.dot_int16_128bit.make_dot_i16`) for Q8_0, Q5_0, Q4_K, Q5_0_X4 and Q6_K_I8 rows, in 512-bit operations."""
    body = BODIES[qtype]

    @intrinsic
    def dot(typingctx, w, xq, xd, xs, n):
        sig = types.float32(types.intp, types.intp, types.intp, types.intp, types.intp)

        def codegen(context, b, signature, args):
            return body(WideRow(b, args))

        return sig, codegen

    return dot


# "wide" | "avx2" | "narrow" | unset: the widest kernels the host runs whole
KERNELS_ENV = "WORKBENCH_CPU_KERNELS"
KERNEL_CHOICES = ("wide", "avx2", "narrow")


def kernels_choice() -> str:
    """``WORKBENCH_CPU_KERNELS`` ("" when unset): ``wide`` the 512-bit kernels, ``avx2`` the 256-bit ones
    where a format has them (:mod:`.dot_int16_256bit`), ``narrow`` only the 128-bit ones."""
    choice = os.environ.get(KERNELS_ENV, "").strip().lower()
    if choice and choice not in KERNEL_CHOICES:
        raise ValueError(f"{KERNELS_ENV} must be one of {', '.join(KERNEL_CHOICES)}, got {choice!r}")
    return choice


def use_wide_kernels() -> bool:
    """Whether the decode matvecs use these kernels: on hosts whose LLVM features include AVX-512BW, unless
    ``WORKBENCH_CPU_KERNELS`` names another choice (``=wide`` forces them: correct anywhere, slow without AVX-512)."""
    choice = kernels_choice()
    if choice:
        return choice == "wide"
    return host_has("avx512bw")
