"""Decode attention's two products in 16-lane float vectors: numba intrinsics that emit LLVM IR.

For one KV head and up to ``MAX_HEADS`` of the query heads that share it (GQA), over the cache rows listed
in ``seen``:

* :func:`score_keys`: ``probs[g, j] = scale * dot(q_g, key row seen[j])``. Each key row is loaded once for
  all the heads; each head sums into its own 16-lane accumulator, reduced once per key.
* :func:`weigh_values`: ``acc[g, d0:d0+16*width] += sum_j probs[g, j] * value row seen[j]``. The output slice
  of every head stays in registers (``width`` vectors per head) over all the keys.

Both read ``16 * (head_dim // 16)`` dims; the caller adds the rest (head_dim % 16, none for Gemma 3). The
loops numba made of the same arithmetic summed each key's dot product in one chain and kept the weighted
sums in memory, at two to three times the time (figures: docs/backend-cpu.md#decode-attention).
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .llvm_ir import F32, FAST, I64, as_ptr, emit_prefetch, host_has, hsum, ptr, splat, vt

LANES = 16
MAX_HEADS = 4  # query heads per call (more: several calls)
# vectors per head of a wide weigh_values slice: 16 accumulators at 4 heads in AVX-512's 32 registers; AVX2 has
# 16 registers of half the width, so one vector a head there
WIDE = 4 if host_has("avx512f") else 1
# key rows prefetched ahead (cold cache, 190 keys, 2 threads: 4, 8, 16 rows within noise); each value row is
# prefetched as its key is scored
AHEAD = 8
_ADDR = types.intp


def _vec(b: ir.IRBuilder, base: ir.Value, i: ir.Value) -> ir.Value:
    """The <16 x float> at float index ``i`` of ``base`` (a float pointer)."""
    return b.load(b.bitcast(b.gep(base, [i]), ptr(vt(F32, LANES))), align=4)


def _row(b: ir.IRBuilder, base: ir.Value, seen: ir.Value, j: ir.Value, stride: ir.Value) -> ir.Value:
    """The float pointer to row ``seen[j]`` of a cache whose rows are ``stride`` floats, from ``base``."""
    return b.gep(base, [b.mul(b.load(b.gep(seen, [j])), stride)])


def _prefetch_row(b: ir.IRBuilder, row: ir.Value, n_vecs: ir.Value) -> None:
    """Prefetch the cache lines of ``n_vecs`` 16-float vectors at ``row`` (one line more: rows need not be
    aligned to 64 bytes)."""
    i8row = b.bitcast(row, ptr(ir.IntType(8)))
    with cgutils.for_range(b, b.add(n_vecs, ir.Constant(I64, 1))) as loop:
        # locality 3: the KV rows stay cached, the next token reads them again
        emit_prefetch(b, b.gep(i8row, [b.mul(loop.index, ir.Constant(I64, 64))]), 0, 3)


def _switch(b: ir.IRBuilder, value: ir.Value, bodies: dict[int, Callable[[], None]]) -> None:
    """Emit ``bodies[value]()`` for the run-time ``value`` (an i64); the first body for any other value."""
    end = b.append_basic_block("case.end")
    blocks = {key: b.append_basic_block(f"case.{key}") for key in bodies}
    switch = b.switch(value, next(iter(blocks.values())))
    for key, block in blocks.items():
        switch.add_case(ir.Constant(I64, key), block)
        b.position_at_end(block)
        bodies[key]()
        b.branch(end)
    b.position_at_end(end)


def _score_body(b: ir.IRBuilder, args, heads: int) -> None:
    q_a, k_a, v_a, stride, seen_a, n, head_len, scale, p_a = args
    n_vecs = b.udiv(head_len, ir.Constant(I64, LANES))
    qp, kp, vp, pp = (as_ptr(b, a, F32) for a in (q_a, k_a, v_a, p_a))
    sp = as_ptr(b, seen_a, I64)
    zero = ir.Constant(vt(F32, LANES), [0.0] * LANES)
    accs = [cgutils.alloca_once(b, vt(F32, LANES)) for _ in range(heads)]
    last = b.sub(n, ir.Constant(I64, 1))
    first = b.select(b.icmp_signed("<", n, ir.Constant(I64, AHEAD)), n, ir.Constant(I64, AHEAD))
    with cgutils.for_range(b, first) as head:  # the rows before the loop's look-ahead reaches
        _prefetch_row(b, _row(b, kp, sp, head.index, stride), n_vecs)
    with cgutils.for_range(b, n) as keys_loop:
        j = keys_loop.index
        ahead = b.add(j, ir.Constant(I64, AHEAD))
        ahead = b.select(b.icmp_signed("<", ahead, n), ahead, last)
        _prefetch_row(b, _row(b, kp, sp, ahead, stride), n_vecs)
        _prefetch_row(b, _row(b, vp, sp, j, stride), n_vecs)
        krow = _row(b, kp, sp, j, stride)
        for a in accs:
            b.store(zero, a)
        with cgutils.for_range(b, n_vecs) as dims:
            i = b.mul(dims.index, ir.Constant(I64, LANES))
            kv = _vec(b, krow, i)
            for g, a in enumerate(accs):
                qv = _vec(b, qp, b.add(i, b.mul(head_len, ir.Constant(I64, g))))
                b.store(b.fadd(b.load(a), b.fmul(qv, kv, flags=FAST), flags=FAST), a)
        for g, a in enumerate(accs):
            out = b.gep(pp, [b.add(j, b.mul(n, ir.Constant(I64, g)))])
            b.store(b.fmul(hsum(b, b.load(a)), scale, flags=FAST), out)


def _weigh_body(b: ir.IRBuilder, args, heads: int, width: int) -> None:
    v_a, stride, seen_a, n, p_a, d0, head_len, acc_a = args
    vp, pp, ap = (as_ptr(b, a, F32) for a in (v_a, p_a, acc_a))
    sp = as_ptr(b, seen_a, I64)
    out = [[b.add(d0, b.add(b.mul(head_len, ir.Constant(I64, g)), ir.Constant(I64, LANES * c)))
            for c in range(width)] for g in range(heads)]  # fmt: skip
    accs = [[cgutils.alloca_once_value(b, _vec(b, ap, o)) for o in row] for row in out]
    with cgutils.for_range(b, n) as keys_loop:
        j = keys_loop.index
        vrow = _row(b, vp, sp, j, stride)
        vv = [_vec(b, vrow, b.add(d0, ir.Constant(I64, LANES * c))) for c in range(width)]
        for g in range(heads):
            p = splat(b, b.load(b.gep(pp, [b.add(j, b.mul(n, ir.Constant(I64, g)))])), LANES)
            for c, a in enumerate(accs[g]):
                b.store(b.fadd(b.load(a), b.fmul(p, vv[c], flags=FAST), flags=FAST), a)
    for row, acc_row in zip(out, accs):
        for o, a in zip(row, acc_row):
            b.store(b.load(a), b.bitcast(b.gep(ap, [o]), ptr(vt(F32, LANES))), align=4)


@intrinsic
def score_keys(typingctx, heads, q, keys, vals, stride, seen, n, head_len, scale, probs):
    """``probs[g * n + j] = scale * dot(q[g * head_len + i], keys[seen[j] * stride + i])`` over
    i < 16 * (head_len // 16), for g < ``heads`` (1..MAX_HEADS: one compiled body each, a register
    accumulator a head); prefetches the key rows ahead and the value rows."""
    sig = types.void(
        types.intp, _ADDR, _ADDR, _ADDR, types.intp, _ADDR, types.intp, types.intp, types.float32, _ADDR
    )

    def codegen(context, b, signature, args):
        bodies = {h: (lambda h=h: _score_body(b, args[1:], h)) for h in range(1, MAX_HEADS + 1)}
        _switch(b, args[0], bodies)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def weigh_values(typingctx, heads, wide, vals, stride, seen, n, probs, d0, head_len, acc):
    """``acc[g * head_len + d0 + i] += sum_j probs[g * n + j] * vals[seen[j] * stride + d0 + i]`` for
    g < ``heads`` and i < 16 * WIDE (``wide`` 1) or 16 (``wide`` 0): one compiled body each, the heads'
    output slices in registers over all the keys."""
    sig = types.void(
        types.intp, types.intp, _ADDR, types.intp, _ADDR, types.intp, _ADDR, types.intp, types.intp, _ADDR
    )

    def codegen(context, b, signature, args):
        bodies = {
            2 * h + w: (lambda h=h, w=w: _weigh_body(b, args[2:], h, WIDE if w else 1))
            for h in range(1, MAX_HEADS + 1)
            for w in (1, 0)
        }
        _switch(b, b.add(b.mul(args[0], ir.Constant(I64, 2)), args[1]), bodies)
        return context.get_dummy_value()

    return sig, codegen
