"""Decode steps split across threads by attention heads and hidden units: two exchanges a layer.

A program (:mod:`.program`) runs each projection as a parallel loop over its rows, and the norms, RoPE and
attention on one thread: ~90 hand-offs a token, each exchanging vectors that one thread wrote and the other
reads. Where the threads sit on two chiplets every hand-off costs microseconds, as much in all as streaming
the layers' weights; here a layer has two (figures: docs/backend-cpu.md#decode-shards).

Here each of ``n_shards`` shards runs every layer on its own copy of the residual stream: it computes the
norms and the (small) K and V projections itself, and its own share of the query heads (Q rows, norm,
RoPE, attention), of the attention output projection's columns (a partial sum), of the FFN's hidden units
(gate/up rows, GELU) and of the down projection's columns (a partial sum). The partial sums are the only
exchanges: each shard writes its own, waits at a barrier, and adds all shards' partials in shard order, so
every shard holds the same bits. The LM head then runs as in a program (a parallel loop over its rows).

Results depend on the number of shards, not of threads: with fewer threads than shards (or a threading
layer that may run two iterations of a parallel loop on one thread) one thread runs the shards one after
the other between exchanges. Lowered: the dense decode graph with one KV head (Gemma 3 270M and 1B);
other graphs run their program as before.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from ..._numba import numba
from . import kernels as k
from . import matvec as mv
from . import program as pg
from .simd import R16_FMTS

if TYPE_CHECKING:
    from ..base import OpObserver, Step
    from . import CpuBackend

njit = numba.njit

# how a shard runs an instruction: all of it, its rows of the projections marked split (its heads or hidden
# units), its heads, or its columns of the projection (a partial sum, then the exchange)
WHOLE, ROWS, HEADS, COLS = range(4)
LINE = 16  # int64 slots between two shards' barrier flags (128 bytes: their own cache lines)
SPIN_LIMIT = 1 << 34  # cycle-counter ticks a shard waits at a barrier before giving up (~5 s at 3.5 GHz)
_X86 = platform.machine().lower() in ("x86_64", "amd64")


@intrinsic
def _load_acquire(typingctx, arr, i):
    """``arr[i]`` read with acquire ordering (what the writer stored before its release store is visible)."""

    def codegen(context, b, signature, args):
        data = context.make_array(signature.args[0])(context, b, args[0]).data
        return b.load_atomic(b.gep(data, [args[1]]), "acquire", 8)

    return types.int64(types.Array(types.int64, 1, "C"), types.int64), codegen


@intrinsic
def _store_release(typingctx, arr, i, v):
    """``arr[i] = v`` with release ordering (the stores before it are visible first)."""

    def codegen(context, b, signature, args):
        data = context.make_array(signature.args[0])(context, b, args[0]).data
        b.store_atomic(args[2], b.gep(data, [args[1]]), "release", 8)
        return context.get_dummy_value()

    return types.void(types.Array(types.int64, 1, "C"), types.int64, types.int64), codegen


@intrinsic
def _pause(typingctx):
    """The spin-wait hint (x86 ``pause``; nothing elsewhere)."""

    def codegen(context, b, signature, args):
        if _X86:
            fn = b.module.globals.get("llvm.x86.sse2.pause") or ir.Function(
                b.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause"
            )
            b.call(fn, [])
        return context.get_dummy_value()

    return types.void(), codegen


@njit(cache=True)
def _barrier(flags, s, n_shards, epoch):  # pragma: no cover - compiled
    """Shard ``s`` reaches barrier ``epoch`` and waits for the others; False when one did not come within
    SPIN_LIMIT ticks or another shard gave up (its flag ``flags[n_shards * LINE]`` set)."""
    _store_release(flags, s * LINE, epoch)
    t0 = pg.cycle_counter()
    for o in range(n_shards):
        spins = 0
        while _load_acquire(flags, o * LINE) < epoch:
            _pause()
            spins += 1
            if spins % 1024 == 0 and (
                _load_acquire(flags, n_shards * LINE) != 0 or pg.cycle_counter() - t0 > SPIN_LIMIT
            ):
                _store_release(flags, n_shards * LINE, 1)
                return False
    return True


@njit(cache=True)
def _part(arena, off, n, s, n_shards):  # pragma: no cover - compiled
    """Shard ``s``'s share of the ``n`` values at ``off``, as a (1, n / n_shards) view."""
    w = n // n_shards
    return pg.arena_row(arena, off + s * w, w)


PF_ROWS = 32  # rows of the first weight between two shares of the prefetched KV lines


