"""Decode steps split across threads by attention heads and hidden units: two exchanges a layer.

A program (:mod:`.program`) runs each projection as a parallel loop over its rows, and the norms, RoPE and
attention on one thread: ~90 hand-offs a token, each exchanging vectors that one thread wrote and the other
reads. Where the threads sit on two chiplets every hand-off costs microseconds, as much in all as streaming
the layers' weights; here a layer has two (figures: docs/backend-cpu.md#decode-shards).

Here each of ``n_shards`` shards runs every layer on its own copy of the residual stream: it computes the
norms itself, and its own share of the query heads (Q rows, norm, RoPE, attention), of the KV heads (K and V
rows, norm, RoPE, cache columns; a single KV head every shard computes and stores whole), of the attention
output projection's columns (a partial sum), of the FFN's hidden units (gate/up rows, GELU) and of the down
projection's columns (a partial sum). The partial sums are the only
exchanges: each shard writes its own, waits at a barrier, and adds all shards' partials in shard order, so
every shard holds the same bits. The LM head then runs as in a program (a parallel loop over its rows).

Results depend on the number of shards, not of threads: with fewer threads than shards (or a threading
layer that may run two iterations of a parallel loop on one thread) one thread runs the shards one after
the other between exchanges. The shards run the program's interpreter (:func:`.program.run_segment`): a
plan is data, each instruction's ``mode`` and each shard's weight rows. Planned: dense Gemma 3 decode graphs
whose heads and KV heads divide among the shards (or one KV head); other graphs run their program as before.
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

from ...numba_jit import numba
from . import instructions as ins
from . import matvec as mv
from . import program as pg
from . import step_inputs as si
from .cycles import cycle_counter
from .simd import R16_FMTS

if TYPE_CHECKING:
    from ..base import OpObserver, Step
    from . import CpuBackend

njit = numba.njit

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
    t0 = cycle_counter()
    for o in range(n_shards):
        spins = 0
        while _load_acquire(flags, o * LINE) < epoch:
            _pause()
            spins += 1
            if spins % 1024 == 0 and (
                _load_acquire(flags, n_shards * LINE) != 0 or cycle_counter() - t0 > SPIN_LIMIT
            ):
                _store_release(flags, n_shards * LINE, 1)
                return False
    return True


@njit(parallel=True, cache=True)
def run_shards(threaded, code, wts, c0, arenas, parts, norms, token, pos, rope, kv, levels, xq, xd, xs, flags,
               spans):  # fmt: skip  # pragma: no cover - compiled
    """Run the body ``code`` (every instruction before the LM head) for one token: with ``threaded`` one
    thread per shard meeting at barriers (``flags`` zeroed: one line per shard, then the give-up flag),
    else the shards one after the other between exchanges. ``spans`` (2, shards, instructions; empty: off)
    receives the cycles each shard spent on each instruction, working and then waiting at the barrier
    after it. Returns False when a shard gave up waiting at a barrier (threads not concurrent)."""
    n_sh, end = arenas.shape[0], code.shape[0]
    maxima = np.zeros(0, np.float32)  # no argmax in the body
    rpt = np.int64(0)  # shards run their projections on their own thread: no tasks
    if threaded:
        for sh in prange(n_sh):
            # typed np.int64 and a non-literal bool, as in the serial loop below: literal or unsigned
            # arguments would compile run_segment once per type
            s, i, resume, epoch = np.int64(sh), np.int64(0), n_sh < 0, np.int64(0)
            while i < end:
                i, _, _ = pg.run_segment(s, i, resume, epoch, code, wts, c0, arenas, parts, norms, token, pos, rope,
                                         kv, levels, xq, xd, xs, rpt, maxima, spans)  # fmt: skip
                if i < end:
                    epoch += 1
                    t0 = cycle_counter()
                    if not _barrier(flags, s, n_sh, epoch):
                        break
                    if spans.shape[2] > 0:
                        spans[1, s, i] += cycle_counter() - t0
                    resume = True
        return _load_acquire(flags, n_sh * LINE) == 0
    i, resume, epoch = np.int64(0), n_sh < 0, np.int64(0)
    while i < end:
        nxt = end
        for s in range(n_sh):
            nxt, _, _ = pg.run_segment(s, i, resume, epoch, code, wts, c0, arenas, parts, norms, token, pos, rope,
                                       kv, levels, xq, xd, xs, rpt, maxima, spans)  # fmt: skip
        i, resume = nxt, True
        epoch += 1
    return True


@dataclass
class ShardPlan:
    """What the shards run besides the program's instructions (whose ``mode`` the plan set): per shard its
    weight rows or columns and where their outputs go, the shards' arenas, partial sums, activation scratch
    and barrier flags."""

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


def split_rows(w: np.ndarray, n_sh: int, s: int, align: int) -> tuple[np.ndarray, int] | None:
    """Shard ``s``'s rows of the weight row ``w`` (a share of whole ``align``-row runs) and its first output."""
    rows = int(w[mv.W_ROWS])
    per = rows // n_sh
    if rows % n_sh or per % align or (int(w[mv.W_FMT]) in R16_FMTS and per % 16):
        return None
    part = w.copy()
    part[mv.W_ADDR] += s * per * w[mv.W_ROW_BYTES]
    part[mv.W_ROWS] = per
    return part, s * per


