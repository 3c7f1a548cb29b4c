"""Decode dot products with int16 activations in 256-bit operations, bit-identical to :mod:`.dot_int16_128bit`.

On AVX2 cores with 256-bit datapaths (every Intel AVX2 core, AMD Zen 2 and later) one ``vpmaddwd`` takes 16
word pairs. These kernels compute the same integers as the 128-bit ones and then the same float
operations, lane for lane, so a row's result has the same bits:

* 16 weight bytes are widened at once (``vpmovzxbw ymm``) and masked into the low nibbles and 16 x the high
  ones; each product gives the pair sums of two 8-value groups (lanes 0-3 and 4-7), and adding the two
  halves of the sum of a block's two such products gives exactly the 4 integer lanes the 128-bit code sums
  from its four 8-value groups (integer sums do not depend on their order);
* a chunk's two sub-blocks (2c in the low nibbles, 2c + 1 in the high ones) share one ``<8 x i32>``
  (sub-block 2c in lanes 0-3, 2c + 1 in lanes 4-7), converted by one ``vcvtdq2ps ymm`` and added by one FMA
  into an 8-lane accumulator whose halves are the 128-bit code's two 4-lane accumulators.

Figures against the 128-bit kernels: docs/backend-cpu.md#256-bit-kernels.
"""

from __future__ import annotations

from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ...quant.formats import GGMLType
from .dot_int16_128bit import PREFETCH_AHEAD, kquant_scales
from .dot_int16_512bit import kernels_choice, use_wide_kernels
from .llvm_ir import F32, FAST, I8, I16, I32, I64, as_ptr, const_vec, emit_prefetch, hsum, load_at, vt

# LLVM cpu names of AVX2 cores that execute 256-bit operations as two 128-bit halves: the 128-bit kernels are
# the faster ones there (docs/backend-cpu.md#128-bit-kernels)
HALF_WIDTH_CORES = ("znver1", "bdver4", "bdver3", "bdver2", "bdver1")


def host_has_full_avx2() -> bool:
    """Whether the host has AVX2 on 256-bit datapaths (LLVM's host features and cpu name)."""
    avx2 = "+avx2" in llvm.get_host_cpu_features().flatten().split(",")
    return avx2 and llvm.get_host_cpu_name() not in HALF_WIDTH_CORES


def use_256bit_kernels() -> bool:
    """Whether the formats with a kernel here use it: on full-width AVX2 hosts without AVX-512BW (whose 512-bit
    kernels take precedence), unless ``WORKBENCH_CPU_KERNELS`` says ``wide`` or ``narrow`` (``avx2`` forces them)."""
    choice = kernels_choice()
    if choice:
        return choice == "avx2"
    return host_has_full_avx2() and not use_wide_kernels()


def _madd16(b: ir.IRBuilder, w: ir.Value, x: ir.Value) -> ir.Value:
    """<8 x i32> pair sums of two <16 x i16> products (lowered to ``vpmaddwd ymm``)."""
    m = b.mul(b.sext(w, vt(I32, 16)), b.sext(x, vt(I32, 16)), flags=("nsw",))
    even = b.shuffle_vector(m, m, const_vec(I32, range(0, 16, 2)))
    odd = b.shuffle_vector(m, m, const_vec(I32, range(1, 16, 2)))
    return b.add(even, odd, flags=("nsw",))


def _fold_pair(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value) -> ir.Value:
    """<8 x i32>: lanes 0-3 the two halves of ``lo`` added, lanes 4-7 those of ``hi``."""
    first = b.shuffle_vector(lo, hi, const_vec(I32, [0, 1, 2, 3, 8, 9, 10, 11]))
    second = b.shuffle_vector(lo, hi, const_vec(I32, [4, 5, 6, 7, 12, 13, 14, 15]))
    return b.add(first, second, flags=("nsw",))


def _q4_k_row(b: ir.IRBuilder, args) -> ir.Value:
    """One Q4_K row (144-byte superblocks) against int16 activations (16 words a vector: block k's words
    16h .. 16h + 15 at vector 2k + h)."""
    w_a, xq_a, xd_a, xs_a, n = args
    w = as_ptr(b, w_a, I8)
    xq = as_ptr(b, xq_a, vt(I16, 16))
    xd, xs = as_ptr(b, xd_a, F32), as_ptr(b, xs_a, F32)
    acc = cgutils.alloca_once_value(b, ir.Constant(vt(F32, 8), [0.0] * 8))
    corr = cgutils.alloca_once_value(b, ir.Constant(vt(F32, 4), [0.0] * 4))
    low, high = const_vec(I16, [0x0F] * 16), const_vec(I16, [0xF0] * 16)
    with cgutils.for_range(b, n) as loop:
        base = b.gep(w, [b.mul(loop.index, ir.Constant(I64, 144))])
        for off in range(0, 144, 64):
            emit_prefetch(b, base, PREFETCH_AHEAD + off)
        x0 = b.mul(loop.index, ir.Constant(I64, 8))
        scales, mins = kquant_scales(b, base, xd, xs, x0)
        b.store(b.fadd(b.load(corr), mins, flags=FAST), corr)
        for c in range(4):
            sums = []
            for k, mask in enumerate((low, high)):
                parts = []
                for h in range(2):
                    words = b.zext(load_at(b, base, 16 + 32 * c + 16 * h, vt(I8, 16)), vt(I16, 16))
                    idx = b.add(b.mul(x0, ir.Constant(I64, 2)), ir.Constant(I64, 2 * (2 * c + k) + h))
                    parts.append(_madd16(b, b.and_(words, mask), b.load(b.gep(xq, [idx]), align=2)))
                sums.append(b.add(parts[0], parts[1], flags=("nsw",)))
            lanes = b.shuffle_vector(scales, scales, const_vec(I32, [2 * c] * 4 + [2 * c + 1] * 4))
            term = b.fmul(b.sitofp(_fold_pair(b, *sums), vt(F32, 8)), lanes, flags=FAST)
            b.store(b.fadd(b.load(acc), term, flags=FAST), acc)
    a = b.load(acc)
    halves = [b.shuffle_vector(a, a, const_vec(I32, range(4 * i, 4 * i + 4))) for i in range(2)]
    return hsum(b, b.fsub(b.fadd(halves[0], halves[1], flags=FAST), b.load(corr), flags=FAST))


BODIES = {int(GGMLType.Q4_K): _q4_k_row}


def make_dot_i16_256(qtype: int):
    """``dot(w_addr, xq_addr, xd_addr, xs_addr, n_units) -> float32`` (the signature and the bits of
    :func:`.dot_int16_128bit.make_dot_i16`) for Q4_K rows, in 256-bit operations."""
    body = BODIES[qtype]

    @intrinsic
    def dot(typingctx, w, xq, xd, xs, n):
        sig = types.float32(types.intp, types.intp, types.intp, types.intp, types.intp)

        def codegen(context, b, signature, args):
            return body(b, args)

        return sig, codegen

    return dot
