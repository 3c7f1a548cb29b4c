"""The instructions of a one-token program: a named record per fused op, lowered once per graph.

Each lowered op kind has one ``lower_*`` function here, which fills its record (tensor offsets in one float32
arena, norm offsets, weight-table rows), and one execution in :func:`.program.run_segment`, shared by the
row-parallel program and the decode shards (:mod:`.shards`): a shard plan only sets each record's ``mode``
(which share of the op a shard runs) and the weight rows each shard reads.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...ops.graph import Graph, Op
from . import matvec as mv
from . import sparse as sp
from . import sparse_attention as sa

if TYPE_CHECKING:
    from . import CpuBackend
    from .shards import ShardPlan

# opcodes
EMBED, NORM_MATMUL, NORM_MATMUL_GELU, NORM_ROPE, ATTENTION, MATMUL_NORM_ADD, RMSNORM, ADD, SPARSE_FFN = range(
    9
)
# how a shard runs an instruction (``mode``): all of it; its rows of the projections (its heads or hidden
# units); its query heads (with the one KV head whole); its query and KV heads; its columns of the projection
# (a partial sum, then the exchange). A program without shards runs everything WHOLE.
WHOLE, ROWS, HEADS, KV_HEADS, COLS = range(5)
MAX_W = 3  # weights of one instruction (Q, K, V)

i8, f8 = np.int64, np.float64
INSTRUCTION = np.dtype(
    [
        ("op", i8),
        ("mode", i8),
        ("inp", i8),  # arena offset and width of the input row
        ("k", i8),
        ("out", i8),  # arena offset and width of the output row
        ("n", i8),
        ("norm", i8),  # offset of the norm's weights in the program's norms
        ("group", i8),  # rmsnorm: values normalized together (the row, or a head)
        ("scratch", i8),  # a projection's normed input; a sparse FFN's gate
        ("other", i8),  # add: the second addend; matmul_rmsnorm_add: the residual
        ("n_w", i8),  # weights of a projection
        ("outs", i8, (MAX_W,)),  # their output offsets
        ("rope", i8),  # the rope table (index of its key)
        ("head_dim", i8),
        ("layer", i8),  # attention: the KV cache layer
        ("kv_width", i8),  # n_kv_heads * head_dim
        ("keys_in", i8),  # attention: arena offsets of the new key and value rows
        ("vals_in", i8),
        ("blocks", i8, (4,)),  # block-sparse attention: block, sink, local, stride (block 0: dense)
        ("pf_layer", i8),  # a projection: 1 + the layer whose KV rows its tasks prefetch (0: none)
        ("pf_width", i8),  # and the width of those rows
        ("kept", i8),  # sparse FFN: units kept (0: statistical top-k with cutoff z)
        ("threads", i8),  # sparse FFN: threads its kernels split work over
        ("eps", f8),
        ("scale", f8),
        ("window", f8),
        ("z", f8),
    ],
    align=True,
)


@dataclass
class Program:
    """A lowered one-token graph: instructions, their weight tables, and the arena layout."""

    ops: list[Op]  # the op of each instruction
    code: np.ndarray  # INSTRUCTION records
    wts: np.ndarray  # (1, instructions, MAX_W, 5): weight-table rows (matvec.W_FMT ...)
    c0: np.ndarray  # (1, instructions, MAX_W): where each weight's outputs start (0: a program's whole rows)
    arenas: np.ndarray  # (1, arena size): the program's arena (a shard plan replaces it by one per shard)
    out_offset: int
    out_cols: int
    rope_keys: list[tuple]
    norms: np.ndarray
    rope_chunk: tuple = ()  # (first position, [(cos, sin) per rope key]) of the positions in use
    kv_held: tuple = ()  # (cache, its layers' position arrays, room, KV address table) of the last run
    maxima: np.ndarray | None = None  # per-task maxima of the last projection (the greedy argmax), made once
    shards: ShardPlan | None = None  # how threads split the body by heads and hidden units (shards.py)

    @property
    def arena(self) -> np.ndarray:
        return self.arenas[0]


class Lowering:
    """The arena, norm and rope layout a graph's instructions are lowered into."""

    def __init__(self, b: CpuBackend, graph: Graph):
        self.b, self.graph = b, graph
        self.offsets: dict[str, int] = {}
        self.size = 0
        self.norm_offsets: dict[str, int] = {}
        self.norm_parts: list[np.ndarray] = []
        self.norm_size = 0
        self.rope_keys: list[tuple] = []
        self.alias: dict[str, str] = {}  # gather_rows of one row: its output is its input
        self.records: list[np.ndarray] = []

    def src(self, name: str) -> str:
        return self.alias.get(name, name)

    def tensor(self, name: str, cols: int | None = None) -> int:
        name = self.src(name)
        if name not in self.offsets:
            n = cols if cols is not None else self.cols(name)
            self.offsets[name] = self.size
            self.size += -(-n // 16) * 16  # 64-byte aligned rows
        return self.offsets[name]

    def cols(self, name: str) -> int:
        return int(np.prod(self.graph.tensors[self.src(name)].shape[1:]))

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

    def weights(self, wt: np.ndarray, names) -> None:
        for j, name in enumerate(names):
            w = self.b.weights[name]
            wt[j] = (w.fmt, w.data.ctypes.data, w.data.shape[1], w.rows, w.n_units)


# -- one lowering per kind: fill the record ``c`` (and the weight table ``wt``); False: not lowerable ---------
def lower_embed(lw: Lowering, op: Op, c, wt: np.ndarray) -> bool:
    c["op"], c["k"], c["scale"] = EMBED, 1, op.attrs["scale"]
    lw.weights(wt, op.weights)
    return True


def lower_rmsnorm_rope(lw: Lowering, op: Op, c, wt: np.ndarray) -> bool:
    norm, rope = op.attrs["parts"]
    c["op"], c["norm"], c["rope"], c["head_dim"] = (
        NORM_ROPE,
        lw.norm(norm.weights[0]),
        lw.rope(rope),
        rope.attrs["head_dim"],
    )
    c["eps"] = norm.attrs["eps"]
    return len(lw.b.norms[norm.weights[0]]) == rope.attrs["head_dim"]


def lower_attention(lw: Lowering, op: Op, c, wt: np.ndarray) -> bool:
    a = op.attrs
    c["op"], c["layer"], c["head_dim"], c["kv_width"] = (
        ATTENTION,
        op.layer,
        a["head_dim"],
        a["n_kv_heads"] * a["head_dim"],
    )
    c["blocks"] = a.get("blocks", (0, 0, 0, 0))
    c["keys_in"], c["vals_in"] = lw.tensor(op.inputs[1]), lw.tensor(op.inputs[2])
    c["scale"], c["window"] = a["scale"], a.get("window", 0)
    host = prefetch_host(lw.records) if c["blocks"][0] == 0 else None  # dense attention: prefetched KV rows
    if host is not None:
        host["pf_layer"], host["pf_width"] = op.layer + 1, c["kv_width"]
    return True


def lower_rmsnorm(lw: Lowering, op: Op, c, wt: np.ndarray) -> bool:
    c["op"], c["norm"], c["eps"] = RMSNORM, lw.norm(op.weights[0]), op.attrs["eps"]
    c["group"] = op.attr("group") or lw.cols(op.inputs[0])
    return True


def lower_add(lw: Lowering, op: Op, c, wt: np.ndarray) -> bool:
    c["op"], c["other"] = ADD, lw.tensor(op.inputs[1])
    return True


def lower_sparse_ffn(lw: Lowering, op: Op, c, wt: np.ndarray) -> bool:
    c["op"], c["threads"] = SPARSE_FFN, lw.b.threads_used()
    lw.weights(wt, op.weights[:2])
    wt[2] = sp.down_row(lw.b, op)
    c["scratch"] = lw.tensor(op.name + ".gate", int(wt[0, mv.W_ROWS]))
    c["kept"], c["z"] = sp.kept_rule(op, int(wt[0, mv.W_ROWS]))
    return True


def lower_matmul_rmsnorm_add(lw: Lowering, op: Op, c, wt: np.ndarray) -> bool:
    mat, norm, addop = op.attrs["parts"]
    c["op"], c["n_w"], c["norm"], c["eps"] = MATMUL_NORM_ADD, 1, lw.norm(norm.weights[0]), norm.attrs["eps"]
    lw.weights(wt, mat.weights)
    c["outs"][0] = lw.tensor(mat.outputs[0])
    c["other"] = lw.tensor(next(t for t in addop.inputs if t != norm.outputs[0]))
    return True


def lower_rmsnorm_matmul(lw: Lowering, op: Op, c, wt: np.ndarray) -> bool:
    """rmsnorm_matmul and rmsnorm_matmul_gelu: the norm into ``scratch``, then up to MAX_W projections."""
    norm, *mats = op.attrs["parts"]
    if op.kind == "rmsnorm_matmul_gelu":
        mats = mats[:-1]
    if len(mats) > MAX_W or norm.attr("group") not in (None, lw.cols(norm.inputs[0])):
        return False
    c["op"] = NORM_MATMUL if op.kind == "rmsnorm_matmul" else NORM_MATMUL_GELU
    c["n_w"], c["norm"], c["eps"] = len(mats), lw.norm(norm.weights[0]), norm.attrs["eps"]
    c["scratch"] = lw.tensor(norm.outputs[0], lw.cols(norm.inputs[0]))
    lw.weights(wt, [m.weights[0] for m in mats])
    for j, m in enumerate(mats):
        c["outs"][j] = lw.tensor(m.outputs[0])
    return True


LOWER = {
    "embed": lower_embed,
    "rmsnorm_rope": lower_rmsnorm_rope,
    "attention": lower_attention,
    sa.KIND: lower_attention,
    "rmsnorm": lower_rmsnorm,
    "add": lower_add,
    "sparse_ffn": lower_sparse_ffn,
    "matmul_rmsnorm_add": lower_matmul_rmsnorm_add,
    "rmsnorm_matmul": lower_rmsnorm_matmul,
    "rmsnorm_matmul_gelu": lower_rmsnorm_matmul,
}
LOWERED = {*LOWER, "gather_rows"}  # gather_rows of a one-token step: its output is its input (an alias)


def prefetch_host(records: list) -> object | None:
    """The instruction that prefetches the KV rows of an attention about to be appended after ``records``:
    among those since the previous attention, the last gate/up (the previous layer's, dense), else the last
    QKV projection; None when neither is there or it already prefetches for another attention."""
    since = list(itertools.takewhile(lambda r: r["op"] != ATTENTION, reversed(records)))
    for kind in (NORM_MATMUL_GELU, NORM_MATMUL):
        host = next((r for r in since if r["op"] == kind), None)
        if host is not None:
            return host if host["pf_layer"] == 0 else None
    return None


def lower(b: CpuBackend, graph: Graph) -> Program | None:
    """The program of a one-token graph, or None when an op or weight has no lowering (runs op by op)."""
    if any(op.kind not in LOWERED for op in graph.ops):
        return None
    used = {n for op in graph.ops for n in op.weights if n in b.weights}
    if any(b.weights[n].fmt not in mv.QUANT_FMTS for n in used):
        return None
    lw = Lowering(b, graph)
    ops: list[Op] = []
    wts = []
    for op in graph.ops:
        if op.kind == "gather_rows":
            lw.alias[op.outputs[0]] = lw.src(op.inputs[0])
            continue
        c = np.zeros((), INSTRUCTION)
        wt = np.zeros((MAX_W, 5), np.int64)
        if not LOWER[op.kind](lw, op, c, wt):
            return None
        if op.kind != "embed":
            c["inp"], c["k"] = lw.tensor(op.inputs[0]), lw.cols(op.inputs[0])
        if op.kind == "rmsnorm_matmul":  # outputs are the projections'; ``out`` views the first
            c["out"], c["n"] = c["outs"][0], wt[0, mv.W_ROWS]
        else:
            c["out"], c["n"] = lw.tensor(op.outputs[0]), lw.cols(op.outputs[0])
        lw.records.append(c)
        wts.append(wt)
        ops.append(op)
    final = lw.src(graph.outputs[0])
    if final not in lw.offsets:
        return None
    norms = np.concatenate(lw.norm_parts).astype(np.float32) if lw.norm_parts else np.zeros(1, np.float32)
    return Program(
        ops, np.array(lw.records, INSTRUCTION), np.array(wts)[None], np.zeros((1, len(ops), MAX_W), np.int64),
        np.zeros((1, lw.size), np.float32), lw.offsets[final], lw.cols(final), lw.rope_keys, norms,
    )  # fmt: skip
