"""Decode dot products with int16 activations in 256-bit operations, bit-identical to :mod:`.dot_int16_128bit`.

On AVX2 cores with 256-bit datapaths (Intel's big cores, AMD Zen 2 and later) one ``vpmaddwd`` takes 16
word pairs. These kernels compute the same integers as the 128-bit ones and then the same float
operations, lane for lane, so a row's result has the same bits:

* Q4_K: 16 weight bytes are widened at once (``vpmovzxbw ymm``) and masked into the low nibbles and 16 x the
  high ones; each product gives the pair sums of two 8-value groups (lanes 0-3 and 4-7), and adding the two
  halves of the sum of a block's two such products gives exactly the 4 integer lanes the 128-bit code sums
  from its four 8-value groups (integer sums do not depend on their order); a chunk's two sub-blocks (2c in
  the low nibbles, 2c + 1 in the high ones) share one ``<8 x i32>`` (lanes 0-3 and 4-7), converted by one
  ``vcvtdq2ps ymm`` and added by one FMA into an 8-lane accumulator whose halves are the 128-bit code's two
  4-lane accumulators;
* Q6_K_I8: a block's 32 int8 codes, 16 at a time (``vpmovsxbw ymm``); the halves of each product are the
  128-bit code's sums of values 0-15 and 16-31, which go, under their two scales, into the same 8-lane
  accumulator.

Figures against the 128-bit kernels: docs/backend-cpu.md#256-bit-kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ...quant.formats import GGMLType
from ...quant.repack import Q6_K_I8_BYTES
from .dot_int16_128bit import PREFETCH_AHEAD, kquant_scales, sixteen_scales
from .dot_int16_512bit import kernels_choice, use_wide_kernels
from .llvm_ir import (
    F32,
    FAST,
    I8,
    I16,
    I32,
    I64,
    as_ptr,
    const_vec,
    emit_prefetch,
    host_has,
    hsum,
    load_at,
    load_f32x8,
    pmaddwd,
    vt,
)
from .simd import Q6_K_I8

# LLVM cpu names of AVX2 cores that execute 256-bit operations as two 128-bit halves: the 128-bit kernels are
# the faster ones there (docs/backend-cpu.md#128-bit-kernels)
HALF_WIDTH_CORES = (
    "znver1",
    "bdver4",
    "bdver3",
    "bdver2",
    "bdver1",
    "gracemont",
    "sierraforest",
    "grandridge",
)


def host_has_full_avx2() -> bool:
    """Whether the host has AVX2 on 256-bit datapaths (LLVM's host features and cpu name)."""
    avx2 = host_has("avx2")
    return avx2 and llvm.get_host_cpu_name() not in HALF_WIDTH_CORES


def use_256bit_kernels() -> bool:
    """Whether the formats with a kernel here use it: on full-width AVX2 hosts without AVX-512BW (whose 512-bit
    kernels take precedence), unless ``WORKBENCH_CPU_KERNELS`` says ``wide`` or ``narrow`` (``avx2`` forces them)."""
    choice = kernels_choice()
    if choice:
        return choice == "avx2"
    return host_has_full_avx2() and not use_wide_kernels()


def _fold_pair(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value) -> ir.Value:
    """<8 x i32>: lanes 0-3 the two halves of ``lo`` added, lanes 4-7 those of ``hi``."""
    first = b.shuffle_vector(lo, hi, const_vec(I32, [0, 1, 2, 3, 8, 9, 10, 11]))
    second = b.shuffle_vector(lo, hi, const_vec(I32, [4, 5, 6, 7, 12, 13, 14, 15]))
    return b.add(first, second, flags=("nsw",))


class _Row:
    """One row's loop over its units: pointers, the 8-lane accumulator (the 128-bit code's two 4-lane ones
    side by side) and, for formats with mins, their 4-lane accumulator."""

    def __init__(self, b: ir.IRBuilder, args: Sequence[ir.Value], mins: bool):
        w_a, xq_a, xd_a, xs_a, self.n = args
        self.b = b
        self.w = as_ptr(b, w_a, I8)
        self.xq = as_ptr(b, xq_a, vt(I16, 16))  # block k's words 16h .. 16h + 15 at vector 2k + h
        self.xd, self.xs = as_ptr(b, xd_a, F32), as_ptr(b, xs_a, F32)
        self.acc = cgutils.alloca_once_value(b, ir.Constant(vt(F32, 8), [0.0] * 8))
        self.corr = cgutils.alloca_once_value(b, ir.Constant(vt(F32, 4), [0.0] * 4)) if mins else None

    def x(self, x0: ir.Value, block: int, h: int) -> ir.Value:
        """Words 16h .. 16h + 15 of block ``x0 + block``."""
        b = self.b
        idx = b.add(b.mul(x0, ir.Constant(I64, 2)), ir.Constant(I64, 2 * block + h))
        return b.load(b.gep(self.xq, [idx]), align=2)

    def add(self, lo: ir.Value, hi: ir.Value, scales: ir.Value, i: int, j: int) -> None:
        """acc += float(lo's halves summed | hi's) x (scales[i] x 4 | scales[j] x 4): the 128-bit code's two
        accumulations of ``i`` and ``j``, lane for lane."""
        b = self.b
        lanes = b.shuffle_vector(scales, scales, const_vec(I32, [i] * 4 + [j] * 4))
        term = b.fmul(b.sitofp(_fold_pair(b, lo, hi), vt(F32, 8)), lanes, flags=FAST)
        b.store(b.fadd(b.load(self.acc), term, flags=FAST), self.acc)

    def units(self, unit_bytes: int, superblock: Callable[[ir.Value, ir.Value], None]) -> ir.Value:
        """Run ``superblock(base, x0)`` over the row's 256-value units (prefetching as the 128-bit code does);
        the row's result: the accumulator's halves added, minus the mins, summed."""
        b = self.b
        with cgutils.for_range(b, self.n) as loop:
            base = b.gep(self.w, [b.mul(loop.index, ir.Constant(I64, unit_bytes))])
            for off in range(0, unit_bytes, 64):
                emit_prefetch(b, base, PREFETCH_AHEAD + off)
            superblock(base, b.mul(loop.index, ir.Constant(I64, 8)))
        a = b.load(self.acc)
        total = b.fadd(
            *(b.shuffle_vector(a, a, const_vec(I32, range(4 * i, 4 * i + 4))) for i in range(2)), flags=FAST
        )
        if self.corr is not None:
            total = b.fsub(total, b.load(self.corr), flags=FAST)
        return hsum(b, total)


def _q4_k_row(b: ir.IRBuilder, args: Sequence[ir.Value]) -> ir.Value:
    """Q4_K (144-byte superblocks): chunk c's 32 bytes, 16 at a time, widened and masked into sub-block 2c
    (low nibbles) and 16 x sub-block 2c + 1 (high ones)."""
    r = _Row(b, args, mins=True)
    low, high = const_vec(I16, [0x0F] * 16), const_vec(I16, [0xF0] * 16)

    def superblock(base, x0):
        scales, mins = kquant_scales(b, base, r.xd, r.xs, x0)
        b.store(b.fadd(b.load(r.corr), mins, flags=FAST), r.corr)
        for c in range(4):
            sums = []
            for k, mask in enumerate((low, high)):
                parts = []
                for h in range(2):
                    words = b.zext(load_at(b, base, 16 + 32 * c + 16 * h, vt(I8, 16)), vt(I16, 16))
                    parts.append(pmaddwd(b, b.and_(words, mask), r.x(x0, 2 * c + k, h)))
                sums.append(b.add(parts[0], parts[1], flags=("nsw",)))
            r.add(*sums, scales, 2 * c, 2 * c + 1)

    return r.units(144, superblock)


def _q6_k_i8_row(b: ir.IRBuilder, args: Sequence[ir.Value]) -> ir.Value:
    """Q6_K_I8 (Q6_K repacked at load, :mod:`workbench.quant.repack`): block g's 32 int8 codes, 16 at a time,
    widened (``vpmovsxbw ymm``); values 0-15 and 16-31 under their own 16-value scales (d x scale x the
    block's activation scale, converted once per superblock)."""
    r = _Row(b, args, mins=False)
    dup = const_vec(I32, [i // 2 for i in range(16)])

    def superblock(base, x0):
        scales = sixteen_scales(b, base, 0, 2, load_f32x8(b, r.xd, x0), dup)
        for g in range(8):
            halves = [
                pmaddwd(
                    b, b.sext(load_at(b, base, 18 + 32 * g + 16 * h, vt(I8, 16)), vt(I16, 16)), r.x(x0, g, h)
                )
                for h in range(2)
            ]
            r.add(*halves, scales, 2 * g, 2 * g + 1)

    return r.units(Q6_K_I8_BYTES, superblock)


BODIES = {int(GGMLType.Q4_K): _q4_k_row, Q6_K_I8: _q6_k_i8_row}


def make_dot_i16_256(qtype: int) -> Callable:
    """``dot(w_addr, xq_addr, xd_addr, xs_addr, n_units) -> float32`` (the signature and the bits of
    :func:`.dot_int16_128bit.make_dot_i16`) for Q4_K and Q6_K_I8 rows, in 256-bit operations."""
    body = BODIES[qtype]

    @intrinsic
    def dot(typingctx, w, xq, xd, xs, n):
        sig = types.float32(types.intp, types.intp, types.intp, types.intp, types.intp)

        def codegen(context, b, signature, args):
            return body(b, args)

        return sig, codegen

    return dot
