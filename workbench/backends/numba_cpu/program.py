"""Decode steps as one compiled call: the fused graph of a one-token step lowered to an instruction table.

The per-op path runs a Python handler per op (~130 ops a token), each paying the interpreter, numba's
argument dispatch and fresh output arrays: milliseconds per token at 60-100 tokens/s. Here the graph of a
one-token step is lowered once per graph to a table (one row per op: opcode, tensor offsets in one float32
arena, weight addresses in the GGUF mapping) that one numba function executes, calling the same kernels
as the per-op handlers (parallel matvecs, norms, RoPE, attention over the KV cache in place). Lowering
covers the fused kinds of a decode graph, unfused norms and adds, and ``sparse_ffn`` (:mod:`.sparse`); a
graph with any other op runs op by op, as before.

With a profiler attached, the interpreter stamps the CPU cycle counter after each op, and each op is
reported with its measured time (the counter is calibrated against ``time.perf_counter``).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..._numba import numba
from ...ops import reference as ref
from ...ops.graph import Graph, Op
from . import kernels as k
from . import matvec as mv
from . import sparse as sp
from . import sparse_attention as sa
from .addr import f32_ptr, i64_ptr

if TYPE_CHECKING:
    from ..base import OpObserver, Step
    from . import CpuBackend
    from .shards import ShardPlan

njit = numba.njit

EMBED, NORM_MATMUL, NORM_MATMUL_GELU, NORM_ROPE, ATTENTION, MATMUL_NORM_ADD = range(6)
RMSNORM, ADD, SPARSE_FFN = range(6, 9)  # unfused norms and adds (around a sparse FFN), the sparse FFN
# columns of an instruction row
C_OP, C_IN, C_K, C_OUT, C_N, C_NORM, C_AUX, C_AUX2, C_NW, C_OUTS = range(10)  # C_OUTS..+2: matmul outputs
C_BLK = C_OUTS + 3  # block-sparse attention: block, sink, local, stride (block 0: dense)
C_PF = C_BLK + 4  # a projection: 1 + the layer whose KV rows its tasks prefetch (0: none), and their width
N_COLS = C_PF + 2
MAX_W = 3  # weights of one instruction (Q, K, V)
# columns of the float parameters: eps, scale, window
F_EPS, F_SCALE, F_WINDOW = range(3)
# columns of the per-step KV table (one row per layer)
KV_KEYS, KV_VALS, KV_POS, KV_CAP, KV_RING = range(5)


@intrinsic
def cycle_counter(typingctx):
    """The CPU's cycle counter (``llvm.readcyclecounter``: rdtsc on x86)."""

    def codegen(context, b, signature, args):
        fn = b.module.globals.get("llvm.readcyclecounter") or ir.Function(
            b.module, ir.FunctionType(ir.IntType(64), []), "llvm.readcyclecounter"
        )
        return b.call(fn, [])

    return types.int64(), codegen


@njit(cache=True)
def cycles():  # pragma: no cover - compiled
    return cycle_counter()


@njit(cache=True)
def arena_row(arena, off, n):  # pragma: no cover - compiled
    return arena[off : off + n].reshape((1, n))


@njit(cache=True)
def _project(wt, n_w, x, outs, levels, xq, xd, xs, rpt, maxima, pf):  # pragma: no cover
    """``outs[j] = x @ W_j.T`` for the first ``n_w`` weights of ``wt``; int16 activations unless levels = 0;
    the tasks prefetch the region ``pf`` describes (see :func:`.matvec.prefetch_share`) and record their
    largest outputs in ``maxima`` where it asks for them; returns the number of tasks recorded."""
    if levels > 0:
        mv.quantize_rows_i16(x, levels, xq, xd, xs)
        return mv.matvec_table_i16(wt, n_w, outs, xq, xd, xs, rpt, pf, maxima)
    mv.block_sums(x, xs)
    return mv.matvec_table_f32(wt, n_w, outs, x, xs, rpt, pf, maxima)


