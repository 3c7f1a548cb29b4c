"""A step graph compiled for the device: a list of dispatches, recorded once into a command buffer and
replayed step after step with only the step's parameters (tokens, positions, logit rows) rewritten.

Building a program: each op becomes one or more dispatches (``emit``); fused ops whose structure a kernel
covers (RMSNorm + projections, RMSNorm + gate/up + GELU, QK-norm + RoPE, projection + post-norm + residual)
get fused kernels, any other fused op runs as its parts. Tensors live in one arena buffer, placed by liveness;
a barrier is recorded only before a dispatch that touches what an earlier one wrote (or reads what a later
one overwrites). With timestamps on, every dispatch is bracketed by a timestamp query (device time per op).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ...ops.graph import Graph, Op
from ..base import UnsupportedOpError
from . import gemma3n
from .kernels import KERNELS, KV_SEQS, Q8_FORMATS, batch_row_threads, coop_tile
from .memory import Buffer
from .tuned import gemm_key, matvec_key

if TYPE_CHECKING:
    from .backend import VulkanBackend
    from .kv_cache import DeviceKV

MAX_STEP_TOKENS = 8192  # = PARAM_STRIDE in shaders/common.glsl
MAX_GROUPS_X = 65535


@dataclass
class Ref:
    """A tensor's arena offset (in floats), resolved once the arena is laid out; ``+ extra`` floats."""

    tensor: str
    extra: int = 0


@dataclass
class Dispatch:
    op: str
    kernel: str
    defines: tuple[str, ...]
    spec: list[tuple[int, int]]
    push: dict[str, Any]
    groups: tuple[int, int, int]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    weight: Buffer | None = None
    weight2: Buffer | None = None
    kv: tuple[Buffer, ...] = ()  # the caches of binding 4 (the shader picks one per token row: p_seq)
    barrier: bool = False