def split_cols(w: np.ndarray, data: np.ndarray, n_sh: int, s: int, levels: int) -> tuple | None:
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


class _Planner:
    """Follows which tensors the shards hold only their share of, instruction by instruction, and sets each
    instruction's mode and each shard's weight rows; ``fail`` says why a graph has no plan."""

    def __init__(self, b: CpuBackend, prog: ins.Program, n_shards: int, n: int):
        self.b, self.prog, self.n_sh = b, prog, n_shards
        self.mode = np.full(n, ins.WHOLE, np.int64)
        self.wts = np.repeat(prog.wts[:, :n], n_shards, axis=0)
        self.c0 = np.zeros((n_shards, n, ins.MAX_W), np.int64)
        self.split: set[int] = set()  # arena offsets of tensors each shard holds only its share of

    def rows(self, i: int, j: int, align: int) -> bool:
        """Give each shard its share of weight ``j``'s rows (whole ``align``-row runs); False: they don't divide."""
        for s in range(self.n_sh):
            got = split_rows(self.prog.wts[0, i, j], self.n_sh, s, align)
            if got is None:
                return False
            self.wts[s, i, j], self.c0[s, i, j] = got
        self.split.add(int(self.prog.code[i]["outs"][j]))
        return True

    def cols(self, i: int) -> bool:
        """Give each shard a copy of its share of the columns of instruction ``i``'s weight (shared by the
        backend's programs); False: they don't divide."""
        name = self.prog.ops[i].attrs["parts"][0].weights[0]
        for s in range(self.n_sh):
            key = (name, self.n_sh, s)
            if key not in self.b.col_shares:
                data = self.b.weights[name].data
                self.b.col_shares[key] = split_cols(self.prog.wts[0, i, 0], data, self.n_sh, s, self.b.levels)
            if self.b.col_shares[key] is None:
                return False
            self.wts[s, i, 0] = self.b.col_shares[key][0]
        return True

    def step(self, i: int, c, hd: int) -> bool:
        """Plan instruction ``i`` (record ``c``); False where the shards cannot split it."""
        op, split, n_sh = int(c["op"]), self.split, self.n_sh
        reads = {int(c["inp"])} | ({int(c["other"])} if op in (ins.ADD, ins.MATMUL_NORM_ADD) else set())
        kv = {int(c["keys_in"]), int(c["vals_in"])} if op == ins.ATTENTION else set()
        if (
            op == ins.SPARSE_FFN
            or (op == ins.NORM_MATMUL and c["n_w"] != 3)
            or (reads - {int(c["inp"])}) & split
        ):
            return False
        if int(c["inp"]) in split:  # the shards' shares of heads or hidden units flow on
            if op not in (ins.NORM_ROPE, ins.ATTENTION, ins.MATMUL_NORM_ADD) or int(c["k"]) % (32 * n_sh):
                return False
            if op == ins.MATMUL_NORM_ADD:
                self.mode[i] = ins.COLS
                return self.cols(i)
            self.mode[i] = ins.HEADS
            if op == ins.ATTENTION:
                if c["blocks"][0] > 0 or c["k"] % (n_sh * hd):
                    return False  # block-sparse, or heads that do not divide
                if kv <= split and c["kv_width"] % (n_sh * hd) == 0:
                    self.mode[i] = ins.KV_HEADS  # each shard stores and reads its KV heads
                elif kv & split or c["kv_width"] != hd:
                    return False  # whole KV heads are shared only when there is one
            split.add(int(c["out"]))
            return True
        if op == ins.NORM_MATMUL:  # QKV: the query heads split, the KV heads too where they divide
            self.mode[i] = ins.ROWS
            n_kv = int(self.prog.wts[0, i, 1, mv.W_ROWS]) // hd
            kv_split = n_kv % n_sh == 0
            return self.rows(i, 0, hd) and (not kv_split or (self.rows(i, 1, hd) and self.rows(i, 2, hd)))
        if op == ins.NORM_MATMUL_GELU:  # gate and up: the hidden units split
            self.mode[i] = ins.ROWS
            split.add(int(c["out"]))
            return self.rows(i, 0, 32) and self.rows(i, 1, 32)
        return op not in (ins.ATTENTION, ins.MATMUL_NORM_ADD)  # a projection or attention left whole: no plan