@njit(cache=True)
def _project(wt, c0, n_w, x, outs, levels, xq, xd, xs, pf):  # pragma: no cover - compiled
    """``outs[j][0, c0[j]:] = x @ W_j.T`` for the shard's weights ``wt`` (all their rows), on this thread,
    the first weight PF_ROWS rows at a time, each followed by a share of the lines of the region ``pf``
    (see :func:`.program.kv_prefetch_region`; ``pf[2]`` = 0: none)."""
    if levels > 0:
        mv.quantize_rows_i16(x, levels, xq, xd, xs)
    else:
        mv.block_sums(x, xs)
    for j in range(n_w):
        w = wt[j]
        rows = w[mv.W_ROWS]
        step = PF_ROWS if j == 0 and pf[2] > 0 else rows
        n_steps = (rows + step - 1) // step
        for t in range(n_steps):
            r0, r1 = t * step, min(rows, (t + 1) * step)
            if levels > 0:
                mv.rows_i16_at(w[mv.W_FMT], w[mv.W_ADDR], w[mv.W_ROW_BYTES], w[mv.W_UNITS], r0, r1, xq, xd, xs,
                                outs[j], c0[j] + r0)  # fmt: skip
            else:
                mv.rows_f32_at(w[mv.W_FMT], w[mv.W_ADDR], w[mv.W_ROW_BYTES], w[mv.W_UNITS], r0, r1, x, xs,
                                outs[j], c0[j] + r0)  # fmt: skip
            if step < rows:
                mv.prefetch_share(pf, t, n_steps)


@njit(cache=True)
def _segment(s, i, resume, epoch, code, fp, mode, wts, c0, arenas, parts, norms, token, pos, rope, kv, levels,
             xq, xd, xs, spans, timed):  # fmt: skip  # pragma: no cover - compiled
    """Shard ``s`` runs instructions from ``i`` (with ``resume``: first the rest of instruction ``i``, whose
    partial sums all shards wrote) up to the next one that exchanges partial sums, which it writes; returns
    that instruction, or the end of the body. ``epoch``: exchanges done before this segment (their parity
    picks the half of ``parts`` written). ``timed``: add each instruction's cycles to ``spans``."""
    n_sh = arenas.shape[0]
    a = arenas[s]
    end = code.shape[0]
    pf = np.zeros(3, np.int64)
    while i < end:
        t0 = pg.cycle_counter() if timed else 0
        c = code[i]
        op, kk, n = c[pg.C_OP], c[pg.C_K], c[pg.C_N]
        x = pg.arena_row(a, c[pg.C_IN], kk)
        out = pg.arena_row(a, c[pg.C_OUT], n)
        if resume:  # the exchange: every shard's partial sum, added in shard order
            o0 = pg.arena_row(a, c[pg.C_OUTS], n)
            got = parts[(epoch - 1) % 2]
            o0[0, :] = got[0, :n]
            for o in range(1, n_sh):
                for r in range(n):
                    o0[0, r] += got[o, r]
            k.rmsnorm_add(
                o0,
                norms[c[pg.C_NORM] : c[pg.C_NORM] + n],
                fp[i, pg.F_EPS],
                pg.arena_row(a, c[pg.C_AUX], n),
                out,
            )
            resume = False
        elif mode[i] == COLS:
            # a C-contiguous (1, n) view, as the other calls' outputs (one specialization of _project)
            mine = pg.arena_row(parts.reshape(-1), ((epoch % 2) * n_sh + s) * parts.shape[2], n)
            pf[2] = 0
            _project(wts[s, i], c0[s, i], np.int64(1), _part(a, c[pg.C_IN], kk, s, n_sh), (mine, mine, mine), levels,
                     xq[s], xd[s], xs[s], pf)  # fmt: skip
            if timed:
                spans[0, s, i] += pg.cycle_counter() - t0
            return i
        elif op == pg.EMBED:
            pg.embed(wts[s, i, 0], token, fp[i, pg.F_SCALE], out)
        elif op == pg.NORM_ROPE:
            t, hd = c[pg.C_AUX], c[pg.C_AUX2]
            if mode[i] == HEADS:
                x, out = _part(a, c[pg.C_IN], kk, s, n_sh), _part(a, c[pg.C_OUT], n, s, n_sh)
            k.rmsnorm_rope(x, norms[c[pg.C_NORM] : c[pg.C_NORM] + hd], fp[i, pg.F_EPS], rope[t, 0:1], rope[t, 1:2],
                           hd, out)  # fmt: skip
        elif op == pg.ATTENTION:  # every shard stores the same key and value bits
            hd = c[pg.C_AUX2]
            keys, vals, kpos, used = pg.kv_append(kv, c[pg.C_AUX], c, pos, a)
            q, o = _part(a, c[pg.C_IN], kk, s, n_sh), _part(a, c[pg.C_OUT], n, s, n_sh)
            k.attend_serial(q[0], keys, vals, kpos[:used], pos, kk // n_sh // hd, hd, fp[i, pg.F_SCALE],
                            np.int64(fp[i, pg.F_WINDOW]), o[0])  # fmt: skip
        elif op == pg.RMSNORM:
            k.rmsnorm(x, norms[c[pg.C_NORM] : c[pg.C_NORM] + c[pg.C_AUX]], fp[i, pg.F_EPS], c[pg.C_AUX], out)
        elif op == pg.ADD:
            k.add(x, pg.arena_row(a, c[pg.C_AUX], kk), out)
        else:  # NORM_MATMUL (Q rows split, K and V whole), NORM_MATMUL_GELU (gate and up rows split)
            nw = c[pg.C_NW]
            wt, at = wts[s, i], c0[s, i]  # this shard's rows of each weight, and where they go
            o0 = pg.arena_row(a, c[pg.C_OUTS], at[0] + wt[0, mv.W_ROWS])
            o1 = pg.arena_row(a, c[pg.C_OUTS + 1], at[1] + wt[1, mv.W_ROWS]) if nw > 1 else o0
            o2 = pg.arena_row(a, c[pg.C_OUTS + 2], at[2] + wt[2, mv.W_ROWS]) if nw > 2 else o0
            h = pg.arena_row(a, c[pg.C_AUX], kk)
            k.rmsnorm(x, norms[c[pg.C_NORM] : c[pg.C_NORM] + kk], fp[i, pg.F_EPS], kk, h)
            pf[2] = 0
            if c[pg.C_PF] > 0:  # the KV rows of the next attention, which this shard reads whole
                pg.kv_prefetch_region(kv, c[pg.C_PF] - 1, c[pg.C_PF + 1], pos, pf)
            _project(wt, at, nw, h, (o0, o1, o2), levels, xq[s], xd[s], xs[s], pf)
            if op == pg.NORM_MATMUL_GELU:
                r0, r1 = at[0], at[0] + wt[0, mv.W_ROWS]
                k.gelu_mul(o0[:, r0:r1], o1[:, r0:r1], out[:, r0:r1])
        if timed:
            spans[0, s, i] += pg.cycle_counter() - t0
        i += 1
    return end


