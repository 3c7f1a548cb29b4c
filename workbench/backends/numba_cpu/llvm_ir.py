"""LLVM IR building blocks of the hand-built vector code: vector and pointer types, loads at byte offsets,
splats and shuffles, horizontal sums, ``vpmaddwd``-shaped products, prefetches and the unrolled unit loop.

The format decoders built from these live in :mod:`.simd`; the kernels of the ``dot_*`` modules, :mod:`.qsimd`,
:mod:`.nm` and :mod:`.attend_simd` use both (docs/backend-cpu.md#why-hand-built-vector-code).
"""

from __future__ import annotations

from llvmlite import binding as llvm
from llvmlite import ir
from numba.core import cgutils

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32, HALF = ir.FloatType(), ir.HalfType()
# float flags of the hand-built code: FMA contraction and no NaN/infinity/signed-zero care, but no
# reassociation. numba links a kernel's compiled code into each caller as one shared definition per name,
# and a copy re-optimized inside another caller could sum a row in another order, so a step's logits
# depended on which copy numba's cache loaded first. With sums in the order written every copy gives the
# same bits, and the hot loops keep their instructions (docs/backend-cpu.md#float-sums-in-the-order-written).
FAST = ("nnan", "ninf", "nsz", "contract")
PREFETCH_AHEAD = 1024  # bytes of the weight stream to prefetch ahead of the block being read


def host_has(feature: str) -> bool:
    """Whether LLVM's host features include ``feature`` (e.g. ``avx2``, ``avx512bw``, ``avx512vnni``)."""
    return f"+{feature}" in llvm.get_host_cpu_features().flatten().split(",")


