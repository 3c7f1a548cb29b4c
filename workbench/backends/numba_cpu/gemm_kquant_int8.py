"""Prefill GEMM of k-quant weights (Q4_K, Q6_K_I8) by int8 activations with one scale per 256 values.

``out[t, n] = row n of W . activation row t`` for many activation rows at once, with activations in the
manner of llama.cpp's Q8_K for these formats: each 256-value block of an activation row becomes int8 codes
under one scale (here ``max|x| / 127``, codes rounded to nearest; llama.cpp scales by the signed extreme),
so a superblock's integer products add up exactly and turn into a float once per 256 values.

The work splits in three:

* :func:`unpack_rows` turns R (8) weight rows into unsigned codes (Q4_K 0..15; Q6_K_I8 codes + 32, 0..63),
  their scales as int16 lanes, the superblock scale ``d`` and the offsets ``mf`` that the codes' zero points
  cost (Q4_K: ``dmin x min``; Q6_K: ``32 x d x scale``), per 16 values;
* :func:`tile_rows` lays every 4 values of the 8 rows side by side in one 32-byte vector, with the rows'
  scales twice each (one ``vpmaddwd`` operand);
* :func:`_tile_ir` (hand-built LLVM IR, :data:`_tile_q4_k` / :data:`_tile_q6_k`) broadcasts an activation
  row's 4 values at those columns to the 8 lanes, so one ``vpmaddubsw`` gives the 8 rows' pair sums; those
  add up in int16 over a Q4_K sub-block (8 products) or 16 Q6_K values (2 products) before one ``vpmaddwd``
  applies the scales, so 256 products of 8 rows take 9 (Q4_K) or 12 (Q6_K) multiplies. Each weight vector
  serves TOKENS activation rows; each row's float sum, ``d x activation scale x int32 sum - mf .
  (activation scale x code sums)``, is one lane of an 8-lane vector per activation row.

Integers are exact, so a row's result depends only on its weights and the activation row (not on the number
of rows, threads or the tile). Figures: docs/backend-cpu.md#int8-prefill-gemm.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ...numba_jit import numba
from ...quant.formats import GGMLType
from ...quant.repack import Q4_K_BYTES, Q6_K_I8_BYTES
from .llvm_ir import (
    F32,
    FAST,
    I8,
    I16,
    I32,
    I64,
    as_ptr,
    const_vec,
    host_has,
    load_at,
    load_f32x8,
    load_half,
    nibbles,
    pmaddwd,
    splat,
    store_at,
    vt,
)
from .simd import Q6_K_I8, k_scale_min_bytes

njit, prange = numba.njit, numba.prange

Q4_K = int(GGMLType.Q4_K)
GEMM_FMTS = (Q4_K, Q6_K_I8)  # the layouts this GEMM reads
R = 8  # weight rows per tile: each 4 values of 8 rows fill one 256-bit vector
TOKENS = 4  # activation rows each weight vector serves (their sums stay in registers)
CHUNK_UNITS = 6  # superblocks of a tile's columns multiplied by every activation row before the next (L1)
HAS_AVX2 = host_has("avx2")


def supported(fmt: int, cols: int) -> bool:
    """Whether a weight of layout ``fmt`` and ``cols`` columns can go through this GEMM."""
    return fmt in GEMM_FMTS and cols % 256 == 0


# -- activations ---------------------------------------------------------------------------------------------
@njit(parallel=True, cache=True)
def quantize_q8k(x, xq, xd, xs):  # pragma: no cover - compiled
    """Each 256-value block of each row of ``x`` (T, K) as int8 codes ``xq`` (T, K) under one scale ``xd``
    (T, K / 256) = max|x| / 127, and ``xs`` (T, K / 16) = scale x the sum of each 16 codes (what the
    weights' zero points multiply). Codes round to nearest; |code| <= 127."""
    k = x.shape[1]
    for t in prange(x.shape[0]):
        for u in range(k // 256):
            amax = np.float32(0.0)
            for i in range(256):
                a = abs(x[t, u * 256 + i])
                if a > amax:
                    amax = a
            d = amax / np.float32(127.0)
            inv = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)
            xd[t, u] = d
            for g in range(16):
                s = np.int32(0)
                for i in range(16):
                    q = np.int32(np.rint(x[t, u * 256 + g * 16 + i] * inv))
                    xq[t, u * 256 + g * 16 + i] = q
                    s += q
                xs[t, u * 16 + g] = d * np.float32(s)


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``x`` (T, K; K a multiple of 256) quantized by :func:`quantize_q8k`: codes, scales, scaled sums."""
    t, k = x.shape
    if k % 256:
        raise ValueError(f"the int8 GEMM takes rows of a multiple of 256 values, got {k}")
    xq = np.empty((t, k), np.int8)
    xd = np.empty((t, k // 256), np.float32)
    xs = np.empty((t, k // 16), np.float32)
    quantize_q8k(np.ascontiguousarray(x, np.float32), xq, xd, xs)
    return xq, xd, xs


# -- weights -------------------------------------------------------------------------------------------------


def _unpack_ir(b: ir.IRBuilder, args: Sequence[ir.Value], q4_k: bool) -> None:
    """One row of ``n`` superblocks (Q4_K, else Q6_K_I8) as :func:`unpack_rows` lays it out."""
    row_a, n, codes_a, sc_a, dw_a, mf_a = args
    row, codes, sc, mf = (as_ptr(b, a, I8) for a in (row_a, codes_a, sc_a, mf_a))
    dw = as_ptr(b, dw_a, F32)
    with cgutils.for_range(b, n) as lu:
        u = lu.index
        base = b.gep(row, [b.mul(u, _c(Q4_K_BYTES if q4_k else Q6_K_I8_BYTES))])
        d = load_half(b, base, 0)
        b.store(d, b.gep(dw, [u]))
        out_c = b.gep(codes, [b.mul(u, _c(256))])  # 256 codes
        out_s = b.gep(sc, [b.mul(u, _c(32))])  # 16 int16 scales (Q4_K: 8)
        out_m = b.gep(mf, [b.mul(u, _c(64))])  # 16 floats
        if q4_k:  # 8 six-bit scales (one per 32 values) and mins under dmin; nibbles: 2c low, 2c + 1 high
            scales, mins = k_scale_min_bytes(b, base)
            store_at(b, b.zext(scales, vt(I16, 8)), out_s, 0)
            m = b.fmul(b.uitofp(b.zext(mins, vt(I32, 8)), vt(F32, 8)), splat(b, load_half(b, base, 2), 8))
            store_at(b, b.shuffle_vector(m, m, const_vec(I32, [i // 2 for i in range(16)])), out_m, 0)
            for c in range(4):
                lo, hi = nibbles(b, load_at(b, base, 16 + 32 * c, vt(I8, 32)))
                store_at(b, lo, out_c, 64 * c)
                store_at(b, hi, out_c, 64 * c + 32)
        else:  # 16 int8 scales (one per 16 values); codes q - 32 made unsigned
            scales = load_at(b, base, 2, vt(I8, 16))
            store_at(b, b.sext(scales, vt(I16, 16)), out_s, 0)
            thirty_two_d = b.fmul(d, ir.Constant(F32, 32.0), flags=FAST)
            m = b.fmul(
                b.sitofp(b.sext(scales, vt(I32, 16)), vt(F32, 16)), splat(b, thirty_two_d, 16), flags=FAST
            )
            store_at(b, m, out_m, 0)
            for j in range(8):
                q = load_at(b, base, 18 + 32 * j, vt(I8, 32))
                store_at(b, b.add(q, const_vec(I8, [32] * 32)), out_c, 32 * j)


def _unpack_intrinsic(q4_k: bool) -> Callable:
    @intrinsic
    def unpack(typingctx, row, n, codes, sc, dw, mf):
        sig = types.void(*([types.intp] * 6))

        def codegen(context, b, signature, args):
            _unpack_ir(b, args, q4_k)
            return context.get_dummy_value()

        return sig, codegen

    return unpack


_unpack_q4_k, _unpack_q6_k_i8 = _unpack_intrinsic(True), _unpack_intrinsic(False)


@njit(cache=True)
def unpack_rows(fmt, w, r0, codes, sc, dw, mf):  # pragma: no cover - compiled
    """Rows r0 .. r0 + R of ``w`` (rows past its end: zeros) as this GEMM's operands: ``codes`` (R, K) uint8,
    ``sc`` (R, K / 16) int16 (a superblock's scales: Q4_K 8 and 8 unused, Q6_K 16), ``dw`` (R, K / 256)
    float32 (d), ``mf`` (R, K / 16) float32 (the zero points' offsets per 16 values)."""
    units = dw.shape[1]
    for r in range(R):
        n = r0 + r
        if n >= w.shape[0]:
            codes[r, :] = 0
            sc[r, :] = 0
            dw[r, :] = 0.0
            mf[r, :] = 0.0
            continue
        args = (w.ctypes.data + n * w.strides[0], units, codes[r].ctypes.data, sc[r].ctypes.data,
                dw[r].ctypes.data, mf[r].ctypes.data)  # fmt: skip
        if fmt == Q4_K:
            _unpack_q4_k(*args)
        else:
            _unpack_q6_k_i8(*args)


# -- the tile ------------------------------------------------------------------------------------------------
def _c(v: int) -> ir.Constant:
    """An i64 constant (indices and offsets)."""
    return ir.Constant(I64, v)


def _maddubs(b: ir.IRBuilder, w: ir.Value, a: ir.Value) -> ir.Value:
    """Pair sums of unsigned ``w`` by signed ``a`` (<32 x i8> each) as <16 x i16>: ``vpmaddubsw`` on AVX2 (it
    saturates; these codes' sums, at most 2 x 63 x 127, never reach it), else the same sums in plain IR."""
    if HAS_AVX2:
        mod = b.module
        name = "llvm.x86.avx2.pmadd.ub.sw"
        fn = mod.globals.get(name) or ir.Function(mod, ir.FunctionType(vt(I16, 16), [vt(I8, 32)] * 2), name)
        return b.call(fn, [w, a])
    m = b.mul(b.zext(w, vt(I16, 32)), b.sext(a, vt(I16, 32)), flags=("nsw",))
    even = b.shuffle_vector(m, m, const_vec(I32, range(0, 32, 2)))
    odd = b.shuffle_vector(m, m, const_vec(I32, range(1, 32, 2)))
    return b.add(even, odd, flags=("nsw",))


def _tile_ir(b: ir.IRBuilder, args: Sequence[ir.Value], per_madd: int) -> None:
    """out[t, 0:8] = the R (8) rows of a tile (:func:`tile_rows`) . activation row t (:func:`quantize_q8k`) for
    ``n_tok`` activation rows. Each 4 values of the 8 rows are one 32-byte vector and an activation's 4
    values at the same columns are broadcast to its 8 lanes, so one ``vpmaddubsw`` gives each row's two pair
    sums; ``per_madd`` such products add up in int16 (Q4_K 8: a whole 32-value sub-block, at most
    8 x 2 x 15 x 127; Q6_K 2: at most 2 x 2 x 63 x 127) before one ``vpmaddwd`` applies the rows' scales and
    sums each row's lanes into one int32 lane. Each weight vector serves TOKENS activation rows; the columns
    go by CHUNK_UNITS superblocks, whose weights stay in L1 while every activation row passes."""
    codes, sc, xq, out = (as_ptr(b, a, I8) for a in (args[0], args[1], args[5], args[9]))
    dw, mf, xd, xs = (as_ptr(b, a, F32) for a in (args[2], args[3], args[6], args[7]))
    n, n_tok, out_stride = args[4], args[8], args[10]
    k = b.mul(n, _c(256))
    madds = 8 // per_madd  # scale vectors per 32 values
    f32x8 = vt(F32, 8)

    def tokens(t0: ir.Value, count: int, u0: ir.Value, u1: ir.Value) -> None:
        """Activation rows t0 .. t0 + count over superblocks u0 .. u1, added to their output rows."""
        toks = [b.add(t0, _c(i)) for i in range(count)]
        dst = [b.bitcast(b.gep(out, [b.mul(t, out_stride)]), f32x8.as_pointer()) for t in toks]
        first = b.icmp_unsigned("==", u0, _c(0))
        totals = [cgutils.alloca_once(b, f32x8) for _ in toks]
        for tot, d in zip(totals, dst, strict=True):
            b.store(b.select(first, ir.Constant(f32x8, [0.0] * 8), b.load(d, align=4)), tot)
        rows = [b.gep(xq, [b.mul(t, k)]) for t in toks]
        with cgutils.for_range_slice(b, u0, u1, _c(1)) as (u, _):
            isums = [cgutils.alloca_once_value(b, ir.Constant(vt(I32, 8), [0] * 8)) for _ in toks]
            # the 8 sub-blocks as a loop: unrolled, LLVM's scheduler hoists all loads to the top and spills
            with cgutils.for_range(b, _c(8)) as lj:
                blk = b.add(b.mul(u, _c(8)), lj.index)  # the 32-value block
                w_at = b.gep(codes, [b.mul(blk, _c(256))])
                s_at = b.gep(sc, [b.mul(blk, _c(32 * madds))])
                a_at = [b.gep(r, [b.mul(blk, _c(32))]) for r in rows]
                accs = [b.load(i) for i in isums]
                for m in range(madds):
                    parts: list[ir.Value | None] = [None] * count
                    for g in range(m * per_madd, (m + 1) * per_madd):
                        w = load_at(b, w_at, 32 * g, vt(I8, 32))
                        for i in range(count):
                            a = b.bitcast(splat(b, load_at(b, a_at[i], 4 * g, I32), 8), vt(I8, 32))
                            p = _maddubs(b, w, a)
                            parts[i] = p if parts[i] is None else b.add(parts[i], p, flags=("nsw",))
                    scales = load_at(b, s_at, 32 * m, vt(I16, 16))
                    accs = [
                        b.add(acc, pmaddwd(b, part, scales), flags=("nsw",)) for acc, part in zip(accs, parts)
                    ]
                for acc, slot in zip(accs, isums, strict=True):
                    b.store(acc, slot)
            d_w = load_f32x8(b, dw, b.mul(u, _c(8)))
            offsets = [load_f32x8(b, mf, b.mul(b.add(b.mul(u, _c(16)), _c(g)), _c(8))) for g in range(16)]
            for t, isum, tot in zip(toks, isums, totals, strict=True):
                tu = b.add(b.mul(t, n), u)
                scale = b.fmul(d_w, splat(b, b.load(b.gep(xd, [tu])), 8), flags=FAST)
                f = b.fadd(b.load(tot), b.fmul(b.sitofp(b.load(isum), f32x8), scale, flags=FAST), flags=FAST)
                for g in range(
                    16
                ):  # the zero points: each row's offset per 16 values x the codes' scaled sums
                    x_s = splat(b, b.load(b.gep(xs, [b.add(b.mul(tu, _c(16)), _c(g))])), 8)
                    f = b.fsub(f, b.fmul(offsets[g], x_s, flags=FAST), flags=FAST)
                b.store(f, tot)
        for tot, d in zip(totals, dst, strict=True):
            b.store(b.load(tot), d, align=4)

    groups = b.udiv(n_tok, _c(TOKENS))
    with cgutils.for_range_slice(b, _c(0), n, _c(CHUNK_UNITS)) as (u0, _):
        u1 = b.select(b.icmp_unsigned("<", b.add(u0, _c(CHUNK_UNITS)), n), b.add(u0, _c(CHUNK_UNITS)), n)
        with cgutils.for_range(b, groups) as lg:
            tokens(b.mul(lg.index, _c(TOKENS)), TOKENS, u0, u1)
        with cgutils.for_range_slice(b, b.mul(groups, _c(TOKENS)), n_tok, _c(1)) as (t, _):
            tokens(t, 1, u0, u1)


def _tile_intrinsic(per_madd: int) -> Callable:
    @intrinsic
    def tile(typingctx, codes, sc, dw, mf, n, xq, xd, xs, n_tok, out, out_stride):
        """:func:`_tile_ir` on addresses: the tile's operands, ``n`` units of 256 values, ``n_tok`` activation
        rows (codes, scales, sums), the output's first row and its row stride in bytes."""
        sig = types.void(*([types.intp] * 11))

        def codegen(context, b, signature, args):
            _tile_ir(b, args, per_madd)
            return context.get_dummy_value()

        return sig, codegen

    return tile


_tile_q4_k, _tile_q6_k = _tile_intrinsic(8), _tile_intrinsic(2)


@njit(cache=True)
def tile_rows(fmt, rows_codes, rows_sc, rows_dw, rows_mf, codes, sc, dw, mf):  # pragma: no cover - compiled
    """The R rows of :func:`unpack_rows` in the tile's layout: ``codes`` (K / 4, R) uint32, each 4 values of
    the R rows side by side; ``sc`` int16, per 32 values (Q4_K) or 8 values (Q6_K) the rows' scales twice
    each (a ``vpmaddwd`` operand); ``dw`` (units, R) and ``mf`` (units, 16, R) float32."""
    c32 = rows_codes.view(np.uint32)
    for k4 in range(c32.shape[1]):
        for r in range(R):
            codes[k4, r] = c32[r, k4]
    q4_k = fmt == Q4_K
    for blk in range(rows_codes.shape[1] // 32):
        u, j = blk // 8, blk % 8
        for m in range(1 if q4_k else 4):
            for r in range(R):
                s = rows_sc[r, u * 16 + (j if q4_k else 2 * j + m // 2)]
                i = (blk * (1 if q4_k else 4) + m) * 16 + 2 * r
                sc[i] = s
                sc[i + 1] = s
    for u in range(rows_dw.shape[1]):
        for r in range(R):
            dw[u, r] = rows_dw[r, u]
            for g in range(16):
                mf[u, g, r] = rows_mf[r, u * 16 + g]


@njit(parallel=True, cache=True)
def gemm_q8k(fmt, w, xq, xd, xs, n_tok, out, rows_per_task):  # pragma: no cover - compiled
    """out[t, n] = row n of ``w`` (layout ``fmt``) . activation row t, for t < n_tok, from the int8 codes of
    :func:`quantize_q8k`; tasks of ``rows_per_task`` rows (rounded up to a multiple of R) in parallel."""
    n_rows, k = w.shape[0], xq.shape[1]
    units = k // 256
    rpt = -(-rows_per_task // R) * R
    per_blk = 1 if fmt == Q4_K else 4  # scale vectors per 32 values
    for task in prange(-(-n_rows // rpt)):
        r_codes = np.empty((R, k), np.uint8)
        r_sc = np.empty((R, k // 16), np.int16)
        r_dw = np.empty((R, units), np.float32)
        r_mf = np.empty((R, k // 16), np.float32)
        codes = np.empty((k // 4, R), np.uint32)
        sc = np.empty(k // 32 * per_blk * 16, np.int16)
        dw = np.empty((units, R), np.float32)
        mf = np.empty((units, 16, R), np.float32)
        tail = np.empty((n_tok, R), np.float32)
        for r0 in range(task * rpt, min(n_rows, task * rpt + rpt), R):
            unpack_rows(fmt, w, r0, r_codes, r_sc, r_dw, r_mf)
            tile_rows(fmt, r_codes, r_sc, r_dw, r_mf, codes, sc, dw, mf)
            whole = r0 + R <= n_rows
            dst = out[0:, r0:].ctypes.data if whole else tail.ctypes.data
            stride = out.strides[0] if whole else tail.strides[0]
            args = (codes.ctypes.data, sc.ctypes.data, dw.ctypes.data, mf.ctypes.data, units,
                    xq.ctypes.data, xd.ctypes.data, xs.ctypes.data, n_tok, dst, stride)  # fmt: skip
            if fmt == Q4_K:
                _tile_q4_k(*args)
            else:
                _tile_q6_k(*args)
            if not whole:
                for t in range(n_tok):
                    for r in range(n_rows - r0):
                        out[t, r0 + r] = tail[t, r]


def gemm(fmt: int, w: np.ndarray, q: tuple[np.ndarray, np.ndarray, np.ndarray], rpt: int) -> np.ndarray:
    """``x @ W.T`` (rows of x, rows of W) for the activations ``q`` of :func:`quantize_activations` and the
    weight rows ``w`` (uint8, a row's blocks) of layout ``fmt``, in tasks of ``rpt`` rows."""
    xq, xd, xs = (np.ascontiguousarray(a) for a in q)
    units = xq.shape[1] // 256
    row_bytes = {Q4_K: Q4_K_BYTES, Q6_K_I8: Q6_K_I8_BYTES}.get(fmt, 0) * units
    if not supported(fmt, xq.shape[1]) or w.ndim != 2 or w.shape[1] != row_bytes or w.dtype != np.uint8:
        raise ValueError(
            f"int8 GEMM: layout {fmt} with rows of {w.shape[1:]} bytes does not match {xq.shape[1]} columns "
            "(Q4_K and Q6_K_I8 rows of whole 256-value superblocks)"
        )
    if xd.shape != (xq.shape[0], units) or xs.shape != (xq.shape[0], units * 16):
        raise ValueError(
            f"int8 GEMM: activation scales {xd.shape} and sums {xs.shape} do not fit codes {xq.shape}"
        )
    out = np.empty((xq.shape[0], w.shape[0]), np.float32)
    gemm_q8k(fmt, np.ascontiguousarray(w), xq, xd, xs, xq.shape[0], out, max(rpt, 1))
    return out