@njit(parallel=True, cache=True)
def run_shards(threaded, code, fp, mode, wts, c0, arenas, parts, norms, token, pos, rope, kv, levels, xq, xd, xs,
               flags, spans):  # fmt: skip  # pragma: no cover - compiled
    """Run the body ``code`` (every instruction before the LM head) for one token: with ``threaded`` one
    thread per shard meeting at barriers (``flags`` zeroed: one line per shard, then the give-up flag),
    else the shards one after the other between exchanges. ``spans`` (2, shards, instructions; empty: off)
    receives the cycles each shard spent on each instruction, working and then waiting at the barrier
    after it. Returns False when a shard gave up waiting at a barrier (threads not concurrent)."""
    n_sh, end = arenas.shape[0], code.shape[0]
    timed = spans.shape[2] > 0
    if threaded:
        for sh in prange(n_sh):
            # typed np.int64 and a non-literal bool, as in the serial loop below: literal or unsigned
            # arguments would compile _segment once per type
            s, i, resume, epoch = np.int64(sh), np.int64(0), n_sh < 0, np.int64(0)
            while i < end:
                i = _segment(s, i, resume, epoch, code, fp, mode, wts, c0, arenas, parts, norms, token, pos, rope,
                             kv, levels, xq, xd, xs, spans, timed)  # fmt: skip
                if i < end:
                    epoch += 1
                    t0 = pg.cycle_counter()
                    if not _barrier(flags, s, n_sh, epoch):
                        break
                    if timed:
                        spans[1, s, i] += pg.cycle_counter() - t0
                    resume = True
        return _load_acquire(flags, n_sh * LINE) == 0
    i, resume, epoch = np.int64(0), n_sh < 0, np.int64(0)
    while i < end:
        nxt = end
        for s in range(n_sh):
            nxt = _segment(s, i, resume, epoch, code, fp, mode, wts, c0, arenas, parts, norms, token, pos, rope, kv,
                           levels, xq, xd, xs, spans, timed)  # fmt: skip
        i, resume = nxt, True
        epoch += 1
    return True


