"""Decode steps as one compiled call: the instructions of a one-token step (:mod:`.instructions`) run by one
interpreter, :func:`run_segment`, for the row-parallel program and for the decode shards (:mod:`.shards`).

The per-op path runs a Python handler per op (~130 ops a token), each paying the interpreter, numba's
argument dispatch and fresh output arrays: milliseconds per token at 60-100 tokens/s. Here one numba call runs
a token's instructions, calling the same kernels as the per-op handlers (parallel matvecs, norms, RoPE,
attention over the KV cache in place). A program runs every instruction whole, each projection a parallel
loop over its rows; a shard runs its share of each (the record's ``mode``) on its own thread. A sparse FFN or
a block-sparse attention runs in :func:`run_sparse_instruction`, so a dense model never compiles them.

With a profiler attached, the interpreter adds each instruction's CPU cycles to ``spans``, and each op is
reported with its measured time (the counter is calibrated against ``time.perf_counter``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from ...numba_jit import numba
from . import kernels as k
from . import matvec as mv
from . import matvec_table as mt
from . import sparse as sp
from . import sparse_attention as sa
from . import step_inputs as si
from .addr import f32_ptr, i64_ptr
from .cycles import cycle_counter, cycle_rate, cycles
from .instructions import (
    ADD,
    ATTENTION,
    COLS,
    EMBED,
    HEADS,
    KV_HEADS,
    MATMUL_NORM_ADD,
    NORM_MATMUL,
    NORM_MATMUL_GELU,
    NORM_ROPE,
    RMSNORM,
    SPARSE_FFN,
    Program,
)  # fmt: skip

if TYPE_CHECKING:
    from ..base import OpObserver, Step
    from . import CpuBackend

njit = numba.njit

# why run_segment returned: the end of the instructions, an exchange of partial sums, a sparse instruction
END, EXCHANGE, SPARSE = range(3)


@njit(cache=True)
def arena_row(arena, off, n):  # pragma: no cover - compiled
    return arena[off : off + n].reshape((1, n))


@njit(cache=True)
def share(arena, off, n, s, n_sh):  # pragma: no cover - compiled
    """Shard ``s``'s share of the ``n`` values at ``off`` (of ``n_sh`` shares), as a (1, n / n_sh) view."""
    w = n // n_sh
    return arena_row(arena, off + s * w, w)


PF_ROWS = 32  # rows of a shard's first weight between two shares of the prefetched KV lines


@njit(cache=True)
def project(wt, c0, n_w, x, outs, levels, xq, xd, xs, rpt, maxima, pf, parallel):  # pragma: no cover
    """``outs[j][0, c0[j]:] = x @ W_j.T`` for the first ``n_w`` weights of ``wt`` (all their rows); int16
    activations unless levels = 0. ``parallel``: one parallel loop over the rows (:func:`.matvec.matvec_table`,
    which records the task maxima ``maxima`` asks for and returns their number), else on this thread, the first
    weight PF_ROWS rows at a time; either way the region ``pf`` describes is prefetched alongside
    (:func:`.matvec.prefetch_share`; ``pf[2]`` = 0: none)."""
    if levels > 0:
        mv.quantize_rows_i16(x, levels, xq, xd, xs)
    else:
        mv.block_sums(x, xs)
    if parallel:
        return mt.matvec_table(wt, n_w, outs, x, levels, xq, xd, xs, rpt, pf, maxima)
    for j in range(n_w):
        rows = wt[j, mv.W_ROWS]
        step = PF_ROWS if j == 0 and pf[2] > 0 else rows
        n_steps = (rows + step - 1) // step
        for t in range(n_steps):
            r0 = t * step
            mv.rows_at(wt[j], r0, min(rows, r0 + step), x, levels, xq, xd, xs, outs[j], c0[j] + r0)
            if step < rows:
                mt.prefetch_share(pf, t, n_steps)
    return np.int64(0)