def plan(b: CpuBackend, prog: ins.Program, n_shards: int, threaded: bool) -> ShardPlan | None:
    """The shard plan of a lowered program (setting its instructions' modes), or None where its graph is not
    a dense decode graph this module splits (see the module docstring) or its shapes do not divide."""
    code, n = prog.code, len(prog.code) - 1  # the last instruction, the LM head, runs as in a program
    if n < 1 or code[n]["op"] != ins.NORM_MATMUL:
        return None
    hd = next((int(c["head_dim"]) for c in code[:n] if c["op"] == ins.ATTENTION), 0)
    cols = {
        prog.ops[i].attrs["parts"][0].weights[0]
        for i in np.flatnonzero(code["op"][:n] == ins.MATMUL_NORM_ADD)
    }
    need = sum(b.weights[name].data.nbytes for name in cols)
    if need > b.shard_copy_mib << 20:  # the shards' column copies would take more memory than allowed
        b.shard_refusal = (
            f"column copies would take {need / 2**20:.0f} MiB > shard_copy_mib={b.shard_copy_mib}"
        )
        return None
    p = _Planner(b, prog, n_shards, n)
    if not hd or not all(p.step(i, c, hd) for i, c in enumerate(code[:n])):
        return None
    if int(code[n]["inp"]) in p.split or not (p.mode == ins.COLS).any():
        return None
    code["mode"][:n] = p.mode
    arenas = np.zeros((n_shards, prog.arenas.shape[1]), np.float32)
    prog.arenas = arenas
    widest = int(max(code["n"][:n].max(), 1))
    return ShardPlan(
        p.wts, p.c0, arenas, np.zeros((2, n_shards, widest), np.float32),
        np.repeat(b.xq[None], n_shards, axis=0), np.repeat(b.xd[None], n_shards, axis=0),
        np.repeat(b.xs[None], n_shards, axis=0), np.zeros((n_shards + 1) * LINE, np.int64), threaded,
    )  # fmt: skip


def execute(
    b: CpuBackend, prog: ins.Program, step: Step, observer: OpObserver | None, argmax: bool = False
) -> tuple[np.ndarray, int]:
    """:func:`.program.execute` for a program with a shard plan: the body in shards, then the LM head."""
    sh = prog.shards
    pos, kv, rope, maxima = si.read(b, prog, step, argmax)
    n = len(prog.code) - 1
    spans = np.zeros((2, sh.n_shards, n if observer is not None else 0), np.int64)
    head = np.zeros((2, 1, 1 if observer is not None else 0), np.int64)
    sh.flags[:] = 0
    t0 = time.perf_counter()
    ok = run_shards(sh.threaded, prog.code[:n], sh.wts, sh.c0, sh.arenas, sh.parts, prog.norms, int(step.tokens[0]),
                    pos, rope, kv, b.levels, sh.xq, sh.xd, sh.xs, sh.flags, spans)  # fmt: skip
    if not ok:
        raise RuntimeError(
            f"cpu backend: the {sh.n_shards} decode shards did not run concurrently (a shard waited "
            f"{SPIN_LIMIT} cycles at a barrier; threading layer {numba.threading_layer()}, "
            f"{numba.get_num_threads()} threads); run with --tune decode_shards=1 or on fewer shards than threads"
        )
    t1 = time.perf_counter()
    token = pg.run_whole(b, prog, n, 0, pos, rope, kv, maxima, head)
    if observer is not None:
        took = spans[0, 0] + spans[1, 0] if sh.threaded else spans[0].sum(axis=0)  # shard 0's, or all shards'
        pg.report(observer, step, prog.ops[:n], t0, took)
        sh.spans = spans
        pg.report(observer, step, prog.ops[n:], t1, head[0, 0])
    return si.step_done(prog, step, pos), token