@dataclass
class ShardPlan:
    """How the shards run a program's body: per instruction its mode, per shard its weight table (the rows or
    columns it reads) and output offsets, and the shards' arenas, partial sums, activation scratch and flags."""

    mode: np.ndarray  # (instructions,): WHOLE, ROWS, HEADS or COLS
    wts: np.ndarray  # (shards, instructions, MAX_W, 5)
    c0: np.ndarray  # (shards, instructions, MAX_W): where each weight's outputs start in its output row
    arenas: np.ndarray  # (shards, arena size); the program's arena is arenas[0]
    parts: np.ndarray  # (2, shards, widest output): partial sums, the two halves used in turn
    xq: np.ndarray
    xd: np.ndarray
    xs: np.ndarray
    flags: np.ndarray
    threaded: bool
    # of the last profiled step: cycles working and then waiting at the barrier, per shard and instruction
    spans: np.ndarray | None = None

    @property
    def n_shards(self) -> int:
        return self.arenas.shape[0]


def _split_rows(w: np.ndarray, n_sh: int, s: int, align: int) -> tuple[np.ndarray, int] | None:
    """Shard ``s``'s rows of the weight row ``w`` (a share of whole ``align``-row runs) and its first output."""
    rows = int(w[mv.W_ROWS])
    per = rows // n_sh
    if rows % n_sh or per % align or (int(w[mv.W_FMT]) in R16_FMTS and per % 16):
        return None
    part = w.copy()
    part[mv.W_ADDR] += s * per * w[mv.W_ROW_BYTES]
    part[mv.W_ROWS] = per
    return part, s * per


