"""Op conformance, in the manner of llama.cpp's ``test-backend-ops``: every op kind, alone in a graph, on every
backend (cpu, vulkan, npu) against the numpy reference backend, for a few shapes and each weight format the
op takes.

A case is one op (or one fused op, made by :func:`workbench.ops.fusion.fuse` from its parts) in a model of its
own (:class:`OpModel`): its float inputs are rows of float32 tables gathered by ``embed`` ops (the only way
activations enter a step: the step carries token ids), its weights are random in the case's format. Each
case runs the steps ``STEPS`` (one token, a few, a batch, a prefill: both sides of every backend's
matvec/GEMM and decode/prefill switches) on one sequence, so attention steps extend a KV cache across the
sliding window; every step's output must be within the backend's tolerance (``TOLERANCE``) of numpy's. Where
a backend has no kernel for a kind or a format (``REFUSED_*``), the case checks that it refuses with
:class:`~workbench.backends.base.UnsupportedOpError` naming the op, the kind, the format or the tensor; a
backend bug found here is a strict xfail of its one case (``BUGS``). Vulkan cases are skipped only where no
Vulkan device exists (tests/test_vulkan.py's check). :func:`test_every_kind_is_covered` fails when an op
kind has no case.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache

import numpy as np
import pytest
from test_vulkan import REASON as VULKAN_REASON
from tiny import TINY

from workbench.backends import backend_class
from workbench.backends.base import Step, UnsupportedOpError
from workbench.models.config import ModelConfig
from workbench.models.gemma3n import gaussian_std_multiplier
from workbench.models.model import Model, TokenizerLoader
from workbench.models.synth import random_blocks
from workbench.models.weights import QTensor, Weights
from workbench.ops.fusion import fuse
from workbench.ops.graph import Graph, Op, TensorSpec, WeightSpec
from workbench.ops.kinds import KINDS
from workbench.quant.formats import FORMATS, GGMLType
from workbench.quant.planar import PlanarTensor, make_planar, parse_format
from workbench.sparsity import attention as sparse_attention
from workbench.sparsity import ffn as sparse_ffn

BACKENDS = ("cpu", "vulkan", "npu")
# max |backend - numpy| <= TOLERANCE * max |numpy| + ATOL, per backend:
# cpu: docs/backend-cpu.md, act_quant int16 (the default): "within 0.005 of the reference";
# vulkan: tests/test_vulkan.py's assert_close (rel 2e-4; fp32 arithmetic, lavapipe has no fp16 GEMM);
# npu: bf16 inputs and weights with fp32 accumulation (docs/backend-npu.md): bf16's 8-bit significand rounds
# each input by up to 2^-9, two inputs per product; the ops it runs on the host are numpy's own (exact).
TOLERANCE = {"cpu": 5e-3, "vulkan": 2e-4, "npu": 2e-2}
ATOL = 1e-5
STEPS = (1, 5, 12, 1, 20)  # token counts of the steps a case runs, in order, on one sequence
VOCAB = 64  # rows of every input table; tokens of the step at position p: p (positions stay below it)
CONTEXT = 64
EPS = 1e-6

GGUF_FORMATS = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
PLANAR_FORMATS = ("int8", "int4-g32", "int4-g128-asym", "int8+a8", "fp16-nm2:4")
FUSED_FORMATS = ("F32", "F16", "Q8_0", "Q5_0", "Q4_K", "Q6_K", "int4-g32")
VECTOR_FORMATS = ("F32", "BF16")  # norm weights: F32 in GGUF files, BF16 in bf16 HF checkpoints

# Gemma 3 and Gemma 3n models of one layer whose sizes the cases change
G3 = TINY.with_(name="conformance", n_layers=1, vocab_size=VOCAB, context_length=CONTEXT, sliding_window=8,
                layer_types=("global",), query_pre_attn_scalar=16)  # fmt: skip
G3N = G3.with_(arch="gemma3n", hidden=64, altup_inputs=4, laurel_rank=4, ple_dim=32, ple_vocab_size=VOCAB,
               query_pre_attn_scalar=1.0)  # fmt: skip


# -- weights in a format ---------------------------------------------------------------------------------------
def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def weight(name: str, shape: tuple[int, ...], fmt: str, rng: np.random.Generator, vector: bool = False):
    """A random weight ``name`` of ``shape`` stored as ``fmt`` (a GGUF type or a planar format); ``vector``:
    a norm weight (values near 1)."""
    if vector:
        w = (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
    else:
        w = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    if fmt in GGMLType.__members__:
        t = GGMLType[fmt]
        rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
        if t == GGMLType.F32:
            raw = w
        elif t == GGMLType.F16:
            raw = w.astype(np.float16)
        elif t == GGMLType.BF16:
            raw = (w.view(np.uint32) >> 16).astype(np.uint16)
        else:
            raw = random_blocks(t, rows, shape[-1], rng)
        return QTensor(name, t, tuple(shape), loader=lambda raw=raw: raw)
    f = parse_format(fmt.split("-nm")[0])
    if "-nm" in fmt:  # N:M sparse: the smallest M - N of every M values pruned
        n, m = (int(v) for v in fmt.split("-nm")[1].split(":"))
        groups = w.reshape(-1, m)
        drop = np.argsort(np.abs(groups), axis=1)[:, : m - n]
        np.put_along_axis(groups, drop, 0.0, axis=1)
        f = replace(f, nm=(n, m))
    return make_planar(name, w, f, "F32")


def fits(fmt: str, cols: int) -> bool:
    """Whether rows of ``cols`` values can be stored as ``fmt``."""
    if fmt in GGMLType.__members__:
        return cols % FORMATS[GGMLType[fmt]].block_elems == 0
    f = parse_format(fmt.split("-nm")[0])
    return f.kind != "int4" or cols % f.group == 0


# -- a model of one op ---------------------------------------------------------------------------------------
@dataclass
class OpCase:
    """What a case builds: the config, the op's weights, its float inputs (fed by embed ops) and other
    activations (name -> columns), its ops, the tensor compared, and for gather_rows the rows kept."""

    config: ModelConfig
    weights: dict[str, QTensor | PlanarTensor]
    inputs: dict[str, int]
    acts: dict[str, int]
    ops: list[Op]
    out: str
    rows: Callable[[int], np.ndarray] | None = None
    fusion: tuple[str, ...] = ()  # fusion rules that turn the ops into the kind under test
    input_scale: float = 1.0


class OpModel(Model):
    """A model whose step graph for any number of tokens is the case's op(s), fed by embeds of its inputs.
    Its graphs are unfused, as every model's; :meth:`step_graph` is the graph with the case's fusion applied."""

    case: OpCase

    def graph(self, n_tokens: int, n_logits: int = 1) -> Graph:
        g = self._graphs.get((n_tokens, 0))
        if g is None:
            g = self._graphs[(n_tokens, 0)] = op_graph(self.case, self.weight_specs(), n_tokens)
        return g

    def step_graph(self, n_tokens: int) -> Graph:
        """The graph a case runs: the kind under test, a fused kind fused already (as by a rewrite)."""
        g = self._graphs.get((n_tokens, -1))
        if g is None:
            g = self.graph(n_tokens)
            g = self._graphs[(n_tokens, -1)] = fuse(g, self.case.fusion) if self.case.fusion else g
        return g


FEED_COLS = 32  # an input whose width is no multiple of 8 is a matmul of a 32-wide embedding (see op_graph)


def op_graph(case: OpCase, specs: dict[str, WeightSpec], n: int) -> Graph:
    """The case's ops after one ``embed`` per input (scale 1, an F32 table). An input of a width that is no
    multiple of 8 (odd sizes) is ``embed`` of a 32-wide table then ``matmul`` by an F32 (width, 32) matrix:
    the vulkan embed writes 8 values per invocation (it refuses other widths: REFUSED_SHAPES)."""
    tensors = {t: TensorSpec((n, w)) for t, w in {**case.inputs, **case.acts}.items()}
    n_out = n
    if case.rows is not None:
        n_out = len(case.rows(n))
        tensors[case.out] = TensorSpec((n_out, case.acts[case.out]))
    feeds = []
    for t, w in case.inputs.items():
        if w % 8:
            tensors[f"{t}.e"] = TensorSpec((n, FEED_COLS))
            feeds += [Op(f"feed.{t}", "embed", ("tokens",), (f"{t}.e",), (f"{t}.table",), {"scale": 1.0}),
                      Op(f"feed.{t}.proj", "matmul", (f"{t}.e",), (t,), (f"{t}.proj",))]  # fmt: skip
        else:
            feeds.append(Op(f"feed.{t}", "embed", ("tokens",), (t,), (f"{t}.table",), {"scale": 1.0}))
    return Graph(case.config, n, n_out, feeds + case.ops, tensors, specs, (case.out,))


def op_model(case: OpCase, label: str) -> OpModel:
    tensors = dict(case.weights)
    rng = _rng("inputs", label)

    def f32(name: str, a: np.ndarray) -> QTensor:
        return QTensor(name, GGMLType.F32, a.shape, loader=lambda: a)

    for t, w in case.inputs.items():
        cols = FEED_COLS if w % 8 else w
        tensors[f"{t}.table"] = f32(
            f"{t}.table", (case.input_scale * rng.standard_normal((VOCAB, cols))).astype(np.float32)
        )
        if w % 8:
            tensors[f"{t}.proj"] = f32(
                f"{t}.proj", (rng.standard_normal((w, cols)) / np.sqrt(cols)).astype(np.float32)
            )
    m = OpModel(case.config, Weights(tensors, f"conformance:{label}"), TokenizerLoader(lambda: None),
                f"conformance:{label}", "synthetic")  # fmt: skip
    m.case = case
    return m


# -- the cases of each kind ----------------------------------------------------------------------------------
def _op(name, kind, inputs, outputs, weights=(), layer=0, **attrs) -> Op:
    return Op(name, kind, tuple(inputs), tuple(outputs), tuple(weights), attrs, layer)


def _attn_config(base: ModelConfig, nh: int, nkv: int, hd: int, window: int, layers: int = 1, **kw):
    kind = "sliding" if window else "global"
    if base.arch == "gemma3n":
        kw.setdefault("activation_sparsity", (0.0,) * layers)
    return base.with_(n_heads=nh, n_kv_heads=nkv, head_dim=hd, n_layers=layers, layer_types=(kind,) * layers,
                      sliding_window=window or 8, query_pre_attn_scalar=hd if base.arch == "gemma3" else 1.0, **kw)  # fmt: skip


def _heads(shape: str) -> tuple[int, int, int, int]:
    """ "h4-kv2-d128-w8" -> (4, 2, 128, 8)."""
    parts = dict((p[0], int(p[1:].lstrip("vd"))) for p in shape.split("-"))
    return parts["h"], parts["k"], parts["d"], parts.get("w", 0)


def case_embed(shape: str, fmt: str) -> OpCase:
    cols = int(shape)
    w = {"token_embd.weight": weight("token_embd.weight", (VOCAB, cols), fmt, _rng("embed", shape, fmt))}
    ops = [_op("embed", "embed", ["tokens"], ["y"], ["token_embd.weight"], None, scale=math.sqrt(cols))]
    return OpCase(G3.with_(hidden=cols), w, {}, {"y": cols}, ops, "y")


def case_rmsnorm(shape: str, fmt: str) -> OpCase:
    group, cols = (int(v) for v in shape.split("x")) if "x" in shape else (0, int(shape))
    width = group or cols
    w = {"blk.0.attn_norm.weight": weight("blk.0.attn_norm.weight", (width,), fmt, _rng("norm", shape), True)}
    attrs = {"eps": EPS, **({"group": group} if group else {})}
    ops = [_op("norm", "rmsnorm", ["x"], ["y"], ["blk.0.attn_norm.weight"], **attrs)]
    return OpCase(G3, w, {"x": cols}, {"y": cols}, ops, "y")


def case_matmul(shape: str, fmt: str) -> OpCase:
    k, n = (int(v) for v in shape.split("x"))
    w = {"blk.0.attn_q.weight": weight("blk.0.attn_q.weight", (n, k), fmt, _rng("matmul", shape, fmt))}
    ops = [_op("proj", "matmul", ["x"], ["y"], ["blk.0.attn_q.weight"])]
    return OpCase(G3.with_(hidden=k), w, {"x": k}, {"y": n}, ops, "y")


def case_rope(shape: str, fmt: str) -> OpCase:
    nh, hd, local = int(shape.split("x")[0]), int(shape.split("x")[1].split("-")[0]), shape.endswith("local")
    c = _attn_config(G3, nh, 1, hd, 8 if local else 0)
    ops = [_op("rope", "rope", ["x", "positions"], ["y"], (), n_heads=nh, head_dim=hd, base=c.rope_base(0),
               scale=c.rope_scale(0))]  # fmt: skip
    return OpCase(c, {}, {"x": nh * hd}, {"y": nh * hd}, ops, "y")


def _attention_case(shape: str, kind: str, **extra) -> OpCase:
    nh, nkv, hd, window = _heads(shape)
    c = _attn_config(G3, nh, nkv, hd, window)
    attrs = dict(n_heads=nh, n_kv_heads=nkv, head_dim=hd, scale=c.attn_scale, window=window, **extra)
    ops = [_op("attn", kind, ["q", "k", "v", "positions"], ["y"], (), **attrs)]
    return OpCase(c, {}, {"q": nh * hd, "k": nkv * hd, "v": nkv * hd}, {"y": nh * hd}, ops, "y")


def case_attention(shape: str, fmt: str) -> OpCase:
    return _attention_case(shape, "attention")


def case_block_sparse_attention(shape: str, fmt: str) -> OpCase:
    return _attention_case(shape, sparse_attention.KIND, blocks=(4, 1, 2, 3))


def _binary(kind: str) -> Callable[[str, str], OpCase]:
    def build(shape: str, fmt: str) -> OpCase:
        cols = int(shape)
        return OpCase(G3, {}, {"a": cols, "b": cols}, {"y": cols}, [_op(kind, kind, ["a", "b"], ["y"])], "y")

    return build


def case_gather_rows(shape: str, fmt: str) -> OpCase:
    cols = int(shape)
    ops = [_op("gather", "gather_rows", ["x", "logit_rows"], ["y"], (), None)]
    return OpCase(G3, {}, {"x": cols}, {"y": cols}, ops, "y", rows=lambda n: np.arange(n - 1, -1, -2)[::-1])


def case_softcap(shape: str, fmt: str) -> OpCase:
    cols = int(shape)
    ops = [_op("softcap", "softcap", ["x"], ["y"], (), None, cap=30.0)]
    return OpCase(G3, {}, {"x": cols}, {"y": cols}, ops, "y", input_scale=40.0)


def case_rmsnorm_plain(shape: str, fmt: str) -> OpCase:
    group, cols = (int(v) for v in shape.split("x")) if "x" in shape else (0, int(shape))
    attrs = {"eps": EPS, **({"group": group} if group else {})}
    return OpCase(
        G3N, {}, {"x": cols}, {"y": cols}, [_op("vnorm", "rmsnorm_plain", ["x"], ["y"], **attrs)], "y"
    )


def case_shared_kv_attention(shape: str, fmt: str) -> OpCase:
    """Layer 1 attends over layer 0's cache, which layer 0's attention extended earlier in the step."""
    nh, nkv, hd, window = _heads(shape)
    c = _attn_config(G3N, nh, nkv, hd, window, layers=2, kv_shared_layers=1)
    attrs = dict(n_heads=nh, n_kv_heads=nkv, head_dim=hd, scale=c.attn_scale, window=window)
    ops = [_op("attn0", "attention", ["q0", "k", "v", "positions"], ["y0"], (), 0, **attrs),
           _op("attn1", "shared_kv_attention", ["q", "positions"], ["y"], (), 1, kv_layer=0, **attrs)]  # fmt: skip
    inputs = {"q0": nh * hd, "k": nkv * hd, "v": nkv * hd, "q": nh * hd}
    return OpCase(c, {}, inputs, {"y0": nh * hd, "y": nh * hd}, ops, "y")


def _altup_projection(kind: str, wname: str) -> Callable[[str, str], OpCase]:
    def build(shape: str, fmt: str) -> OpCase:
        h = int(shape)
        w = {wname: weight(wname, (3, h, h), fmt, _rng(kind, shape, fmt))}
        x, y = (h, 4 * h) if kind == "altup_expand" else (4 * h, h)
        ops = [_op(kind, kind, ["x"], ["y"], [wname], None)]
        return OpCase(G3N.with_(hidden=h), w, {"x": x}, {"y": y}, ops, "y")

    return build


def _router_weights(h: int, kind: str, fmt: str) -> dict[str, QTensor | PlanarTensor]:
    rng = _rng(kind, h)
    coef = "altup_predict_coef" if kind == "altup_predict" else "altup_correct_coef"
    shapes = {"altup_router_norm": ((h,), True), "altup_router": ((4, h), False),
              coef: ((16, 4) if kind == "altup_predict" else (4, 4), False)}  # fmt: skip
    if kind == "altup_correct":
        shapes["altup_correct_scale"] = ((h,), True)
    return {f"blk.0.{n}.weight": weight(f"blk.0.{n}.weight", s, fmt, rng, v) for n, (s, v) in shapes.items()}


def case_altup_router(kind: str) -> Callable[[str, str], OpCase]:
    def build(shape: str, fmt: str) -> OpCase:
        h, out = int(shape.split("/")[0]), int(shape.split("/out")[1])
        w = _router_weights(h, kind, fmt)
        inputs = {"x": 4 * h} if kind == "altup_predict" else {"p": 4 * h, "z": h}
        ops = [_op(kind, kind, list(inputs), ["s", "a"], list(w), eps=EPS)]
        return OpCase(G3N.with_(hidden=h), w, inputs, {"s": 4 * h, "a": h}, ops, "sa"[out])

    return build


def case_laurel_residual(shape: str, fmt: str) -> OpCase:
    h = int(shape)
    inputs = {"x": h, "attn": h, "h": h, "laurel": h}
    return OpCase(G3N.with_(hidden=h), {}, inputs, {"y": h}, [_op("laurel", "laurel_residual", list(inputs), ["y"])], "y")  # fmt: skip


def case_gaussian_topk(shape: str, fmt: str) -> OpCase:
    f = int(shape)
    ops = [
        _op(
            "topk", "gaussian_topk", ["g"], ["y"], sparsity=0.95, std_multiplier=gaussian_std_multiplier(0.95)
        )
    ]
    return OpCase(G3N.with_(ffn=f), {}, {"g": f}, {"y": f}, ops, "y")


def _ple_shape(shape: str) -> tuple[int, int]:
    layers, p = shape.split("x")
    return int(layers[1:]), int(p[1:])


def case_ple_project(shape: str, fmt: str) -> OpCase:
    layers, p = _ple_shape(shape)
    c = G3N.with_(
        n_layers=layers, layer_types=("global",) * layers, ple_dim=p, activation_sparsity=(0.0,) * layers
    )
    w = {
        "per_layer_proj_norm.weight": weight(
            "per_layer_proj_norm.weight", (p,), fmt, _rng("ple", shape), True
        )
    }
    ops = [_op("ple_project", "ple_project", ["proj", "rows"], ["y"], list(w), None, scale=c.hidden**-0.5,
               group=p, eps=EPS)]  # fmt: skip
    return OpCase(c, w, {"proj": layers * p, "rows": layers * p}, {"y": layers * p}, ops, "y")


def case_ple_gate(shape: str, fmt: str) -> OpCase:
    layers, p = _ple_shape(shape)
    c = G3N.with_(
        n_layers=layers, layer_types=("global",) * layers, ple_dim=p, activation_sparsity=(0.0,) * layers
    )
    ops = [_op("ple_gate", "ple_gate", ["g", "pli"], ["y"], (), layers - 1)]
    return OpCase(c, {}, {"g": p, "pli": layers * p}, {"y": p}, ops, "y")


def case_ple_inject(shape: str, fmt: str) -> OpCase:
    h = int(shape)
    ops = [_op("ple_inject", "ple_inject", ["x", "r"], ["y"])]
    return OpCase(G3N.with_(hidden=h), {}, {"x": 4 * h, "r": h}, {"y": 4 * h}, ops, "y")


# fused kinds: their parts, fused by the rule of that name
def case_rmsnorm_matmul(shape: str, fmt: str) -> OpCase:
    k, ns = int(shape.split("x")[0]), [int(v) for v in shape.split("x")[1].split(",")]
    rng = _rng("rmsnorm_matmul", shape, fmt)
    names = ["attn_q", "attn_k", "attn_v"][: len(ns)]
    w = {
        f"blk.0.{m}.weight": weight(f"blk.0.{m}.weight", (n, k), fmt, rng)
        for m, n in zip(names, ns, strict=True)
    }
    w["blk.0.attn_norm.weight"] = weight("blk.0.attn_norm.weight", (k,), "F32", rng, True)
    ops = [_op("norm", "rmsnorm", ["x"], ["h"], ["blk.0.attn_norm.weight"], eps=EPS)]
    ops += [_op(m, "matmul", ["h"], [f"y{i}"], [f"blk.0.{m}.weight"]) for i, m in enumerate(names)]
    acts = {"h": k, **{f"y{i}": n for i, n in enumerate(ns)}}
    return OpCase(G3.with_(hidden=k), w, {"x": k}, acts, ops, f"y{len(ns) - 1}", fusion=("rmsnorm_matmul",))


def case_rmsnorm_matmul_gelu(shape: str, fmt: str) -> OpCase:
    k, f = (int(v) for v in shape.split("x"))
    rng = _rng("rmsnorm_matmul_gelu", shape, fmt)
    w = {f"blk.0.{m}.weight": weight(f"blk.0.{m}.weight", (f, k), fmt, rng) for m in ("ffn_gate", "ffn_up")}
    w["blk.0.ffn_norm.weight"] = weight("blk.0.ffn_norm.weight", (k,), "F32", rng, True)
    ops = [_op("norm", "rmsnorm", ["x"], ["h"], ["blk.0.ffn_norm.weight"], eps=EPS),
           _op("gate", "matmul", ["h"], ["g"], ["blk.0.ffn_gate.weight"]),
           _op("up", "matmul", ["h"], ["u"], ["blk.0.ffn_up.weight"]),
           _op("act", "gelu_mul", ["g", "u"], ["y"])]  # fmt: skip
    return OpCase(G3.with_(hidden=k, ffn=f), w, {"x": k}, {"h": k, "g": f, "u": f, "y": f}, ops, "y",
                  fusion=("rmsnorm_matmul", "rmsnorm_matmul_gelu"))  # fmt: skip


def case_rmsnorm_rope(shape: str, fmt: str) -> OpCase:
    nh, hd = (int(v) for v in shape.split("x"))
    c = _attn_config(G3, nh, 1, hd, 0)
    w = {
        "blk.0.attn_q_norm.weight": weight(
            "blk.0.attn_q_norm.weight", (hd,), "F32", _rng("qnorm", shape), True
        )
    }
    ops = [_op("qnorm", "rmsnorm", ["x"], ["h"], list(w), group=hd, eps=EPS),
           _op("rope", "rope", ["h", "positions"], ["y"], (), n_heads=nh, head_dim=hd, base=c.rope_base(0),
               scale=c.rope_scale(0))]  # fmt: skip
    return OpCase(c, w, {"x": nh * hd}, {"h": nh * hd, "y": nh * hd}, ops, "y", fusion=("rmsnorm_rope",))


def case_matmul_rmsnorm_add(shape: str, fmt: str) -> OpCase:
    k, n = (int(v) for v in shape.split("x"))
    rng = _rng("matmul_rmsnorm_add", shape, fmt)
    w = {"blk.0.attn_output.weight": weight("blk.0.attn_output.weight", (n, k), fmt, rng),
         "blk.0.post_attention_norm.weight": weight("blk.0.post_attention_norm.weight", (n,), "F32", rng, True)}  # fmt: skip
    ops = [_op("proj", "matmul", ["x"], ["p"], ["blk.0.attn_output.weight"]),
           _op("post", "rmsnorm", ["p"], ["pn"], ["blk.0.post_attention_norm.weight"], eps=EPS),
           _op("residual", "add", ["r", "pn"], ["y"])]  # fmt: skip
    return OpCase(G3.with_(hidden=n), w, {"r": n, "x": k}, {"p": n, "pn": n, "y": n}, ops, "y",
                  fusion=("matmul_rmsnorm_add",))  # fmt: skip


def _ffn_weights(kind: str, shape: str, fmt: str) -> tuple[int, int, dict]:
    h, f = (int(v) for v in shape.split("x"))
    rng = _rng(kind, shape, fmt)
    shapes = {"ffn_gate": (f, h), "ffn_up": (f, h), "ffn_down": (h, f)}
    return h, f, {f"blk.0.{m}.weight": weight(f"blk.0.{m}.weight", s, fmt, rng) for m, s in shapes.items()}


def case_rmsnorm_topk_ffn(shape: str, fmt: str) -> OpCase:
    h, f, w = _ffn_weights("topk_ffn", shape, fmt)
    rng = _rng("topk_ffn_norms", shape)
    for m in ("ffn_norm", "post_ffw_norm"):
        w[f"blk.0.{m}.weight"] = weight(f"blk.0.{m}.weight", (h,), "F32", rng, True)
    k = gaussian_std_multiplier(0.95)
    ops = [_op("norm", "rmsnorm", ["x"], ["h"], ["blk.0.ffn_norm.weight"], eps=EPS),
           _op("gate", "matmul", ["h"], ["g"], ["blk.0.ffn_gate.weight"]),
           _op("topk", "gaussian_topk", ["g"], ["gs"], sparsity=0.95, std_multiplier=k),
           _op("up", "matmul", ["h"], ["u"], ["blk.0.ffn_up.weight"]),
           _op("act", "gelu_mul", ["gs", "u"], ["a"]),
           _op("down", "matmul", ["a"], ["d"], ["blk.0.ffn_down.weight"]),
           _op("post", "rmsnorm", ["d"], ["dn"], ["blk.0.post_ffw_norm.weight"], eps=EPS),
           _op("residual", "add", ["x", "dn"], ["y"])]  # fmt: skip
    acts = {"h": h, "g": f, "gs": f, "u": f, "a": f, "d": h, "dn": h, "y": h}
    c = G3N.with_(hidden=h, ffn=f, activation_sparsity=(0.95,))
    return OpCase(c, w, {"x": h}, acts, ops, "y", fusion=("rmsnorm_topk_ffn",))


def case_sparse_ffn(shape: str, fmt: str) -> OpCase:
    h, f, w = _ffn_weights("sparse_ffn", shape, fmt)
    attrs = {"method": "topk", "target": 0.5, "down": "fp32"}
    ops = [_op("ffn", sparse_ffn.KIND, ["x"], ["y"], list(w), **attrs)]
    return OpCase(G3.with_(hidden=h, ffn=f), w, {"x": h}, {"y": h}, ops, "y")


# kind -> (builder, shapes, weight formats or None: the op takes no weights)
KIND_CASES: dict[str, tuple[Callable[[str, str], OpCase], tuple[str, ...], tuple[str, ...] | None]] = {
    "embed": (case_embed, ("256", "96", "45"), GGUF_FORMATS),
    "rmsnorm": (case_rmsnorm, ("64", "45", "128x512", "256x512"), VECTOR_FORMATS),
    "matmul": (case_matmul, ("256x64", "256x40", "96x48"), GGUF_FORMATS + PLANAR_FORMATS),
    "rope": (case_rope, ("4x128", "2x256-local", "3x16"), None),
    "attention": (case_attention, ("h4-kv2-d128", "h8-kv2-d256-w8", "h3-kv1-d64-w8"), None),
    "gelu_mul": (_binary("gelu_mul"), ("64", "45"), None),
    "add": (_binary("add"), ("64", "45"), None),
    "gather_rows": (case_gather_rows, ("64", "45"), None),
    "softcap": (case_softcap, ("64", "45"), None),
    "rmsnorm_plain": (case_rmsnorm_plain, ("128x256", "64"), None),
    "shared_kv_attention": (case_shared_kv_attention, ("h4-kv2-d128", "h8-kv2-d256-w8"), None),
    "altup_expand": (_altup_projection("altup_expand", "altup_proj.weight"), ("256", "64"), GGUF_FORMATS),
    "altup_unembed": (
        _altup_projection("altup_unembed", "altup_unembd_proj.weight"),
        ("256", "64"),
        GGUF_FORMATS,
    ),
    "altup_predict": (case_altup_router("altup_predict"), ("64/out0", "128/out1"), ("F32",)),
    "altup_correct": (case_altup_router("altup_correct"), ("64/out0", "128/out1"), ("F32",)),
    "laurel_residual": (case_laurel_residual, ("64", "128"), None),
    "gaussian_topk": (case_gaussian_topk, ("128", "96"), None),
    "ple_project": (case_ple_project, ("L2xP32", "L3xP64"), ("F32",)),
    "ple_gate": (case_ple_gate, ("L2xP32", "L3xP64"), None),
    "ple_inject": (case_ple_inject, ("64", "128"), None),
    "rmsnorm_matmul": (case_rmsnorm_matmul, ("256x64", "256x64,32,32"), FUSED_FORMATS),
    "rmsnorm_matmul_gelu": (case_rmsnorm_matmul_gelu, ("256x96",), FUSED_FORMATS),
    "rmsnorm_rope": (case_rmsnorm_rope, ("4x128", "1x256"), None),
    "matmul_rmsnorm_add": (case_matmul_rmsnorm_add, ("256x64",), FUSED_FORMATS),
    "rmsnorm_topk_ffn": (case_rmsnorm_topk_ffn, ("256x256",), FUSED_FORMATS),
    sparse_ffn.KIND: (case_sparse_ffn, ("256x256",), FUSED_FORMATS),
    sparse_attention.KIND: (case_block_sparse_attention, ("h4-kv2-d128", "h4-kv1-d64-w8"), None),
}


def _weight_cols(kind: str, shape: str) -> int:
    """Columns of the case's format-bearing weight (what a format's block size must divide)."""
    if kind in ("rmsnorm_topk_ffn", sparse_ffn.KIND):
        return min(int(v) for v in shape.split("x"))
    return int(shape.split("x")[0].split("/")[0])


def case_ids() -> list[tuple[str, str, str]]:
    out = []
    for kind, (_, shapes, formats) in KIND_CASES.items():
        for shape in shapes:
            for fmt in formats or ("-",):
                if fmt in ("-", *VECTOR_FORMATS) or fits(fmt, _weight_cols(kind, shape)):
                    out.append((kind, shape, fmt))
    return out


CASES = case_ids()


# What each backend refuses, with UnsupportedOpError naming the kind, an op, the format or a tensor.
# Weight formats without a kernel: the cpu backend has none for Q4_1 and Q5_1 (an embedding table only gathered
# from is read in any format numpy dequantizes); vulkan none for Q4_0, Q4_1, Q5_1, Q5_K, dynamic int8
# activations (+a8) and N:M sparse weights.
REFUSED_FORMATS = {
    "cpu": {"Q4_1", "Q5_1"},
    "vulkan": {"Q4_0", "Q4_1", "Q5_1", "Q5_K", "int8+a8", "fp16-nm2:4"},
}
READ_ANY_FORMAT = {("cpu", "embed")}
# The cpu backend's sparse Gemma 3n MLP reads single up rows in place: GGUF blocks or float rows, no planar ones
REFUSED_PAIRS = {("cpu", "rmsnorm_topk_ffn", f) for f in PLANAR_FORMATS}
# Kinds: vulkan has no kernel for the sparsity kinds; the npu backend runs every kind but its own on the numpy
# host backend, whose kernel table has no fused kinds (it never fuses; a fused op reaches it only in a graph
# fused elsewhere, as here, and the numpy backend itself runs fused ops as their parts).
REFUSED_KINDS = {
    "vulkan": {sparse_ffn.KIND, sparse_attention.KIND},
    "npu": {
        "rmsnorm_matmul",
        "rmsnorm_matmul_gelu",
        "rmsnorm_rope",
        "matmul_rmsnorm_add",
        "rmsnorm_topk_ffn",
    },
}
# Shapes: the vulkan embedding kernel writes 8 values an invocation, so it refuses tables of other widths
REFUSED_SHAPES = {("vulkan", "embed", "45")}
# Real bugs, one case each: (backend, kind, shape, format) -> what is wrong
BUGS: dict[tuple[str, str, str, str], str] = {}


def refused(backend: str, kind: str, fmt: str, shape: str = "") -> bool:
    if (backend, kind, shape) in REFUSED_SHAPES:
        return True
    if kind in REFUSED_KINDS.get(backend, ()) or (backend, kind, fmt) in REFUSED_PAIRS:
        return True
    return fmt in REFUSED_FORMATS.get(backend, ()) and (backend, kind) not in READ_ANY_FORMAT


def _params():
    out = []
    for backend in BACKENDS:
        for kind, shape, fmt in CASES:
            marks = []
            if backend == "vulkan" and VULKAN_REASON:
                marks.append(pytest.mark.skip(reason=f"VULKAN TESTS SKIPPED: {VULKAN_REASON}"))
            bug = BUGS.get((backend, kind, shape, fmt))
            if bug:
                marks.append(pytest.mark.xfail(strict=True, reason=bug))
            out.append(
                pytest.param(backend, kind, shape, fmt, marks=marks, id=f"{backend}-{kind}-{shape}-{fmt}")
            )
    return out


# -- running a case --------------------------------------------------------------------------------------------
@cache
def model_of(kind: str, shape: str, fmt: str) -> OpModel:
    build = KIND_CASES[kind][0]
    return op_model(build(shape, fmt), f"{kind}-{shape}-{fmt}")


def make(backend: str, model: OpModel):
    options = {"validation": True} if backend == "vulkan" else {}
    return backend_class(backend)(model, **options)


def run_steps(b, model: OpModel, kind: str) -> list[np.ndarray]:
    """The compared tensor of each of the ``STEPS`` on one new sequence (``kind``: the kind under test, which
    the graph the backend runs must hold)."""
    cache_ = b.new_cache(CONTEXT, slack=max(STEPS))
    outs, pos = [], 0
    for n in STEPS:
        rows = model.case.rows(n) if model.case.rows is not None else "all"
        step = Step.single(cache_, np.arange(pos, pos + n) % VOCAB, pos, rows)
        graph = b.prepare_graph(model.step_graph(n))
        assert kind in {o.kind for o in graph.ops}, f"{b.name} rewrote {kind} away: {graph.describe()}"
        outs.append(np.array(b.run(graph, step), np.float32, copy=True))
        pos += n
    return outs


@cache
def reference(kind: str, shape: str, fmt: str) -> list[np.ndarray]:
    model = model_of(kind, shape, fmt)
    return run_steps(backend_class("numpy")(model), model, kind)


@pytest.mark.parametrize("backend, kind, shape, fmt", _params())
def test_op_matches_numpy(backend, kind, shape, fmt):
    model = model_of(kind, shape, fmt)
    assert kind in {op.kind for op in model.step_graph(1).ops}  # the fusion rules made the kind under test
    if refused(backend, kind, fmt, shape):
        with pytest.raises(UnsupportedOpError) as err:
            b = make(backend, model)
            try:
                run_steps(b, model, kind)
            finally:
                b.close()
        named = [kind, fmt, *(op.name for op in model.step_graph(1).ops), *model.weights]
        assert any(s in str(err.value) for s in named), str(err.value)
        return
    want = reference(kind, shape, fmt)
    b = make(backend, model)
    try:
        got = run_steps(b, model, kind)
        if backend == "vulkan":
            b.dev.check_validation()
    finally:
        b.close()
    tol = TOLERANCE[backend]
    for n, g, w in zip(STEPS, got, want, strict=True):
        assert g.shape == w.shape, (n, g.shape, w.shape)
        bound = tol * float(np.abs(w).max()) + ATOL
        worst = float(np.abs(g - w).max())
        assert worst <= bound, (
            f"step of {n} tokens: max |diff| {worst:.3g} > {bound:.3g} ({backend} tolerance {tol})"
        )


def test_every_kind_is_covered():
    """Every op kind (ops/kinds.py, with the kinds fusion and sparsity register) and every kind a backend's
    handler table names has conformance cases, on every backend."""
    from workbench.backends.npu import NPU_KINDS
    from workbench.backends.numba_cpu import HANDLERS as CPU_KINDS
    from workbench.backends.numpy_ref import KERNELS as NUMPY_KINDS

    kinds = set(KINDS) | set(NUMPY_KINDS) | set(CPU_KINDS) | set(NPU_KINDS)
    try:
        from workbench.backends.vulkan.backend import KINDS as VULKAN_KINDS

        kinds |= set(VULKAN_KINDS)
    except ImportError:  # pragma: no cover - the vulkan module needs its python package
        pass
    covered = {kind for kind, _, _ in CASES}
    assert kinds <= covered, f"op kinds without conformance cases: {sorted(kinds - covered)}"
    assert set(KIND_CASES) <= kinds, f"cases of unknown kinds: {sorted(set(KIND_CASES) - kinds)}"