@njit(cache=True)
def kv_prefetch_region(kv, layer, width, pos, pf):  # pragma: no cover - compiled
    """Fill ``pf`` with the KV rows a decode attention at ``pos`` reads in ``layer`` (rows 0 .. the slots
    written, ``width`` floats each), their first PREFETCH_MAX / 2 bytes of keys and of values at most."""
    n = min(kv[layer, KV_CAP], pos) * width * 4
    pf[0], pf[1], pf[2] = kv[layer, KV_KEYS], kv[layer, KV_VALS], min(n, mv.PREFETCH_MAX // 2)


@njit(cache=True)
def embed(w, token, scale, out):  # pragma: no cover - compiled
    """``out`` = row ``token`` of the embedding table ``w`` (a weight-table row), times ``scale``."""
    mv.dequant_row_at(w[mv.W_FMT], w[mv.W_ADDR], w[mv.W_ROW_BYTES], token, out.ctypes.data, w[mv.W_UNITS])
    k.scale_rows(out, scale)


@njit(cache=True)
def kv_append(kv, layer, c, pos, arena):  # pragma: no cover - compiled
    """Store the key and value rows of attention instruction ``c`` (in ``arena``) in ``layer``'s cache slot
    for ``pos``; returns the layer's keys, values, slot positions and the number of slots in use."""
    kd = c[C_NORM]  # k/v width (n_kv_heads * head_dim)
    cap, ring = kv[layer, KV_CAP], kv[layer, KV_RING]
    keys = numba.carray(f32_ptr(kv[layer, KV_KEYS]), (cap, kd))
    vals = numba.carray(f32_ptr(kv[layer, KV_VALS]), (cap, kd))
    kpos = numba.carray(i64_ptr(kv[layer, KV_POS]), (cap,))
    slot = pos % ring if ring > 0 else pos
    keys[slot] = arena[c[C_OUTS] : c[C_OUTS] + kd]
    vals[slot] = arena[c[C_OUTS + 1] : c[C_OUTS + 1] + kd]
    kpos[slot] = pos
    return keys, vals, kpos, min(cap, pos + 1)


@njit(cache=True)
def run_program(
    code, fp, wts, arena, norms, token, pos, rope, kv, levels, xq, xd, xs, rpt, stamps, maxima, start
):  # pragma: no cover
    """Execute the instructions ``code`` from ``start`` for one token at position ``pos``; ``stamps`` (empty:
    off) receives the cycle counter before the first and after each instruction. Stops before an instruction
    of :func:`run_sparse_instruction` and returns (-1, its index); at the end returns (the argmax of the last
    instruction's output when it is a projection whose tasks fit ``maxima`` (empty: not wanted), else -1,
    the number of instructions)."""
    # counters start as np.int64 (not a bare 0): numba types a call with a literal argument as a separate
    # specialization, compiling the callee twice
    pf = np.zeros(3, np.int64)
    last, recorded = code.shape[0] - 1, np.int64(0)
    if stamps.shape[0] and start == 0:
        stamps[0] = cycle_counter()
    for i in range(start, code.shape[0]):
        c = code[i]
        op = c[C_OP]
        kk, n = c[C_K], c[C_N]
        x = arena_row(arena, c[C_IN], kk)
        out = arena_row(arena, c[C_OUT], n)
        if op == EMBED:
            embed(wts[i, 0], token, fp[i, F_SCALE], out)
        elif op == NORM_ROPE:
            t = c[C_AUX]
            k.rmsnorm_rope(x, norms[c[C_NORM] : c[C_NORM] + c[C_AUX2]], fp[i, F_EPS], rope[t, 0:1], rope[t, 1:2],
                           c[C_AUX2], out)  # fmt: skip
        elif op == ATTENTION:
            layer, hd = c[C_AUX], c[C_AUX2]
            if c[C_BLK] > 0:
                return np.int64(-1), i  # block-sparse attention: run_sparse_instruction
            keys, vals, kpos, used = kv_append(kv, layer, c, pos, arena)
            k.attend_one(x[0], keys, vals, kpos, used, pos, kk // hd, hd, fp[i, F_SCALE],
                         np.int64(fp[i, F_WINDOW]), out[0])  # fmt: skip
        elif op == RMSNORM:  # C_AUX: the group (row length for a plain norm)
            k.rmsnorm(x, norms[c[C_NORM] : c[C_NORM] + c[C_AUX]], fp[i, F_EPS], c[C_AUX], out)
        elif op == ADD:
            k.add(x, arena_row(arena, c[C_AUX], kk), out)
        elif op == SPARSE_FFN:
            return np.int64(-1), i  # run_sparse_instruction
        else:
            nw = c[C_NW]
            o0 = arena_row(arena, c[C_OUTS], wts[i, 0, mv.W_ROWS])
            o1 = arena_row(arena, c[C_OUTS + 1], wts[i, 1, mv.W_ROWS]) if nw > 1 else o0
            o2 = arena_row(arena, c[C_OUTS + 2], wts[i, 2, mv.W_ROWS]) if nw > 2 else o0
            if op == MATMUL_NORM_ADD:
                pf[2] = 0
                _project(wts[i], np.int64(1), x, (o0, o0, o0), levels, xq, xd, xs, rpt, maxima[:0], pf)
                res = arena_row(arena, c[C_AUX], n)
                k.rmsnorm_add(o0, norms[c[C_NORM] : c[C_NORM] + n], fp[i, F_EPS], res, out)
            else:
                h = arena_row(arena, c[C_AUX], kk)
                k.rmsnorm(x, norms[c[C_NORM] : c[C_NORM] + kk], fp[i, F_EPS], kk, h)
                pf[2] = 0
                if c[C_PF] > 0:
                    kv_prefetch_region(kv, c[C_PF] - 1, c[C_PF + 1], pos, pf)
                mx = maxima if i == last and op == NORM_MATMUL else maxima[:0]
                recorded = _project(wts[i], nw, h, (o0, o1, o2), levels, xq, xd, xs, rpt, mx, pf)
                if op == NORM_MATMUL_GELU:
                    k.gelu_mul(o0, o1, out)
        if stamps.shape[0]:
            stamps[i + 1] = cycle_counter()
    end = np.int64(code.shape[0])
    if recorded == 0:
        return np.int64(-1), end
    return mv.argmax_of_tasks(wts[last], rpt, maxima, recorded, arena[code[last, C_OUTS] :]), end


@njit(cache=True)
def stamp(stamps, j):  # pragma: no cover - compiled
    """stamps[j] = the cycle counter (from Python: the counter is an intrinsic)."""
    stamps[j] = cycle_counter()


@njit(cache=True)
def run_sparse_instruction(i, code, fp, wts, arena, pos, kv, levels, xq, xd, xs, rpt):  # pragma: no cover
    """Instruction ``i`` of a program, one :func:`run_program` stops before: a sparse FFN or a block-sparse
    attention. Their kernels live here, not in run_program, so a dense model never compiles them."""
    c = code[i]
    op, kk, n = c[C_OP], c[C_K], c[C_N]
    x = arena_row(arena, c[C_IN], kk)
    out = arena_row(arena, c[C_OUT], n)
    if op == SPARSE_FFN:  # C_AUX: gate scratch; C_AUX2: kept count (0: statistical, F_SCALE its z)
        g = arena_row(arena, c[C_AUX], wts[i, 0, mv.W_ROWS])
        pf = np.zeros(3, np.int64)
        _project(wts[i], np.int64(1), x, (g, g, g), levels, xq, xd, xs, rpt, np.zeros(0, np.float32), pf)
        sp.kept_ffn(wts[i], g[0], c[C_AUX2], fp[i, F_SCALE], levels, x, xq, xd, xs, out[0], c[C_NW])
    else:  # ATTENTION with C_BLK > 0
        layer, hd = c[C_AUX], c[C_AUX2]
        keys, vals, kpos, used = kv_append(kv, layer, c, pos, arena)
        sa.attend_blocks_one(x[0], keys, vals, kpos, used, kv[layer, KV_RING], pos, kk // hd, hd,
                             fp[i, F_SCALE], np.int64(fp[i, F_WINDOW]), c[C_BLK : C_BLK + 4], out[0])  # fmt: skip


@dataclass
class Program:
    """A lowered one-token graph: instructions, their weights and float parameters, and the arena layout."""

    ops: list[Op]  # the op of each instruction
    code: np.ndarray
    fp: np.ndarray
    wts: np.ndarray
    arena: np.ndarray
    out_offset: int
    out_cols: int
    rope_keys: list[tuple]
    norms: np.ndarray
    rope_chunk: tuple = ()  # (first position, [(cos, sin) per rope key]) of the positions in use
    kv_held: tuple = ()  # (cache, its layers' position arrays, room, KV address table) of the last run
    maxima: np.ndarray | None = None  # per-task maxima of the last projection (the greedy argmax), made once
    shards: ShardPlan | None = None  # how threads split the body by heads and hidden units (shards.py)


LOWERED = {"embed", "rmsnorm_matmul", "rmsnorm_matmul_gelu", "rmsnorm_rope", "attention", "matmul_rmsnorm_add",
           "gather_rows", "rmsnorm", "add", "sparse_ffn", sa.KIND}  # fmt: skip


class _Lowering:
    def __init__(self, b: CpuBackend, graph: Graph):
        self.b, self.graph = b, graph
        self.offsets: dict[str, int] = {}
        self.size = 0
        self.norm_offsets: dict[str, int] = {}
        self.norm_parts: list[np.ndarray] = []
        self.norm_size = 0
        self.rope_keys: list[tuple] = []

    def tensor(self, name: str, cols: int | None = None) -> int:
        if name not in self.offsets:
            n = cols if cols is not None else int(np.prod(self.graph.tensors[name].shape[1:]))
            self.offsets[name] = self.size
            self.size += -(-n // 16) * 16  # 64-byte aligned rows
        return self.offsets[name]

    def cols(self, name: str) -> int:
        return int(np.prod(self.graph.tensors[name].shape[1:]))

    def norm(self, name: str) -> int:
        if name not in self.norm_offsets:
            w = self.b.norms[name]
            self.norm_offsets[name] = self.norm_size
            self.norm_parts.append(w)
            self.norm_size += len(w)
        return self.norm_offsets[name]

    def rope(self, op: Op) -> int:
        a = op.attrs
        key = (a["head_dim"], a["base"], a.get("scale", 1.0))
        if key not in self.rope_keys:
            self.rope_keys.append(key)
        return self.rope_keys.index(key)

    def weights(self, row: np.ndarray, names) -> None:
        for j, name in enumerate(names):
            w = self.b.weights[name]
            row[j] = (w.fmt, w.data.ctypes.data, w.data.shape[1], w.rows, w.n_units)


def _prefetch_host(rows: list[np.ndarray]) -> np.ndarray | None:
    """The instruction that prefetches the KV rows of an attention about to be appended after ``rows``: among
    those since the previous attention, the last gate/up (the previous layer's, dense), else the last QKV
    projection; None when neither is there or it already prefetches for another attention."""
    since = list(itertools.takewhile(lambda r: r[C_OP] != ATTENTION, reversed(rows)))
    for kind in (NORM_MATMUL_GELU, NORM_MATMUL):
        host = next((r for r in since if r[C_OP] == kind), None)
        if host is not None:
            return host if host[C_PF] == 0 else None
    return None


def lower(b: CpuBackend, graph: Graph) -> Program | None:
    """The program of a one-token graph, or None when an op or weight has no lowering (runs op by op)."""
    if any(op.kind not in LOWERED for op in graph.ops):
        return None
    used = {n for op in graph.ops for n in op.weights if n in b.weights}
    if any(b.weights[n].fmt not in mv.QUANT_FMTS for n in used):
        return None
    lw = _Lowering(b, graph)
    ops: list[Op] = []
    rows, fps, wrows = [], [], []
    alias: dict[str, str] = {}

    def src(name: str) -> str:
        return alias.get(name, name)

    for op in graph.ops:
        c = np.zeros(N_COLS, np.int64)
        f = np.zeros(3, np.float64)
        wt = np.zeros((MAX_W, 5), np.int64)
        kind = op.kind
        if kind == "gather_rows":  # one token, its own logits row: the same tensor
            alias[op.outputs[0]] = src(op.inputs[0])
            continue
        if kind == "embed":
            c[C_OP] = EMBED
            lw.weights(wt, op.weights)
            f[F_SCALE] = op.attrs["scale"]
            c[C_K] = 1
        elif kind == "rmsnorm_rope":
            norm, rope = op.attrs["parts"]
            c[C_OP], c[C_NORM], c[C_AUX], c[C_AUX2] = (
                NORM_ROPE,
                lw.norm(norm.weights[0]),
                lw.rope(rope),
                rope.attrs["head_dim"],
            )
            f[F_EPS] = norm.attrs["eps"]
            if len(b.norms[norm.weights[0]]) != rope.attrs["head_dim"]:
                return None
        elif kind in ("attention", sa.KIND):
            a = op.attrs
            c[C_BLK : C_BLK + 4] = a.get("blocks", (0, 0, 0, 0))
            c[C_OP], c[C_AUX], c[C_AUX2] = ATTENTION, op.layer, a["head_dim"]
            c[C_NORM] = a["n_kv_heads"] * a["head_dim"]
            c[C_OUTS], c[C_OUTS + 1] = lw.tensor(src(op.inputs[1])), lw.tensor(src(op.inputs[2]))
            f[F_SCALE], f[F_WINDOW] = a["scale"], a.get("window", 0)
            host = _prefetch_host(rows) if c[C_BLK] == 0 else None  # dense attention: prefetched KV rows
            if host is not None:
                host[C_PF], host[C_PF + 1] = op.layer + 1, c[C_NORM]
        elif kind == "rmsnorm":
            c[C_OP], c[C_NORM] = RMSNORM, lw.norm(op.weights[0])
            c[C_AUX] = op.attr("group") or lw.cols(src(op.inputs[0]))
            f[F_EPS] = op.attrs["eps"]
        elif kind == "add":
            c[C_OP], c[C_AUX] = ADD, lw.tensor(src(op.inputs[1]))
        elif kind == "sparse_ffn":
            c[C_OP], c[C_NW] = SPARSE_FFN, b.threads_used()  # C_NW: the threads its kernels split work over
            lw.weights(wt, op.weights[:2])
            wt[2] = sp.down_row(b, op)
            c[C_AUX] = lw.tensor(op.name + ".gate", wt[0, mv.W_ROWS])
            c[C_AUX2], f[F_SCALE] = sp.kept_rule(op, wt[0, mv.W_ROWS])
        elif kind == "matmul_rmsnorm_add":
            mat, norm, addop = op.attrs["parts"]
            c[C_OP], c[C_NW], c[C_NORM] = MATMUL_NORM_ADD, 1, lw.norm(norm.weights[0])
            lw.weights(wt, mat.weights)
            c[C_OUTS] = lw.tensor(mat.outputs[0])
            c[C_AUX] = lw.tensor(src(next(t for t in addop.inputs if t != norm.outputs[0])))
            f[F_EPS] = norm.attrs["eps"]
        else:  # rmsnorm_matmul, rmsnorm_matmul_gelu
            norm, *mats = op.attrs["parts"]
            if kind == "rmsnorm_matmul_gelu":
                mats = mats[:-1]
            if len(mats) > MAX_W or norm.attr("group") not in (None, lw.cols(src(norm.inputs[0]))):
                return None
            c[C_OP] = NORM_MATMUL if kind == "rmsnorm_matmul" else NORM_MATMUL_GELU
            c[C_NW], c[C_NORM] = len(mats), lw.norm(norm.weights[0])
            c[C_AUX] = lw.tensor(norm.outputs[0], lw.cols(src(norm.inputs[0])))
            lw.weights(wt, [m.weights[0] for m in mats])
            for j, m in enumerate(mats):
                c[C_OUTS + j] = lw.tensor(m.outputs[0])
            f[F_EPS] = norm.attrs["eps"]
        if kind != "embed":
            c[C_IN], c[C_K] = lw.tensor(src(op.inputs[0])), lw.cols(src(op.inputs[0]))
        if kind == "rmsnorm_matmul":  # outputs are the projections'; ``out`` views the first
            c[C_OUT], c[C_N] = c[C_OUTS], wt[0, mv.W_ROWS]
        else:
            c[C_OUT], c[C_N] = lw.tensor(op.outputs[0]), lw.cols(op.outputs[0])
        rows.append(c)
        fps.append(f)
        wrows.append(wt)
        ops.append(op)
    final = src(graph.outputs[0])
    if final not in lw.offsets:
        return None
    norms = np.concatenate(lw.norm_parts).astype(np.float32) if lw.norm_parts else np.zeros(1, np.float32)
    return Program(
        ops, np.array(rows), np.array(fps), np.array(wrows), np.zeros(lw.size, np.float32),
        lw.offsets[final], lw.cols(final), lw.rope_keys, norms,
    )  # fmt: skip


def runnable(step: Step) -> bool:
    """Whether a step is what programs run: one sequence, one token, its logits, a float32 host KV cache."""
    if not (step.n_tokens == 1 and len(step.seqs) == 1 and len(step.logit_rows) == 1):
        return False
    layers = getattr(step.seqs[0].cache, "layers", None)
    return bool(layers) and all(
        isinstance(getattr(layer, "keys", None), np.ndarray) and layer.keys.dtype == np.float32
        for layer in layers
    )


def execute(
    b: CpuBackend, prog: Program, step: Step, observer: OpObserver | None, argmax: bool = False
) -> tuple[np.ndarray, int]:
    """Run ``prog`` for ``step``: a view of the logits in the program's arena (valid until the next run of
    this program) and, with ``argmax``, their argmax found by the LM head's own tasks (-1 where they could not:
    see :func:`.matvec.argmax_of_tasks`; a cold np.argmax over the vocabulary's logits costs more:
    docs/backend-cpu.md#the-lm-head)."""
    pos, kv, rope, maxima = step_inputs(b, prog, step, argmax)
    stamps = np.zeros(len(prog.ops) + 1 if observer is not None else 0, np.int64)
    t0 = time.perf_counter()
    token, i = run_program(prog.code, prog.fp, prog.wts, prog.arena, prog.norms, int(step.tokens[0]), pos, rope,
                           kv, b.levels, b.xq, b.xd, b.xs, b.rows_per_task, stamps, maxima, 0)  # fmt: skip
    while i < len(prog.code):  # a sparse instruction, then the rest
        run_sparse_instruction(i, prog.code, prog.fp, prog.wts, prog.arena, pos, kv, b.levels, b.xq, b.xd, b.xs,
                               b.rows_per_task)  # fmt: skip
        if stamps.shape[0]:
            stamp(stamps, i + 1)
        token, i = run_program(prog.code, prog.fp, prog.wts, prog.arena, prog.norms, int(step.tokens[0]), pos,
                               rope, kv, b.levels, b.xq, b.xd, b.xs, b.rows_per_task, stamps, maxima, i + 1)  # fmt: skip
    if observer is not None:
        per_s = cycle_rate()
        for i, op in enumerate(prog.ops):
            start = t0 + (stamps[i] - stamps[0]) / per_s
            observer.on_op(op, step, start, (stamps[i + 1] - stamps[i]) / per_s, None)
    return step_done(prog, step, pos), int(token)


def step_inputs(b: CpuBackend, prog: Program, step: Step, argmax: bool) -> tuple:
    """What a run of ``prog`` for ``step`` reads besides the program: the position, the per-layer KV table,
    the rope rows and the LM head's per-task maxima buffer (empty: no argmax wanted)."""
    pos = int(step.positions[0])
    kv = _kv_table(prog, step.seqs[0].cache, pos)
    maxima = _maxima(prog, b.rows_per_task) if argmax else mv.NO_MAXIMA
    return pos, kv, _rope_rows(prog, pos), maxima


def step_done(prog: Program, step: Step, pos: int) -> np.ndarray:
    """Mark the token at ``pos`` cached; the logits in the program's arena (a view)."""
    step.seqs[0].cache.length = pos + 1
    return prog.arena[prog.out_offset : prog.out_offset + prog.out_cols].reshape(1, -1)


def _maxima(prog: Program, rpt: int) -> np.ndarray:
    """The buffer for the per-task maxima of the program's last projection (one float per task)."""
    if prog.maxima is None:
        _, starts, _ = mv.table_tasks(prog.wts[-1], 1, rpt)
        prog.maxima = np.empty(int(starts[1]), np.float32)
    return prog.maxima


ROPE_CHUNK = 256  # positions whose rope rows are computed at once


def _kv_table(prog: Program, cache, pos: int) -> np.ndarray:
    """The per-layer KV addresses for a token at ``pos``, rebuilt only when a layer's buffers were replaced
    or need room (rebuilding took ~170 us, 1% of a decode step)."""
    held = prog.kv_held
    if held and held[0] is cache and pos < held[2] and all(a.pos is p for a, p in zip(cache.layers, held[1])):
        return held[3]
    kv = np.empty((len(cache.layers), 5), np.int64)
    for i, layer in enumerate(cache.layers):
        layer.reserve(pos + 1)
        kv[i] = (
            layer.keys.ctypes.data,
            layer.values.ctypes.data,
            layer.pos.ctypes.data,
            layer.capacity,
            layer.ring,
        )
    room = min((a.capacity for a in cache.layers if not a.window), default=cache.max_len)
    prog.kv_held = (cache, [a.pos for a in cache.layers], room, kv)
    return kv


def _rope_rows(prog: Program, pos: int) -> np.ndarray:
    """cos and sin of ``pos`` for each rope key, (keys, 2, head_dim), from tables of ROPE_CHUNK positions
    (the same reference function, computed once per chunk instead of once per token)."""
    first = pos - pos % ROPE_CHUNK
    if not prog.rope_chunk or prog.rope_chunk[0] != first:
        positions = np.arange(first, first + ROPE_CHUNK, dtype=np.int32)
        prog.rope_chunk = (first, [ref.rope_tables(positions, *key) for key in prog.rope_keys])
    rope = np.empty(
        (max(1, len(prog.rope_keys)), 2, max((key[0] for key in prog.rope_keys), default=1)), np.float32
    )
    for t, (cos, sin) in enumerate(prog.rope_chunk[1]):
        rope[t, 0, : cos.shape[1]], rope[t, 1, : sin.shape[1]] = cos[pos - first], sin[pos - first]
    return rope


_RATE: list[float] = []


def cycle_rate() -> float:
    """Cycle-counter ticks per second, measured once against ``time.perf_counter`` over 20 ms."""
    if not _RATE:
        cycles()
        t0, c0 = time.perf_counter(), cycles()
        while time.perf_counter() - t0 < 0.02:
            pass
        _RATE.append((cycles() - c0) / (time.perf_counter() - t0))
    return _RATE[0]