@njit(cache=True)
def kv_prefetch_region(kv, layer, width, pos, pf):  # pragma: no cover - compiled
    """Fill ``pf`` with the KV rows a decode attention at ``pos`` reads in ``layer`` (rows 0 .. the slots
    written, ``width`` floats each), their first PREFETCH_MAX / 2 bytes of keys and of values at most."""
    n = min(kv[layer, si.KV_CAP], pos) * width * 4
    pf[0], pf[1], pf[2] = kv[layer, si.KV_KEYS], kv[layer, si.KV_VALS], min(n, mt.PREFETCH_MAX // 2)


@njit(cache=True)
def embed(w, token, scale, out):  # pragma: no cover - compiled
    """``out`` = row ``token`` of the embedding table ``w`` (a weight-table row), times ``scale``."""
    mv.dequant_row_at(w[mv.W_FMT], w[mv.W_ADDR], w[mv.W_ROW_BYTES], token, out.ctypes.data, w[mv.W_UNITS])
    k.scale_rows(out, scale)


@njit(cache=True)
def kv_append(kv, c, pos, arena, s, n_sh):  # pragma: no cover - compiled
    """Store shard ``s``'s share (of ``n_sh``) of the key and value rows of attention instruction ``c`` in its
    layer's cache slot for ``pos``; returns the layer's keys, values, slot positions, slots in use."""
    kd, layer = c.kv_width, c.layer
    cap, ring = kv[layer, si.KV_CAP], kv[layer, si.KV_RING]
    keys = numba.carray(f32_ptr(kv[layer, si.KV_KEYS]), (cap, kd))
    vals = numba.carray(f32_ptr(kv[layer, si.KV_VALS]), (cap, kd))
    kpos = numba.carray(i64_ptr(kv[layer, si.KV_POS]), (cap,))
    slot = pos % ring if ring > 0 else pos
    w = kd // n_sh
    keys[slot, s * w : (s + 1) * w] = arena[c.keys_in + s * w : c.keys_in + (s + 1) * w]
    vals[slot, s * w : (s + 1) * w] = arena[c.vals_in + s * w : c.vals_in + (s + 1) * w]
    kpos[slot] = pos  # every shard stores the same position
    return keys, vals, kpos, min(cap, pos + 1)


@njit(cache=True)
def attend(c, a, s, n_sh, kv, pos):  # pragma: no cover - compiled
    """Attention instruction ``c`` (dense) in arena ``a``: all query heads in parallel key ranges (a program,
    ``n_sh`` = 1), or shard ``s``'s query heads on this thread, over the KV heads it stores (KV_HEADS) or the
    one KV head every shard stores whole (HEADS)."""
    hd, kk = c.head_dim, c.k
    if n_sh == 1:
        keys, vals, kpos, used = kv_append(kv, c, pos, a, 0, 1)
        k.attend_one(a[c.inp : c.inp + kk], keys, vals, kpos, used, pos, kk // hd, hd, c.scale,
                     np.int64(c.window), a[c.out : c.out + c.n])  # fmt: skip
        return
    mine = c.mode == KV_HEADS
    keys, vals, kpos, used = kv_append(kv, c, pos, a, s if mine else 0, n_sh if mine else 1)
    if mine:
        w = c.kv_width // n_sh
        keys, vals = keys[:, s * w : (s + 1) * w], vals[:, s * w : (s + 1) * w]
    q, o = share(a, c.inp, kk, s, n_sh), share(a, c.out, c.n, s, n_sh)
    k.attend_serial(
        q[0], keys, vals, kpos[:used], pos, kk // n_sh // hd, hd, c.scale, np.int64(c.window), o[0]
    )


@njit(cache=True)
def exchange(a, c, parts, epoch, norms):  # pragma: no cover - compiled
    """The end of a COLS instruction (a matmul_rmsnorm_add): every shard's partial sum (the half of ``parts``
    of exchange ``epoch``) added in shard order, so that every shard holds the same bits; then its norm-add."""
    n, n_sh = c.n, parts.shape[1]
    o0 = arena_row(a, c.outs[0], n)
    got = parts[(epoch - 1) % 2]
    o0[0, :] = got[0, :n]
    for o in range(1, n_sh):
        for r in range(n):
            o0[0, r] += got[o, r]
    norm_add(a, c, o0, norms)


@njit(cache=True)
def norm_add(a, c, y, norms):  # pragma: no cover - compiled
    """matmul_rmsnorm_add after its projection ``y``: out = residual + rmsnorm(y)."""
    n = c.n
    k.rmsnorm_add(y, norms[c.norm : c.norm + n], c.eps, arena_row(a, c.other, n), arena_row(a, c.out, n))


@njit(cache=True)
def run_segment(s, i, resume, epoch, code, wts, c0, arenas, parts, norms, token, pos, rope, kv, levels, xq, xd,
                xs, rpt, maxima, spans):  # fmt: skip  # pragma: no cover - compiled
    """Shard ``s`` of ``arenas.shape[0]`` (1: a program, every instruction whole) runs instructions from ``i``
    (with ``resume``: first the exchange that ends instruction ``i``) until the end, an instruction that
    exchanges partial sums (whose partial sum it writes first) or a sparse one. Returns (where it stopped, why:
    END, EXCHANGE or SPARSE, the task maxima the last projection recorded). ``epoch``: exchanges done before
    (their parity picks the half of ``parts`` written); ``spans`` (2, shards, instructions; empty: off)
    receives each instruction's cycles."""
    n_sh = arenas.shape[0]
    whole = n_sh == 1
    a = arenas[s]
    end, last = code.shape[0], code.shape[0] - 1
    timed = spans.shape[2] > 0
    pf = np.zeros(3, np.int64)
    recorded = np.int64(0)
    while i < end:
        t0 = cycle_counter() if timed else 0
        c = code[i]
        op, kk, n, mode = c.op, c.k, c.n, c.mode
        x = arena_row(a, c.inp, kk)
        out = arena_row(a, c.out, n)
        pf[2] = 0
        if resume:
            exchange(a, c, parts, epoch, norms)
            resume = False
        elif op == SPARSE_FFN or (op == ATTENTION and c.blocks[0] > 0):
            return i, SPARSE, recorded
        elif mode == COLS:
            # a C-contiguous (1, n) view, as the other calls' outputs (one specialization of project)
            mine = arena_row(parts.reshape(-1), ((epoch % 2) * n_sh + s) * parts.shape[2], n)
            project(wts[s, i], c0[s, i], np.int64(1), share(a, c.inp, kk, s, n_sh), (mine, mine, mine), levels,
                    xq[s], xd[s], xs[s], rpt, maxima[:0], pf, whole)  # fmt: skip
            if timed:
                spans[0, s, i] += cycle_counter() - t0
            return i, EXCHANGE, recorded
        elif op == EMBED:
            embed(wts[s, i, 0], token, c.scale, out)
        elif op == NORM_ROPE:
            if mode == HEADS:
                x, out = share(a, c.inp, kk, s, n_sh), share(a, c.out, n, s, n_sh)
            hd = c.head_dim
            k.rmsnorm_rope(
                x, norms[c.norm : c.norm + hd], c.eps, rope[c.rope, 0:1], rope[c.rope, 1:2], hd, out
            )
        elif op == ATTENTION:
            attend(c, a, s, n_sh, kv, pos)
        elif op == RMSNORM:
            k.rmsnorm(x, norms[c.norm : c.norm + c.group], c.eps, c.group, out)
        elif op == ADD:
            k.add(x, arena_row(a, c.other, kk), out)
        elif op == MATMUL_NORM_ADD:
            o0 = arena_row(a, c.outs[0], n)
            project(wts[s, i], c0[s, i], np.int64(1), x, (o0, o0, o0), levels, xq[s], xd[s], xs[s], rpt,
                    maxima[:0], pf, whole)  # fmt: skip
            norm_add(a, c, o0, norms)
        else:  # NORM_MATMUL, NORM_MATMUL_GELU: a shard's rows (ROWS) or all of them
            nw = c.n_w
            wt, at = wts[s, i], c0[s, i]  # the rows of each weight run here, and where they go
            o0 = arena_row(a, c.outs[0], at[0] + wt[0, mv.W_ROWS])
            o1 = arena_row(a, c.outs[1], at[1] + wt[1, mv.W_ROWS]) if nw > 1 else o0
            o2 = arena_row(a, c.outs[2], at[2] + wt[2, mv.W_ROWS]) if nw > 2 else o0
            h = arena_row(a, c.scratch, kk)
            k.rmsnorm(x, norms[c.norm : c.norm + kk], c.eps, kk, h)
            if c.pf_layer > 0:  # the KV rows of the next attention
                kv_prefetch_region(kv, c.pf_layer - 1, c.pf_width, pos, pf)
            mx = maxima if i == last and op == NORM_MATMUL else maxima[:0]
            recorded = project(wt, at, nw, h, (o0, o1, o2), levels, xq[s], xd[s], xs[s], rpt, mx, pf, whole)
            if op == NORM_MATMUL_GELU and whole:  # contiguous rows, as the op handler's (the same bits)
                k.gelu_mul(o0, o1, out)
            elif op == NORM_MATMUL_GELU:  # a slice compiles another gelu_mul (its own float contractions)
                r0, r1 = at[0], at[0] + wt[0, mv.W_ROWS]
                k.gelu_mul(o0[:, r0:r1], o1[:, r0:r1], out[:, r0:r1])
        if timed:
            spans[0, s, i] += cycle_counter() - t0
        i += 1
    return i, END, recorded


@njit(cache=True)
def run_program(code, wts, c0, arenas, norms, token, pos, rope, kv, levels, xq, xd, xs, rpt, maxima, spans,
                start):  # fmt: skip  # pragma: no cover - compiled
    """A program's instructions from ``start`` (every one whole, one shard): returns (the argmax of the last
    instruction's output when it is a projection whose tasks recorded ``maxima`` (empty: not wanted), else -1;
    where it stopped: the end, or a sparse instruction for :func:`run_sparse_instruction`)."""
    parts = np.zeros((2, 1, 1), np.float32)  # no exchanges
    i, why, recorded = run_segment(np.int64(0), start, start < 0, np.int64(0), code, wts, c0, arenas, parts,
                                   norms, token, pos, rope, kv, levels, xq, xd, xs, rpt, maxima, spans)  # fmt: skip
    if why != END or recorded == 0:
        return np.int64(-1), i
    last = code.shape[0] - 1
    return mt.argmax_of_tasks(wts[0, last], rpt, maxima, recorded, arenas[0, code[last].outs[0] :]), i


@njit(cache=True)
def run_sparse_instruction(i, code, wts, arena, pos, kv, levels, xq, xd, xs, rpt):  # pragma: no cover
    """Instruction ``i`` of a program, one :func:`run_segment` stops before: a sparse FFN or a block-sparse
    attention. Their kernels live here, not in run_segment, so a dense model never compiles them."""
    c = code[i]
    op, kk, n = c.op, c.k, c.n
    x = arena_row(arena, c.inp, kk)
    out = arena_row(arena, c.out, n)
    if op == SPARSE_FFN:
        g = arena_row(arena, c.scratch, wts[i, 0, mv.W_ROWS])
        pf = np.zeros(3, np.int64)
        project(wts[i], np.zeros(3, np.int64), np.int64(1), x, (g, g, g), levels, xq, xd, xs, rpt,
                np.zeros(0, np.float32), pf, True)  # fmt: skip
        sp.kept_ffn(wts[i], g[0], c.kept, c.z, levels, x, xq, xd, xs, out[0], c.threads)
    else:  # ATTENTION with blocks
        hd = c.head_dim
        keys, vals, kpos, used = kv_append(kv, c, pos, arena, 0, 1)
        sa.attend_blocks_one(x[0], keys, vals, kpos, used, kv[c.layer, si.KV_RING], pos, kk // hd, hd, c.scale,
                             np.int64(c.window), c.blocks, out[0])  # fmt: skip


def execute(
    b: CpuBackend, prog: Program, step: Step, observer: OpObserver | None, argmax: bool = False
) -> tuple[np.ndarray, int]:
    """Run ``prog`` for ``step``: a view of the logits in the program's arena (valid until the next run of
    this program) and, with ``argmax``, their argmax found by the LM head's own tasks (-1 where they could not:
    see :func:`.matvec.argmax_of_tasks`; a cold np.argmax over the vocabulary's logits costs more:
    docs/backend-cpu.md#the-lm-head)."""
    pos, kv, rope, maxima = si.read(b, prog, step, argmax)
    spans = np.zeros((2, 1, len(prog.ops) if observer is not None else 0), np.int64)
    t0 = time.perf_counter()
    token = run_whole(b, prog, 0, int(step.tokens[0]), pos, rope, kv, maxima, spans)
    if observer is not None:
        report(observer, step, prog.ops, t0, spans[0, 0])
    return si.step_done(prog, step, pos), token


def run_whole(b: CpuBackend, prog: Program, first: int, token: int, pos: int, rope, kv, maxima, spans) -> int:
    """Run the instructions ``first``.. of ``prog`` whole (sparse ones too); ``spans`` (2, 1, those
    instructions; empty: off) receives their cycles. Returns the LM head's argmax, or -1."""
    code, wts, c0, arenas = prog.code[first:], prog.wts[:, first:], prog.c0[:, first:], prog.arenas[:1]
    xq, xd, xs, rpt = b.xq[None], b.xd[None], b.xs[None], b.rows_per_task
    found, i = run_program(code, wts, c0, arenas, prog.norms, token, pos, rope, kv, b.levels, xq, xd, xs, rpt,
                           maxima, spans, 0)  # fmt: skip
    while i < len(code):  # a sparse instruction, then the rest
        t = cycles()
        run_sparse_instruction(i, code, wts[0], arenas[0], pos, kv, b.levels, b.xq, b.xd, b.xs, rpt)
        if spans.shape[2]:
            spans[0, 0, i] += cycles() - t
        found, i = run_program(code, wts, c0, arenas, prog.norms, token, pos, rope, kv, b.levels, xq, xd, xs,
                               rpt, maxima, spans, i + 1)  # fmt: skip
    return int(found)


def report(observer: OpObserver, step: Step, ops: list, t0: float, took: np.ndarray) -> None:
    """Report each op with its measured cycles ``took``, back to back from ``t0``."""
    per_s = cycle_rate()
    at = t0
    for op, c in zip(ops, took, strict=True):
        observer.on_op(op, step, at, c / per_s, None)
        at += c / per_s