def _split_cols(w: np.ndarray, data: np.ndarray, n_sh: int, s: int, levels: int) -> tuple | None:
    """Shard ``s``'s columns of the weight row ``w`` (its bytes ``data``: rows x row bytes): its share of each
    row's decode units, copied into an array of their own so that the shard streams one contiguous stretch
    (the row, the array). None where the units do not divide or interleaved rows meet float activations."""
    fmt, units = int(w[mv.W_FMT]), int(w[mv.W_UNITS])
    per = units // n_sh
    if units % n_sh or (fmt in R16_FMTS and levels == 0):  # interleaved float rows dequantize whole rows
        return None
    lanes = 16 if fmt in R16_FMTS else 1  # interleaved layouts: 16 rows' units side by side
    rows, rb = data.shape
    units_of = data.reshape(rows // lanes, units, lanes * rb // units)
    mine = np.ascontiguousarray(units_of[:, s * per : (s + 1) * per]).reshape(rows, rb // units * per)
    part = w.copy()
    part[mv.W_ADDR], part[mv.W_ROW_BYTES], part[mv.W_UNITS] = mine.ctypes.data, mine.shape[1], per
    return part, mine


def plan(b: CpuBackend, prog: pg.Program, n_shards: int, threaded: bool) -> ShardPlan | None:
    """The shard plan of a lowered program, or None where its graph is not the dense one-KV-head decode
    graph this module splits (see the module docstring) or its shapes do not divide among the shards."""
    code, n = prog.code, len(prog.code) - 1  # the last instruction, the LM head, runs as in a program
    if n < 1 or code[n, pg.C_OP] != pg.NORM_MATMUL:
        return None
    mode = np.full(n, WHOLE, np.int64)
    wts = np.repeat(prog.wts[None, :n], n_shards, axis=0)
    c0 = np.zeros((n_shards, n, pg.MAX_W), np.int64)
    split: set[int] = set()  # arena offsets of tensors each shard holds only its share of
    hd = next((int(c[pg.C_AUX2]) for c in code[:n] if c[pg.C_OP] == pg.ATTENTION), 0)
    for i, c in enumerate(code[:n]):
        op = c[pg.C_OP]
        reads = {int(c[pg.C_IN])} | ({int(c[pg.C_AUX])} if op in (pg.ADD, pg.MATMUL_NORM_ADD) else set())
        if op == pg.SPARSE_FFN or (op == pg.NORM_MATMUL and c[pg.C_NW] != 3):
            return None
        if op in (pg.NORM_ROPE, pg.ATTENTION, pg.MATMUL_NORM_ADD) and c[pg.C_IN] in split:
            mode[i] = COLS if op == pg.MATMUL_NORM_ADD else HEADS
            if int(c[pg.C_K]) % (32 * n_shards):
                return None
            if op == pg.ATTENTION:
                if c[pg.C_BLK] > 0 or c[pg.C_NORM] != c[pg.C_AUX2] or c[pg.C_K] % (n_shards * c[pg.C_AUX2]):
                    return None  # block-sparse, or more than one KV head
                if {int(c[pg.C_OUTS]), int(c[pg.C_OUTS + 1])} & split:
                    return None
            if op != pg.MATMUL_NORM_ADD:
                split.add(int(c[pg.C_OUT]))
            for s in range(n_shards):
                if op == pg.MATMUL_NORM_ADD:
                    name = prog.ops[i].attrs["parts"][0].weights[0]
                    key = (name, n_shards, s)  # copies shared by the backend's programs
                    if key not in b.col_shares:
                        b.col_shares[key] = _split_cols(
                            prog.wts[i, 0], b.weights[name].data, n_shards, s, b.levels
                        )
                    if b.col_shares[key] is None:
                        return None
                    wts[s, i, 0] = b.col_shares[key][0]
            if reads - {int(c[pg.C_IN])} & split:
                return None
        elif op in (pg.NORM_MATMUL, pg.NORM_MATMUL_GELU) and not reads & split and hd:
            mode[i] = ROWS
            for j in range(1 if op == pg.NORM_MATMUL else 2):
                for s in range(n_shards):
                    got = _split_rows(prog.wts[i, j], n_shards, s, hd if op == pg.NORM_MATMUL else 32)
                    if got is None:
                        return None
                    wts[s, i, j], c0[s, i, j] = got
                split.add(int(c[pg.C_OUTS + j]))
            if op == pg.NORM_MATMUL_GELU:
                split.add(int(c[pg.C_OUT]))
        elif reads & split or op in (pg.ATTENTION, pg.MATMUL_NORM_ADD, pg.NORM_MATMUL, pg.NORM_MATMUL_GELU):
            return None  # a whole op reading a split tensor, or a projection left whole
    if int(code[n, pg.C_IN]) in split or not (mode == COLS).any():
        return None
    arenas = np.zeros((n_shards, prog.arena.size), np.float32)
    prog.arena = arenas[0]
    widest = int(max(code[:n, pg.C_N].max(), 1))
    return ShardPlan(
        mode, wts, c0, arenas, np.zeros((2, n_shards, widest), np.float32),
        np.repeat(b.xq[None], n_shards, axis=0), np.repeat(b.xd[None], n_shards, axis=0),
        np.repeat(b.xs[None], n_shards, axis=0), np.zeros((n_shards + 1) * LINE, np.int64), threaded,
    )  # fmt: skip


def execute(
    b: CpuBackend, prog: pg.Program, step: Step, observer: OpObserver | None, argmax: bool = False
) -> tuple[np.ndarray, int]:
    """:func:`.program.execute` for a program with a shard plan: the body in shards, then the LM head."""
    sh = prog.shards
    pos, kv, rope, maxima = pg.step_inputs(b, prog, step, argmax)
    n = len(prog.code) - 1
    spans = np.zeros((2, sh.n_shards, n if observer is not None else 0), np.int64)
    stamps = np.zeros(2 if observer is not None else 0, np.int64)
    sh.flags[:] = 0
    t0 = time.perf_counter()
    ok = run_shards(sh.threaded, prog.code[:n], prog.fp[:n], sh.mode, sh.wts, sh.c0, sh.arenas, sh.parts, prog.norms,
                    int(step.tokens[0]), pos, rope, kv, b.levels, sh.xq, sh.xd, sh.xs, sh.flags, spans)  # fmt: skip
    if not ok:
        raise RuntimeError(
            f"cpu backend: the {sh.n_shards} decode shards did not run concurrently (a shard waited "
            f"{SPIN_LIMIT} cycles at a barrier; threading layer {numba.threading_layer()}, "
            f"{numba.get_num_threads()} threads); run with --tune decode_shards=1 or on fewer shards than threads"
        )
    t1 = time.perf_counter()
    token, _ = pg.run_program(prog.code[n:], prog.fp[n:], prog.wts[n:], prog.arena, prog.norms, 0, pos, rope, kv,
                              b.levels, b.xq, b.xd, b.xs, b.rows_per_task, stamps, maxima, 0)  # fmt: skip
    if observer is not None:
        per_s = pg.cycle_rate()
        at = t0
        took = spans[:, 0].sum(axis=0) if sh.threaded else spans[0].sum(axis=0)  # shard 0's, or all shards'
        for i in range(n):
            observer.on_op(prog.ops[i], step, at, took[i] / per_s, None)
            at += took[i] / per_s
        sh.spans = spans
        observer.on_op(prog.ops[n], step, t1, (stamps[1] - stamps[0]) / per_s, None)
    return pg.step_done(prog, step, pos), int(token)