def split_groups(n: int) -> tuple[int, int]:
    """A 2-D grid of at least ``n`` workgroups (x capped at 65535); shaders flatten it with flat_group()."""
    x = min(n, MAX_GROUPS_X)
    return x, -(-n // x)


@dataclass
class SeqGroup:
    """Consecutive sequences of a step whose caches have the same shape (at most KV_SEQS): one attention
    dispatch serves them all, token rows ``t0 .. t0 + rows``; ``seqs`` as in :class:`Builder`."""

    seqs: list[tuple[DeviceKV, int, int]]

    @property
    def t0(self) -> int:
        return self.seqs[0][1]

    @property
    def rows(self) -> int:
        return sum(n for _, _, n in self.seqs)


def group_sequences(seqs: list[tuple[DeviceKV, int, int]]) -> list[SeqGroup]:
    """Runs of consecutive sequences with equal cache shapes, at most KV_SEQS each."""
    groups: list[SeqGroup] = []
    for s in seqs:
        g = groups[-1] if groups else None
        if g is None or len(g.seqs) == KV_SEQS or g.seqs[0][0].key != s[0].key:
            groups.append(SeqGroup([s]))
        else:
            g.seqs.append(s)
    return groups


@dataclass
class Builder:
    """Turns a graph into dispatches for one step shape and one KV cache."""

    backend: VulkanBackend
    graph: Graph
    seqs: list[tuple[DeviceKV, int, int]]  # per sequence of the step: its cache, first token row, tokens
    greedy: bool
    dispatches: list[Dispatch] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)  # tensor -> floats
    widths: dict[str, int] = field(default_factory=dict)
    pinned: set[str] = field(default_factory=set)  # tensors kept for the whole program (atomic counters)
    groups: list[SeqGroup] = field(default_factory=list)
    # (input, norm weight) -> its int8 blocks (quant_act), and (input, ":f16") -> its fp16 copy (halves), reused
    # by the projections that read them; dropped when the input is written again (add)
    q8_inputs: dict[tuple[str, str | None], str] = field(default_factory=dict)
    # per-shape parameters that win over the tuning database (the autotuner's candidates)
    forced: dict[str, dict[str, int]] = field(default_factory=dict)
    # every projection built: (shape key, how it was called), for the autotuner
    shapes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    # Gemma 3n's sparse layers (ffn.sparse_skip): up projections left for the gelu_mul that reads them
    # (up output -> (input, norm weight, eps, up weight)), and the gelu_mul outputs that are mostly zero
    sparse_up: dict[str, tuple[str, str, float, str]] = field(default_factory=dict)
    sparse_acts: set[str] = field(default_factory=set)
    folded: set[str] = field(default_factory=set)  # ops another op's dispatch has done (gemma3n.fold)
    # Gemma 3n's V norms left to the RoPE dispatch that stores K and V (normed values -> their rmsnorm_plain op)
    v_norms: dict[str, Op] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.groups = group_sequences(self.seqs)
        for name, spec in self.graph.tensors.items():
            rows, cols = (1, spec.shape[0]) if len(spec.shape) == 1 else spec.shape
            self.sizes[name] = int(rows * cols)
            self.widths[name] = int(cols)

    # -- helpers ---------------------------------------------------------------------------------
    def ref(self, tensor: str, extra: int = 0) -> Ref:
        """The arena offset of ``tensor`` (+ ``extra`` floats), resolved when the arena is laid out."""
        return Ref(tensor, extra)

    def tmp(self, name: str, rows: int, cols: int) -> str:
        self.sizes[name] = rows * cols
        self.widths[name] = cols
        return name

    def rows(self, t: str) -> int:
        return self.sizes[t] // self.widths[t]

    def add(
        self, op: Op, kernel: str, push: dict, groups, reads, writes, defines=(), spec=None, **bufs
    ) -> None:
        tun = self.backend.tuning
        sp = sorted(dict(tun.spec(kernel) + list(spec or [])).items())  # later entries override
        for key in [k for k in self.q8_inputs if k[0] in writes]:  # its source changed: quantize again
            del self.q8_inputs[key]
        self.dispatches.append(
            Dispatch(
                op.name, kernel, tuple(defines), sp, push, tuple(groups), tuple(reads), tuple(writes), **bufs
            )
        )

    # -- kernels ---------------------------------------------------------------------------------
    def projection(self, op: Op, x: str, y: str, wname: str, norm: str | None = None, eps: float = 0.0,
                   up: str | None = None, post: tuple[str, float, str, str] | None = None, gate: str | None = None,
                   skip_zero: bool = False, ple: tuple[str, int] | None = None) -> None:  # fmt: skip
        """y = x @ W.T (matvec for few rows, GEMM otherwise); ``norm``: RMSNorm weight fused into the matvec;
        ``up``: second weight of a fused gelu(W x) * (U x); ``post`` = (norm weight, eps, residual, out):
        out = residual + rmsnorm(y), done by the matvec's last workgroup. ``gate``: y = gelu(gate) * (W x),
        computing only the rows where the (top-k) gate is non-zero (SPARSE_UP); ``skip_zero``: x is mostly
        zero, its all-zero chunks load no weights (SKIP_ZERO, float activations). ``ple`` = (tensor, column):
        y = gelu(W x) * tensor[:, column + row] (GATE_MUL: Gemma 3n's PLE gate)."""
        b, w = self.backend, self.backend.weight(wname)
        t = self.rows(x)
        k = self.widths[x]
        x0, norm0 = x, norm
        if w.cols != k:
            raise UnsupportedOpError(f"op {op.name}: weight {wname} has {w.cols} columns, input has {k}")
        w2 = b.weight(up) if up else None
        if self.integer_path(w, w2, k) and not skip_zero:
            x, norm = self.quantized(op, x, norm, eps), None
            stride = k // 4 + k // 8
        else:
            stride = k
        if norm and w.rows > b.tuning["matvec.norm_rows"]:
            # every workgroup of a fused kernel recomputes the norm: for very tall weights (the LM head) one
            # separate RMSNorm dispatch is cheaper
            normed = self.tmp(f"{op.name}:normed", t, k)
            self.rmsnorm(op, x, normed, norm, eps)
            x, norm = normed, None
        counter = self.tmp(f"{op.name}:counter", 1, 1) if post else None
        if counter:
            self.pinned.add(counter)
        pw, peps, res, out = post or (None, 0.0, None, None)
        # the post-norm tail writes the mean squares of its output's rows; a fused norm of an input that
        # has them reads them (MS_IN) instead of every workgroup summing the input's squares again
        ms_out = self.tmp(f"{out}:ms", 1, t) if post else None
        ms_in = f"{x}:ms" if norm and f"{x}:ms" in self.sizes and b.tuning["matvec.norm_ms"] else None
        # the post-norm tail also writes the next projection's int8 input (QUANT_OUT), where there is one
        fuse_q = post and stride != k and len(w.parts) == 1 and b.tuning["matvec.quant_out"]
        q_norm = self.next_norm(out, k=w.rows) if fuse_q else None
        q_out = self.tmp(f"{out}:q8:{q_norm[0]}", t, w.rows // 4 + w.rows // 8) if q_norm else None
        for i, part in enumerate(w.parts):
            push = dict(pl=part.planes, pl2=w2.parts[i].planes if w2 else (0, 0, 0, 0), K=k, N=part.rows, T=t,
                        row0=part.row0, x_off=Ref(x), x_stride=stride, y_off=Ref(y), y_stride=self.widths[y],
                        nw_off=b.small_offset(norm) if norm else 0, eps=eps, r_off=Ref(res) if res else 0,
                        r_stride=self.widths[res] if res else 0, o_off=Ref(out) if out else 0,
                        o_stride=self.widths[out] if out else 0, pw_off=b.small_offset(pw) if pw else 0,
                        peps=peps, cnt_off=Ref(counter) if counter else 0, ms_off=Ref(ms_in) if ms_in else 0,
                        ms_out_off=Ref(ms_out) if ms_out else 0, q_out_off=Ref(q_out) if q_out else 0,
                        qnw_off=b.small_offset(q_norm[0]) if q_out else 0, qeps=q_norm[1] if q_out else 0.0)  # fmt: skip
            if gate:  # the gate rides in the residual's fields (SPARSE_UP excludes POST_NORM_ADD)
                push.update(r_off=Ref(gate), r_stride=self.widths[gate])
            if ple:  # so does the multiplier of GATE_MUL
                push.update(r_off=Ref(ple[0], ple[1]), r_stride=self.widths[ple[0]])
            defines = [*w.defines] + (["NORM"] if norm else []) + (["GELU_PAIR"] if w2 else [])
            defines += ["MS_IN"] if ms_in else []
            defines += ["POST_NORM_ADD"] if post else []
            defines += ["QUANT_OUT"] if q_out else []
            defines += ["TAIL_REGS"] if post and t == 1 and b.tuning["matvec.tail_regs"] else []  # one token
            defines += (["SPARSE_UP"] if gate else []) + (["SKIP_ZERO"] if skip_zero else [])
            defines += ["GATE_MUL"] if ple else []
            q8 = stride != k
            defines += ["Q8_ACT"] if q8 else ["F16_MATH"] if b.tuning["matvec.fp16"] else []
            wide = b.tuning["matvec.q4k_wide"]
            if q8 and w.fmt == "Q4_K" and (wide == 2 or (wide == 1 and w2 is None)):
                defines.append("Q4K_WIDE")  # 64-column units (quant_q8.glsl)
            tall = w.rows > b.tuning["matvec.norm_rows"]  # the LM head: many rows, fewer threads per row
            if q8 and t == 1:
                rt, rb = b.tuning["matvec.q8_row_threads"], b.tuning["matvec.q8_rows"]
            else:
                if tall:
                    rt = b.tuning["matvec.row_threads_tall"]
                elif t > 1:
                    rt = batch_row_threads(b.tuning.values, k, w2 is not None)
                else:
                    rt = b.tuning["matvec.row_threads"]
                rb = b.tuning["matvec.row_block_tall" if tall else "matvec.row_block_batch"] if t > 1 else 1
            wg = b.tuning["matvec.wg_tall" if tall else "matvec.wg"]
            variant = "+".join(
                ["q8" if q8 else "f16" if "F16_MATH" in defines else "f32"]
                + [
                    v.lower()
                    for v in (
                        "NORM",
                        "GELU_PAIR",
                        "POST_NORM_ADD",
                        "SPARSE_UP",
                        "SKIP_ZERO",
                        "GATE_MUL",
                        "Q4K_WIDE",
                    )
                    if v in defines
                ]
            )
            key = matvec_key(w.fmt, variant, w.rows, k, t)
            if i == 0:
                self.shapes.append((key, dict(kind="matvec", x=x0, wname=wname, norm=norm0, eps=eps, up=up,
                                              post=post, tokens=t, cols=k)))  # fmt: skip
            tuned = self.forced.get(key) or b.tuned.get(key)
            if tuned:  # found on this device by `workbench tune`
                wg, rt, rb = tuned["wg"], tuned["row_threads"], tuned["rows"]
            gx, gy = split_groups(-(-part.rows // (wg // rt * rb)))
            # a one-token gate/up pair whose workgroups hold whole 32-row blocks writes the int8 input of the
            # projection that reads its output (QUANT_ROWS: no quant_act dispatch and barrier of its own)
            quant_rows = (
                q8
                and t == 1
                and w2 is not None
                and not (post or gate or ple)
                and len(w.parts) == 1
                and (wg // rt * rb) % 32 == 0
                and w.rows % 32 == 0
                and b.tuning["matvec.quant_out"]
                and self.plain_q8_reader(y)
            )
            if quant_rows:
                q_out = self.tmp(f"{y}:q8", t, w.rows // 4 + w.rows // 8)
                push["q_out_off"] = Ref(q_out)
                defines.append("QUANT_ROWS")
            reads, writes = ([x, res], [y, out, counter, ms_out]) if post else ([x], [y])
            reads += [ms_in] if ms_in else []
            reads += [gate] if gate else []
            reads += [ple[0]] if ple else []
            writes += [q_out] if q_out else []
            spec = [(0, wg), (1, rt), (2, t), (3, k), (4, rb)]
            spec += [(5, b.tuning["matvec.q8_ahead"])] if q8 else []
            self.add(op, "matvec", push, (gx, gy, 1), reads, writes, defines, spec,
                     weight=part.buffer, weight2=w2.parts[i].buffer if w2 else None)  # fmt: skip
        if q_out and post:
            self.q8_inputs[(out, q_norm[0])] = q_out
        elif q_out:
            self.q8_inputs[(y, None)] = q_out

    def integer_path(self, w, w2, k: int) -> bool:
        """Whether a decode projection runs on int8 activations (``matvec.q8``): its format has an integer
        decoder (shaders/quant_q8.glsl), and a fused pair shares it."""
        if not self.backend.tuning["matvec.q8"] or k % 32:
            return False
        fmts = [w.defines[0]] + ([w2.defines[0]] if w2 else [])
        return all(f.removeprefix("FMT_") in Q8_FORMATS for f in fmts) and (
            w2 is None or w.defines == w2.defines
        )

    def plain_q8_reader(self, x: str) -> bool:
        """Whether the projection that reads ``x`` takes it without a fused norm on the integer path, so that
        the op writing ``x`` may also write its int8 blocks (``Builder.quantized`` then finds them)."""
        projections = {"matmul": lambda op: op, "matmul_rmsnorm_add": lambda op: op.attrs["parts"][0]}
        for op in self.graph.ops:
            mm = projections[op.kind](op) if op.kind in projections else None
            if mm is not None and mm.inputs[0] == x and mm.weights:
                if x in self.sparse_acts or self.backend.small_matrix(mm.weights[0]):
                    return False
                return self.integer_path(self.backend.weight(mm.weights[0]), None, self.widths[x])
        return False

    def next_norm(self, x: str, k: int) -> tuple[str, float] | None:
        """(norm weight, eps) of the fused norm + decode projection that reads ``x`` next, if its weights take
        the integer path (so its int8 input can be written by the op that produces ``x``)."""
        for op in self.graph.ops:
            if op.kind in ("rmsnorm_matmul", "rmsnorm_matmul_gelu") and op.inputs[0] == x:
                norm, *mms = op.attrs["parts"]
                ws = [self.backend.weight(mm.weights[0]) for mm in mms if mm.weights]
                if (
                    ws
                    and all(w.rows <= self.backend.tuning["matvec.norm_rows"] for w in ws)
                    and all(self.integer_path(w, None, k) for w in ws)
                ):
                    return norm.weights[0], float(norm.attrs["eps"])
                return None
        return None

    def quantized(self, op: Op, x: str, norm: str | None, eps: float) -> str:
        """``x`` (RMS-normalized by ``norm`` if given) as int8 blocks for the integer matvec: one quant_act
        dispatch per input and norm, shared by the projections that read it (QKV, the LM head's parts)."""
        key = (x, norm)
        if key in self.q8_inputs:
            return self.q8_inputs[key]
        b, t, k = self.backend, self.rows(x), self.widths[x]
        name = self.tmp(f"{x}:q8" + (f":{norm}" if norm else ""), t, k // 4 + k // 8)
        ms_in = f"{x}:ms" if norm and f"{x}:ms" in self.sizes and b.tuning["matvec.norm_ms"] else None
        push = dict(x_off=Ref(x), x_stride=self.widths[x], q_off=Ref(name), q_stride=k // 4 + k // 8, K=k,
                    nw_off=b.small_offset(norm) if norm else 0, eps=eps, ms_off=Ref(ms_in) if ms_in else 0)  # fmt: skip
        defines = (["NORM"] if norm else []) + (["MS_IN"] if ms_in else [])
        groups = -(-(k // 32) // b.tuning["quant_act.wg"])
        self.add(op, "quant_act", push, (groups, t, 1), [x] + ([ms_in] if ms_in else []), [name], defines)
        self.q8_inputs[key] = name
        return name

    def halves(self, op: Op, x: str) -> str:
        """``x`` as fp16 (two values a word; eltwise.comp OP_TO_F16) for the cooperative-matrix GEMM: one
        dispatch per input, shared by the projections that read it (QKV, gate/up), like the int8 inputs."""
        key = (x, ":f16")
        if key in self.q8_inputs:
            return self.q8_inputs[key]
        rows, k = self.rows(x), self.widths[x]
        name = self.tmp(f"{x}:f16", rows, k // 2)
        push = dict(a_off=Ref(x), a_stride=k, b_off=0, b_stride=0, y_off=Ref(name), y_stride=k // 2, width=k // 2,
                    rows=rows, cap=0.0)  # fmt: skip
        wg = self.backend.tuning["eltwise.wg"]
        self.add(op, "eltwise", push, (-(-(k // 2) // wg), rows, 1), [x], [name], ["OP_TO_F16"])
        self.q8_inputs[key] = name
        return name

    def gemm(self, op: Op, x: str, y: str, wname: str) -> None:
        """Prefill projection: the cooperative-matrix kernel (fp16 in, fp32 accumulate) where the device has
        16x16x16 fp16 matrices, ``matmul.coop`` is on and K is at least ``matmul.coop_min_k``, else the fp32
        tiled kernel."""
        b, w = self.backend, self.backend.weight(wname)
        t, k = self.rows(x), self.widths[x]
        if k % 32:
            raise UnsupportedOpError(f"op {op.name}: the GEMM kernel needs K % 32 == 0 (K = {k})")
        tun = b.tuning
        kernel = b.gemm_kernel if k >= tun["matmul.coop_min_k"] else "matmul"
        if kernel == "matmul_coop":
            sg = b.dev.features.subgroup_size
            bm, bn = coop_tile(tun.values, sg)
            spec = [(4, sg)]
            key = gemm_key(w.fmt, w.rows, k)
            self.shapes.append((key, dict(kind="gemm", x=x, wname=wname, tokens=t, cols=k)))
            tuned = self.forced.get(key) or b.tuned.get(key)
            bk = tun["matmul_coop.bk"]
            if tuned:  # found on this device by `workbench tune` (entries older than `bk` staged 32)
                wg, wm, tm, tn = tuned["wg"], tuned["wm"], tuned["tm"], tuned["tn"]
                bm, bn, bk = wm * tm * 16, (wg // sg) // wm * tn * 16, tuned.get("bk", 32)
                spec += [(0, wg), (1, wm), (2, tm), (3, tn)]
                if "ahead" in tuned:  # entries older than matmul_coop.ahead take the tunable's value
                    spec.append((6, tuned["ahead"]))
            spec.append((5, bk if k % bk == 0 else 32))  # K a multiple of 32 but not of 64: stage 32
        else:
            bm = tun["matmul.wg_m"] * tun["matmul.tm"]
            bn = tun["matmul.wg"] // tun["matmul.wg_m"] * tun["matmul.tn"]
            spec = []
        defines, xin = list(w.defines), x
        if kernel == "matmul_coop" and tun["matmul_coop.x16"]:
            xin = self.halves(op, x)  # fp16 input; its row stride k then counts halves
            defines.append("X_F16")
        for part in w.parts:
            push = dict(pl=part.planes, K=k, N=part.rows, T=t, row0=part.row0, x_off=Ref(xin), x_stride=k,
                        y_off=Ref(y), y_stride=self.widths[y])  # fmt: skip
            groups = (-(-part.rows // bn), -(-t // bm), 1)
            self.add(op, kernel, push, groups, [xin], [y], defines, spec, weight=part.buffer)

    def matmul(self, op: Op, x: str, y: str, wname: str) -> None:
        if self.backend.small_matrix(wname):
            gemma3n.small_matmul(self, op, x, y, wname)
        elif self.rows(x) <= self.backend.tuning["matvec.max_tokens"]:
            self.projection(op, x, y, wname, skip_zero=x in self.sparse_acts)
        else:
            self.gemm(op, x, y, wname)

    def rmsnorm(self, op: Op, x: str, y: str, wname: str | None, eps: float, group: int | None = None,
                residual: str | None = None, rope: Op | None = None, weightless: bool = False) -> None:  # fmt: skip
        """RMSNorm of ``x`` into ``y`` (``weightless``: no weight, ``rmsnorm_plain``), optionally with a residual
        add or RoPE."""
        b = self.backend
        width = group or self.widths[x]
        per_row = self.widths[x] // width
        defines = []
        if residual:
            defines.append("ADD")
        if rope is not None:
            defines.append("ROPE")
            if wname is None:
                defines.append("NO_NORM")
        elif weightless:
            defines.append("NO_WEIGHT")
        push = dict(x_off=Ref(x), x_stride=self.widths[x], y_off=Ref(y), y_stride=self.widths[y],
                    r_off=Ref(residual) if residual else 0, r_stride=self.widths[x], width=width,
                    w_off=b.small_offset(wname) if wname else 0,
                    freq_off=b.rope_offset(rope) if rope is not None else 0, eps=eps, v_src=0, v_stride=0,
                    kv_dim=0, ring=0, window=0, v_off=0)  # fmt: skip
        reads = [x] + ([residual] if residual else [])
        self.add(op, "rmsnorm", push, (per_row, self.rows(x), 1), reads, [y], defines)

    def eltwise(self, op: Op, opname: str, a: str, y: str, b_: str | None = None, cap: float = 0.0) -> None:
        rows = self.rows(y)
        width = self.widths[y]
        push = dict(a_off=Ref(a), a_stride=self.widths[a], b_off=Ref(b_) if b_ else 0,
                    b_stride=self.widths[b_] if b_ else 0, y_off=Ref(y), y_stride=width, width=width, rows=rows,
                    cap=cap)  # fmt: skip
        wg = self.backend.tuning["eltwise.wg"]
        reads = [a] + ([b_] if b_ else []) + (["params"] if opname == "GATHER" else [])
        self.add(op, "eltwise", push, (-(-width // wg), rows, 1), reads, [y], [f"OP_{opname}"])

    def embed(self, op: Op) -> None:
        b, w = self.backend, self.backend.weight(op.weights[0])
        if w.cols % 8:  # embed.comp writes 8 values an invocation, rows addressed in vec4 units
            raise UnsupportedOpError(
                f"op {op.name}: the vulkan embedding kernel needs a table width that is a multiple of 8 "
                f"({op.weights[0]} is {w.cols} wide)"
            )
        y = op.outputs[0]
        t = self.rows(y)
        for part in w.parts:
            push = dict(pl=part.planes, K=w.cols, N=part.rows, row0=part.row0, y_off=Ref(y), y_stride=w.cols,
                        scale=op.attrs["scale"])  # fmt: skip
            wg = b.tuning["embed.wg"]
            self.add(op, "embed", push, (-(-(w.cols // 8) // wg), t, 1), ["params"], [y], list(w.defines),
                     weight=part.buffer)  # fmt: skip

    def attention(self, op: Op) -> None:
        """KV store + attention (+ split merge), one dispatch per stage for each group of sequences (see
        :func:`group_sequences`); each sequence has its own cache, picked per token row by the shaders
        (``p_seq``). ``#i`` marks group i's disjoint row range of a tensor, so groups need no barriers."""
        one = len(self.groups) == 1
        for stage in ("store", "attend", "merge"):  # stage by stage: one barrier per stage, not per group
            for i, grp in enumerate(self.groups):
                self.attention_group(op, grp, "" if one else f"#{i}", stage)

    def seq_index(self) -> np.ndarray:
        """Per token row of the step: the index of its sequence's cache in its dispatch (``p_seq``)."""
        return np.concatenate(
            [
                np.repeat(np.arange(len(g.seqs), dtype=np.uint32), [n for _, _, n in g.seqs])
                for g in self.groups
            ]
        )

    def attention_group(self, op: Op, grp: SeqGroup, tag: str, stage: str) -> None:
        b, a = self.backend, op.attrs
        q = op.inputs[0]
        out = op.outputs[0]
        # a shared_kv_attention op reads the cache of layer kv_layer (extended earlier in the step), writes none
        li = int(a.get("kv_layer", op.layer))
        if stage == "store" and op.kind == "shared_kv_attention":
            return
        layers = [kv.layers[li] for kv, _, _ in grp.seqs]
        layer = layers[0]  # every cache of a group has the same shape
        caches = tuple(la.buffer for la in layers)
        t0, t = grp.t0, grp.rows
        window = int(a.get("window", 0))
        longest = max(n for _, _, n in grp.seqs)
        if window and layer.wraps and longest > layer.slots - window + 1:
            raise UnsupportedOpError(
                f"op {op.name}: a step of {longest} tokens does not fit the sliding ring of {layer.slots} slots; "
                f"use steps of at most {layer.slots - window + 1} tokens"
            )
        kvres = tuple(f"kv:{li}:{kv.id}" for kv, _, _ in grp.seqs)
        kvd = layer.kv_dim
        multi = int(len(caches) > 1)  # MULTI_SEQ: with one cache the shaders skip the p_seq read
        if stage == "store":
            k, v = op.inputs[1:3]
            if tag or not self._store_in_rope(op, k, v, kvres, caches, layer, window):
                vnorm = self.v_norms.pop(v, None)
                if vnorm is not None:  # not taken by a RoPE dispatch: its own dispatch, before the store
                    self.rmsnorm(vnorm, vnorm.inputs[0], v, None, vnorm.attrs["eps"], vnorm.attr("group"),
                                 weightless=True)  # fmt: skip
                self.add(op, "kv_store", dict(k_off=Ref(k), k_stride=self.widths[k], v_off_act=Ref(v),
                     v_stride=self.widths[v], kv_dim=kvd, ring=layer.slots, window=window, v_off=layer.v_off,
                     t0=t0), (-(-kvd // b.tuning["kv_store.wg"]), t, 1), [k + tag, v + tag, "params"], kvres,
                     layer.defines, spec=[(1, multi)], kv=caches)  # fmt: skip
            return
        nh, nkv, hd = a["n_heads"], a["n_kv_heads"], a["head_dim"]
        sg = b.dev.features.subgroup_size
        # G <= 8 query heads a KV head; at most 8 vec4 columns of V a thread (CPT in attention.comp); a key row
        # of at most 16 vec4s a lane (QV)
        if nh % nkv or nh // nkv > 8 or hd % 4 or hd > 32 * b.tuning["attention.wg"] or hd > 64 * sg:
            raise UnsupportedOpError(f"op {op.name}: heads {nh}/{nkv} x {hd} not supported by attention.comp")
        max_keys = min(window or layer.slots, layer.slots)
        # flash decoding: at most attention.splits splits of at least attention.split_keys keys, their length
        # set in the shader from the query's position (split_len in attn_merge.glsl)
        sk = b.tuning["attention.split_keys"]
        n_split = (
            min(b.tuning["attention.splits"], -(-max_keys // sk))
            if longest <= b.tuning["matvec.max_tokens"]
            else 1
        )
        suffix = tag.replace("#", ".")  # tensor names of this group's scratch
        part = (
            self.tmp(f"{op.name}:partials{suffix}", 1, t * max(n_split, 1) * nh * (hd + 2))
            if n_split > 1
            else None
        )
        fused_combine = part is not None and b.tuning["attention.fused_combine"]
        counters = self.tmp(f"{op.name}:counters{suffix}", 1, t * nkv) if fused_combine else None
        if counters:
            self.pinned.add(counters)
        # the merge (either kind) also writes the int8 blocks of the attention output where the projection
        # reading it takes them (no quant_act dispatch and barrier of its own; blocks of 32 lie within a head)
        # (one group only: with several, a group that does not split would leave its rows unquantized)
        quant = (
            part is not None
            and not tag
            and hd % 32 == 0
            and self.rows(out) <= b.tuning["matvec.max_tokens"]
            and b.tuning["matvec.quant_out"]
            and self.plain_q8_reader(out)
        )
        q8_stride = nh * hd // 4 + nh * hd // 8
        merging = stage == ("attend" if fused_combine else "merge")  # the stage whose dispatch merges
        q8 = self.tmp(f"{out}:q8", self.rows(out), q8_stride) if quant and merging else None
        push = dict(q_off=Ref(q), q_stride=self.widths[q], o_off=Ref(out), o_stride=self.widths[out], n_heads=nh,
                    n_kv=nkv, hd=hd, kv_dim=kvd, ring=layer.slots, window=window, v_off=layer.v_off,
                    part_off=Ref(part) if part else 0, n_split=n_split, split_keys=sk if n_split > 1 else max_keys,
                    scale=a["scale"], cnt_off=Ref(counters) if counters else 0, t0=t0,
                    q8_off=Ref(q8) if q8 and fused_combine else 0, q8_stride=q8_stride)  # fmt: skip
        writes = [out + tag] if not part else ([part, out + tag, counters] if fused_combine else [part])
        if stage == "attend":
            fused_q8 = q8 is not None and fused_combine
            self.add(op, "attention", push, (n_split, nkv, t), [q + tag, *kvres, "params"],
                 writes + ([q8] if fused_q8 else []),
                 (["FUSED_COMBINE"] if fused_combine else []) + (["QUANT_OUT"] if fused_q8 else []) + list(layer.defines),
                 spec=[(1, nh // nkv), (2, hd), (3, b.dev.features.subgroup_size), (5, multi)], kv=caches)  # fmt: skip
            if fused_q8:
                self.q8_inputs[(out, None)] = q8
        elif stage == "merge" and part and not fused_combine:
            push = dict(o_off=Ref(out), o_stride=self.widths[out], part_off=Ref(part), n_heads=nh, hd=hd,
                        n_split=n_split, window=window, split_keys=sk, t0=t0, q_off=Ref(q8) if q8 else 0,
                        q_stride=q8_stride)  # fmt: skip
            self.add(op, "attn_combine", push, (nh, t, 1), [part, "params"], [out + tag] + ([q8] if q8 else []),
                     ["QUANT_OUT"] if q8 else [])  # fmt: skip
            if q8:
                self.q8_inputs[(out, None)] = q8

    def _store_in_rope(self, op: Op, k: str, v: str, kvres: tuple[str, ...], caches: tuple[Buffer, ...], layer,
                       window: int) -> bool:  # fmt: skip
        """Let the RoPE dispatch that produced the keys write them (and the values) into the cache, when the
        keys feed nothing but this attention op; False when a separate kv_store is needed."""
        if not self.backend.tuning["attention.kv_in_rope"]:
            return False
        readers = [o for o in self.graph.ops if k in o.inputs]
        if any(o is not op and op not in o.attrs.get("parts", ()) for o in readers):
            return False
        at = next((i for i in reversed(range(len(self.dispatches))) if k in self.dispatches[i].writes), None)
        rope = self.dispatches[at] if at is not None else None
        if rope is None or rope.kernel != "rmsnorm" or "ROPE" not in rope.defines or rope.kv:
            return False
        vnorm = self.v_norms.get(v)  # Gemma 3n: the values normalized (no weight) as they are stored
        if vnorm is not None and (
            "NO_NORM" in rope.defines
            or vnorm.attrs["eps"] != rope.push["eps"]
            or vnorm.attr("group") != rope.push["width"]
        ):
            return False
        src = vnorm.inputs[0] if vnorm is not None else v
        # values made after the keys (Gemma 3n's V norm, unless folded) are not there yet when the RoPE runs
        if any(src in d.writes for d in self.dispatches[at + 1 :]):
            return False
        if self.widths[src] != self.widths[k] or rope.push["width"] != op.attrs["head_dim"]:
            return False
        if vnorm is not None:
            del self.v_norms[v]
            v = src
            rope.defines = (*rope.defines, "V_NORM")
        rope.defines = (*rope.defines, "KV_OUT", *layer.defines)
        rope.spec = sorted([*rope.spec, (1, int(len(caches) > 1))])
        rope.push.update(y_off=0, v_src=Ref(v), v_stride=self.widths[v], kv_dim=layer.kv_dim, ring=layer.slots,
                         window=window, v_off=layer.v_off)  # fmt: skip
        rope.reads = (*rope.reads, v, "params")
        rope.writes = kvres
        rope.kv = caches
        return True

    def argmax(self, logits: str) -> None:
        """The argmax of every logits row into the params buffer (p_result in common.glsl)."""
        op = Op("argmax", "argmax", (logits,), ())
        n, rows = self.widths[logits], self.rows(logits)
        block = self.backend.tuning["argmax.block"]
        n_parts = -(-n // block)
        parts = self.tmp("argmax:partials", 1, 2 * n_parts * rows)
        push = dict(x_off=Ref(logits), n=n, block=block, part_off=Ref(parts), n_parts=n_parts)
        self.add(op, "argmax", push, (n_parts, rows, 1), [logits], [parts], ["PASS1"])
        self.add(op, "argmax", push, (1, rows, 1), [parts], ["params"])

    # -- ops -------------------------------------------------------------------------------------
    def emit(self, op: Op) -> None:
        k = op.kind
        small = lambda x: self.rows(x) <= self.backend.tuning["matvec.max_tokens"]  # noqa: E731
        if k == "embed":
            self.embed(op)
        elif k == "rmsnorm":
            self.rmsnorm(op, op.inputs[0], op.outputs[0], op.weights[0], op.attrs["eps"], op.attr("group"))
        elif k == "matmul":
            self.matmul(op, op.inputs[0], op.outputs[0], op.weights[0])
        elif k == "rope":
            self.rmsnorm(op, op.inputs[0], op.outputs[0], None, 0.0, op.attrs["head_dim"], rope=op)
        elif k == "attention":
            self.attention(op)
        elif k == "gelu_mul" and op.inputs[1] in self.sparse_up:
            x, norm, eps, upw = self.sparse_up.pop(op.inputs[1])
            self.projection(op, x, op.outputs[0], upw, norm, eps, gate=op.inputs[0])
            self.sparse_acts.add(op.outputs[0])
        elif k == "gelu_mul":
            self.eltwise(op, "GELU_MUL", op.inputs[0], op.outputs[0], op.inputs[1])
        elif k == "add":
            self.eltwise(op, "ADD", op.inputs[0], op.outputs[0], op.inputs[1])
        elif k == "softcap":
            self.eltwise(op, "SOFTCAP", op.inputs[0], op.outputs[0], cap=op.attrs["cap"])
        elif k == "gather_rows":
            self.eltwise(op, "GATHER", op.inputs[0], op.outputs[0])
        elif k == "rmsnorm_matmul" and small(op.inputs[0]):
            norm, *mms = op.attrs["parts"]
            for mm in mms:
                if self.sparse_up_of(
                    mm
                ):  # computed by the gelu_mul that reads it, only where the gate is kept
                    self.sparse_up[mm.outputs[0]] = (
                        norm.inputs[0],
                        norm.weights[0],
                        norm.attrs["eps"],
                        mm.weights[0],
                    )
                    continue
                self.projection(
                    op, norm.inputs[0], mm.outputs[0], mm.weights[0], norm.weights[0], norm.attrs["eps"]
                )
        elif k == "rmsnorm_matmul_gelu" and small(op.inputs[0]) and self._same_format(op):
            norm, gate, up, _ = op.attrs["parts"]
            self.projection(op, norm.inputs[0], op.outputs[0], gate.weights[0], norm.weights[0],
                            norm.attrs["eps"], up=up.weights[0])  # fmt: skip
        elif k == "rmsnorm_rope":
            norm, rope = op.attrs["parts"]
            self.rmsnorm(op, norm.inputs[0], op.outputs[0], norm.weights[0], norm.attrs["eps"], norm.attr("group"),
                         rope=rope)  # fmt: skip
        elif k == "matmul_rmsnorm_add":
            mm, norm, add = op.attrs["parts"]
            tmp = mm.outputs[0]
            residual = next(t for t in add.inputs if t != norm.outputs[0])
            w = self.backend.weight(mm.weights[0])
            sparse = mm.inputs[0] in self.sparse_acts
            if sparse and small(mm.inputs[0]) and self.backend.tuning["ffn.down_t"]:
                gemma3n.sparse_down(self, op, mm, norm, residual)
            elif small(mm.inputs[0]) and len(w.parts) == 1 and self.backend.tuning["matvec.post_norm"]:
                post = (norm.weights[0], norm.attrs["eps"], residual, op.outputs[0])
                self.projection(op, mm.inputs[0], tmp, mm.weights[0], post=post, skip_zero=sparse)
            else:
                self.matmul(op, mm.inputs[0], tmp, mm.weights[0])
                self.rmsnorm(op, tmp, op.outputs[0], norm.weights[0], norm.attrs["eps"], residual=residual)
        elif k == "rmsnorm_plain":  # Gemma 3n's kinds (gemma3n.py)
            gemma3n.rmsnorm_plain(self, op)
        elif k == "shared_kv_attention":
            gemma3n.shared_kv_attention(self, op)
        elif k == "altup_expand":
            gemma3n.altup_expand(self, op)
        elif k == "altup_unembed":
            gemma3n.altup_unembed(self, op)
        elif k in ("altup_predict", "altup_correct"):
            gemma3n.altup(self, op)
        elif k == "laurel_residual":
            gemma3n.laurel_residual(self, op)
        elif k == "gaussian_topk":
            gemma3n.gaussian_topk(self, op)
        elif k == "ple_project":
            gemma3n.ple_project(self, op)
        elif k == "ple_gate":
            gemma3n.ple_gate(self, op)
        elif k == "ple_inject":
            gemma3n.ple_inject(self, op)
        elif "parts" in op.attrs:
            first = len(self.dispatches)
            for part in op.attrs["parts"]:
                self.emit(part)
            for d in self.dispatches[first:]:  # device time belongs to the graph's (fused) op
                d.op = op.name
        else:
            raise UnsupportedOpError(f"vulkan backend: op {op.name!r} has unsupported kind {op.kind!r}")

    def sparse_up_of(self, mm: Op) -> bool:
        """Whether projection ``mm`` is a sparse layer's up projection whose rows can be skipped: its output
        feeds only a gelu_mul whose gate comes from a Gaussian top-k (``ffn.sparse_skip``, decode steps)."""
        if (
            not self.backend.tuning["ffn.sparse_skip"]
            or self.rows(mm.inputs[0]) > self.backend.tuning["matvec.max_tokens"]
        ):
            return False
        u = mm.outputs[0]
        users = [o for o in self.graph.ops if u in o.inputs]
        if len(users) != 1 or users[0].kind != "gelu_mul" or users[0].inputs[1] != u:
            return False
        g = users[0].inputs[0]
        w = self.backend.weight(mm.weights[0])
        return len(w.parts) == 1 and any(o.kind == "gaussian_topk" and g in o.outputs for o in self.graph.ops)

    def _same_format(self, op: Op) -> bool:
        _, gate, up, _ = op.attrs["parts"]
        a, b = self.backend.weight(gate.weights[0]), self.backend.weight(up.weights[0])
        return a.fmt == b.fmt and len(a.parts) == len(b.parts) == 1

    def build(self) -> tuple[list[Dispatch], dict[str, int], int]:
        """(dispatches, arena offsets, arena floats); pinned tensors must be zeroed once before the first run."""
        for op in self.graph.ops:
            if not gemma3n.fold(self, op):  # folded: done by another op's dispatch
                self.emit(op)
        logits = self.graph.outputs[0]
        if self.greedy:
            self.argmax(logits)
        return self.finish({logits})

    def finish(self, keep: set[str]) -> tuple[list[Dispatch], dict[str, int], int]:
        """Lay the arena out (``keep`` live to the end), place barriers and resolve tensor offsets."""
        offsets, total = self.layout(keep=keep | self.pinned)
        self.place_barriers(offsets)
        for d in self.dispatches:
            for key, val in d.push.items():
                if isinstance(val, Ref):
                    d.push[key] = offsets[val.tensor] + val.extra
        return self.dispatches, offsets, total

    def layout(self, keep: set[str]) -> tuple[dict[str, int], int]:
        """Arena offsets (floats, 16-byte aligned) by liveness: a tensor's space is reused after its last read."""
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        for i, d in enumerate(self.dispatches):
            for t in (*d.reads, *d.writes):
                t = _base(t)
                if t in self.sizes:
                    first.setdefault(t, i)
                    last[t] = i
        for t in keep:
            last[t] = len(self.dispatches)
        for t in self.pinned:
            first[t] = -1
        free: list[tuple[int, int]] = []  # (offset, size)
        live: list[tuple[int, str]] = []
        offsets: dict[str, int] = {}
        top = 0
        order = sorted(first, key=lambda t: first[t])
        for t in order:
            start = first[t]
            for end, name in [x for x in live if x[0] < start]:
                free.append((offsets[name], _aligned(self.sizes[name])))
                live.remove((end, name))
            need = _aligned(self.sizes[t])
            fit = [f for f in free if f[1] >= need]
            if fit:
                off, size = min(fit, key=lambda f: f[1])
                free.remove((off, size))
                if size > need:
                    free.append((off + need, size - need))
            else:
                off, top = top, top + need
            offsets[t] = off
            live.append((last[t], t))
        return offsets, top

    def place_barriers(self, offsets: dict[str, int]) -> None:
        """A barrier before each dispatch that touches memory an earlier one (since the last barrier) wrote,
        or writes memory an earlier one read. Memory, not names: the arena gives a tensor's space to a later
        one after its last read (:meth:`layout`), so two names can share bytes, and a dispatch writing the
        new tensor must wait for the one still reading the old."""
        spans = {t: (off, off + _aligned(self.sizes[t])) for t, off in offsets.items() if t in self.sizes}
        written: set[str] = set()
        read: set[str] = set()
        for d in self.dispatches:
            touch = set(d.reads) | set(d.writes)
            if memory_clash(touch, written, spans) or memory_clash(set(d.writes), read, spans):
                d.barrier = True
                written, read = set(), set()
            written |= set(d.writes)
            read |= set(d.reads)


def memory_clash(a: set[str], b: set[str], spans: dict[str, tuple[int, int]]) -> bool:
    """Whether tensors ``a`` and ``b`` share memory: by name (:func:`_overlap`), or as different tensors whose
    arena ranges overlap."""
    if _overlap(a, b):
        return True
    for x in a:
        sx = spans.get(_base(x))
        if sx is None:
            continue
        for y in b:
            sy = spans.get(_base(y))
            if sy is not None and _base(y) != _base(x) and sx[0] < sy[1] and sy[0] < sx[1]:
                return True
    return False


def _base(name: str) -> str:
    """``x#2`` (rows of sequence 2 of tensor x) -> ``x``."""
    return name.split("#", 1)[0]


def _overlap(a: set[str], b: set[str]) -> bool:
    """Whether two sets of tensor names touch common memory: ``x#i`` and ``x#j`` (i != j) are disjoint row
    ranges of ``x``; ``x`` overlaps all of them."""
    if a & b:
        return True
    whole_a = {n for n in a if "#" not in n}
    whole_b = {n for n in b if "#" not in n}
    return any(_base(n) in whole_b for n in a) or any(_base(n) in whole_a for n in b)


def _aligned(n: int) -> int:
    return (n + 3) // 4 * 4


def pack_push(d: Dispatch) -> bytes:
    return KERNELS[d.kernel].pack(d.push)