def vt(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def ptr(t: ir.Type) -> ir.PointerType:
    return ir.PointerType(t)


def splat(b: ir.IRBuilder, v: ir.Value, n: int) -> ir.Value:
    vec = b.insert_element(ir.Constant(vt(v.type, n), None), v, ir.Constant(I32, 0))
    return b.shuffle_vector(vec, vec, ir.Constant(vt(I32, n), [0] * n))


def const_vec(t: ir.Type, vals) -> ir.Constant:
    return ir.Constant(vt(t, len(vals)), list(vals))


def load_at(b: ir.IRBuilder, base: ir.Value, offset: int | ir.Value, t: ir.Type) -> ir.Value:
    """Unaligned load of type ``t`` at byte ``offset`` from an i8* ``base``."""
    off = ir.Constant(I64, offset) if isinstance(offset, int) else offset
    p = b.bitcast(b.gep(base, [off]), ptr(t))
    return b.load(p, align=1)


def store_at(b: ir.IRBuilder, v: ir.Value, base: ir.Value, offset: int | ir.Value) -> None:
    """Unaligned store of ``v`` at byte ``offset`` from an i8* ``base``."""
    off = ir.Constant(I64, offset) if isinstance(offset, int) else offset
    b.store(v, b.bitcast(b.gep(base, [off]), ptr(v.type)), align=1)


def load_f32x8(b: ir.IRBuilder, p: ir.Value, u: ir.Value) -> ir.Value:
    """<8 x float> at ``p[u]`` (a float pointer: 8 blocks' activation scales or sums)."""
    return b.load(b.bitcast(b.gep(p, [u]), ptr(vt(F32, 8))), align=4)


def load_half(b: ir.IRBuilder, base: ir.Value, offset: int) -> ir.Value:
    """The fp16 at ``offset`` as a float, converted by ``vcvtph2ps`` from a register that ``vmovd`` fills
    whole: a scalar half loaded with ``vpinsrw`` merges into a register and chains every block's scale to
    the previous one (a false dependency that cost 3x on Q8_0), and converting by integer ops turns
    subnormal halves (99.8% of the Q6_K scales of the default model) into denormal floats, whose
    arithmetic is a slow microcode path (docs/backend-cpu.md#128-bit-kernels)."""
    h = b.zext(load_at(b, base, offset, I16), I32)
    v = b.bitcast(b.insert_element(ir.Constant(vt(I32, 4), [0] * 4), h, ir.Constant(I32, 0)), vt(HALF, 8))
    four = b.fpext(b.shuffle_vector(v, v, const_vec(I32, range(4))), vt(F32, 4))
    return b.extract_element(four, ir.Constant(I32, 0))


def nibbles(b: ir.IRBuilder, q: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Low and high nibbles of a byte vector."""
    n = q.type.count
    return b.and_(q, const_vec(I8, [15] * n)), b.lshr(q, const_vec(I8, [4] * n))


def concat(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value) -> ir.Value:
    n = lo.type.count
    return b.shuffle_vector(lo, hi, const_vec(I32, range(2 * n)))


def scale_vec(b, lo, hi, n: int) -> ir.Value:
    """n lanes: the first half ``lo``, the second ``hi`` (the same value for most formats)."""
    if lo is hi:
        return splat(b, lo, n)
    return b.shuffle_vector(
        splat(b, lo, n), splat(b, hi, n), const_vec(I32, [*range(n // 2), *range(n + n // 2, 2 * n)])
    )


def hsum(b, v: ir.Value) -> ir.Value:
    n = v.type.count
    while n > 1:
        half = n // 2
        lo = b.shuffle_vector(v, v, const_vec(I32, range(half)))
        hi = b.shuffle_vector(v, v, const_vec(I32, range(half, n)))
        v = b.fadd(lo, hi, flags=FAST)
        n = half
    return b.extract_element(v, ir.Constant(I32, 0))


def pmaddwd(b, a: ir.Value, x: ir.Value) -> ir.Value:
    """Pairwise sums of products of two <n x i16>: <n/2 x i32> (lowered to vpmaddwd of n x 16 bits)."""
    n = a.type.count
    m = b.mul(b.sext(a, vt(I32, n)), b.sext(x, vt(I32, n)), flags=("nsw",))
    even = b.shuffle_vector(m, m, const_vec(I32, range(0, n, 2)))
    odd = b.shuffle_vector(m, m, const_vec(I32, range(1, n, 2)))
    return b.add(even, odd, flags=("nsw",))


# locality hint of the weight streams' prefetches: 0 (prefetchnta), each line read once per token; keeping
# the lines in every level (3, prefetcht0) cost bandwidth (figures: docs/backend-cpu.md#prefetching)
WEIGHT_LOCALITY = 0


def emit_prefetch(b, base: ir.Value, offset: int, locality: int = WEIGHT_LOCALITY) -> None:
    """Prefetch the line at ``base + offset`` with LLVM's ``locality`` hint (0: non-temporal .. 3: all levels)."""
    mod = b.module
    name = "llvm.prefetch.p0"
    fn = mod.globals.get(name) or ir.Function(
        mod, ir.FunctionType(ir.VoidType(), [ptr(I8), I32, I32, I32]), name
    )
    b.call(
        fn,
        [
            b.gep(base, [ir.Constant(I64, offset)]),
            ir.Constant(I32, 0),
            ir.Constant(I32, locality),
            ir.Constant(I32, 1),
        ],
    )


def as_ptr(b, addr: ir.Value, t: ir.Type) -> ir.Value:
    return b.inttoptr(addr, ptr(t))


def for_units(b, n_units, body, unroll: int = 2) -> None:
    """Call ``body(u, slot)`` for every unit ``u``; consecutive units use different accumulator slots
    (``unroll`` independent chains hide the latency of the accumulating FMAs)."""
    n_groups = b.udiv(n_units, ir.Constant(I64, unroll))
    with cgutils.for_range(b, n_groups) as loop:
        for k in range(unroll):
            body(b.add(b.mul(loop.index, ir.Constant(I64, unroll)), ir.Constant(I64, k)), k)
    rest_start = b.mul(n_groups, ir.Constant(I64, unroll))
    with cgutils.for_range_slice(b, rest_start, n_units, ir.Constant(I64, 1)) as (u, _):
        body(u, 0)
