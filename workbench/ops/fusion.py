"""Fusion as graph rewrites: chains of ops become one op of a fused kind.

A fused op keeps its original ops in ``attrs["parts"]``; its reference semantics are those parts run in
order, so any backend can execute it by composition, and a backend with a native kernel runs it in one go.
Its cost is the sum of its parts minus the traffic of the intermediate tensors that never leave the kernel.

Fused kinds:

* ``rmsnorm_matmul``: RMSNorm then one or more projections of the normed row (QKV; final norm + LM head)
* ``rmsnorm_matmul_gelu``: RMSNorm, gate and up projections, gelu(gate) * up
* ``rmsnorm_rope``: per-head RMSNorm (QK-norm) then RoPE
* ``matmul_rmsnorm_add``: projection, post-norm, residual add (attention output, FFN down)

Optional (applied only by a backend that names it; :data:`OPTIONAL_RULES`):

* ``rmsnorm_topk_ffn``: a Gemma 3n sparse layer's MLP from its norm to its residual add (RMSNorm, gate
  projection, Gaussian top-k, up projection, gelu(gate)*up, down projection, post-norm, add), so that a
  backend can compute only the up rows and down columns of the units the top-k kept
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import numpy as np

from .graph import Graph, Op
from .kinds import KINDS, Cost, OpKind, op_cost, register_kind


def _fused_cost(op: Op, graph: Graph, positions: np.ndarray) -> Cost:
    parts: tuple[Op, ...] = op.attrs["parts"]
    total = Cost(0.0, 0.0, 0.0)
    produced = {t for p in parts for t in p.outputs}
    internal = produced - set(op.outputs)
    for p in parts:
        total = total + op_cost(p, graph, positions)
    saved_w = sum(graph.tensors[t].nbytes for t in internal)
    saved_r = sum(graph.tensors[t].nbytes for p in parts for t in p.inputs if t in internal)
    return Cost(total.flops, total.bytes_read - saved_r, total.bytes_written - saved_w)


FUSED_KINDS = {
    "rmsnorm_matmul": "RMSNorm fused into the projections that read its output",
    "rmsnorm_matmul_gelu": "RMSNorm + gate/up projections + gelu(gate)*up",
    "rmsnorm_rope": "per-head RMSNorm (QK-norm) + RoPE",
    "matmul_rmsnorm_add": "projection + post-norm + residual add",
    "rmsnorm_topk_ffn": "RMSNorm + gate projection + Gaussian top-k + up + gelu(gate)*up + down + post-norm + add",
}
for _name, _doc in FUSED_KINDS.items():
    if _name not in KINDS:
        register_kind(OpKind(_name, _doc, _fused_cost))


def _consumers(ops: list[Op]) -> dict[str, list[int]]:
    cons: dict[str, list[int]] = defaultdict(list)
    for i, op in enumerate(ops):
        for t in op.inputs:
            cons[t].append(i)
    return cons


def _fuse(ops: list[Op], idx: list[int], kind: str, outputs: tuple[str, ...]) -> list[Op]:
    """Replace ops ``idx`` by one fused op at the position of the first."""
    parts = [ops[i] for i in sorted(idx)]
    produced = {t for p in parts for t in p.outputs}
    inputs: list[str] = []
    for p in parts:
        for t in p.inputs:
            if t not in produced and t not in inputs:
                inputs.append(t)
    weights = tuple(w for p in parts for w in p.weights)
    name = parts[0].name + "+" + kind
    fused = Op(name, kind, tuple(inputs), outputs, weights, {"parts": tuple(parts)}, parts[0].layer)
    drop = set(idx)
    out = []
    for i, op in enumerate(ops):
        if i == min(idx):
            out.append(fused)
        elif i not in drop:
            out.append(op)
    return out


def _sole(cons, t: str) -> int | None:
    c = cons.get(t, [])
    return c[0] if len(c) == 1 else None


def _rule_norm_rope(ops: list[Op]) -> list[Op] | None:
    cons = _consumers(ops)
    for i, op in enumerate(ops):
        if op.kind == "rmsnorm" and op.attr("group"):
            j = _sole(cons, op.outputs[0])
            if j is not None and ops[j].kind == "rope":
                return _fuse(ops, [i, j], "rmsnorm_rope", ops[j].outputs)
    return None


def _rule_norm_matmul(ops: list[Op]) -> list[Op] | None:
    cons = _consumers(ops)
    for i, op in enumerate(ops):
        if op.kind == "rmsnorm" and not op.attr("group"):
            users = cons.get(op.outputs[0], [])
            if users and all(ops[j].kind == "matmul" and ops[j].inputs == op.outputs for j in users):
                outs = tuple(t for j in sorted(users) for t in ops[j].outputs)
                return _fuse(ops, [i, *users], "rmsnorm_matmul", outs)
    return None


def _rule_norm_matmul_gelu(ops: list[Op]) -> list[Op] | None:
    cons = _consumers(ops)
    for i, op in enumerate(ops):
        if op.kind == "rmsnorm_matmul" and len(op.outputs) == 2:
            users = {j for t in op.outputs for j in cons.get(t, [])}
            if len(users) == 1:
                j = users.pop()
                if ops[j].kind == "gelu_mul" and tuple(ops[j].inputs) == op.outputs:
                    parts = (*op.attrs["parts"], ops[j])
                    fused = Op(op.name.split("+")[0] + "+rmsnorm_matmul_gelu", "rmsnorm_matmul_gelu", op.inputs,
                               ops[j].outputs, op.weights, {"parts": parts}, op.layer)  # fmt: skip
                    return [fused if k == i else o for k, o in enumerate(ops) if k != j]
    return None


def _rule_matmul_norm_add(ops: list[Op]) -> list[Op] | None:
    cons = _consumers(ops)
    for i, op in enumerate(ops):
        if op.kind == "matmul":
            j = _sole(cons, op.outputs[0])
            if j is None or ops[j].kind != "rmsnorm" or ops[j].attr("group"):
                continue
            k = _sole(cons, ops[j].outputs[0])
            if k is not None and ops[k].kind == "add":
                other = [t for t in ops[k].inputs if t != ops[j].outputs[0]]
                produced_before = {t for o in ops[:i] for t in o.outputs} | {
                    "tokens",
                    "positions",
                    "logit_rows",
                }
                if all(t in produced_before for t in other):
                    return _fuse(ops, [i, j, k], "matmul_rmsnorm_add", ops[k].outputs)
    return None


def _producer(ops: list[Op], t: str) -> int | None:
    return next((i for i, op in enumerate(ops) if t in op.outputs), None)


def _rule_topk_ffn(ops: list[Op]) -> list[Op] | None:
    cons = _consumers(ops)
    for i, op in enumerate(ops):
        if op.kind != "gaussian_topk":
            continue
        gate = _producer(ops, op.inputs[0])
        if gate is None or ops[gate].kind != "matmul" or _sole(cons, ops[gate].outputs[0]) != i:
            continue
        norm = _producer(ops, ops[gate].inputs[0])
        act = _sole(cons, op.outputs[0])
        if norm is None or ops[norm].kind != "rmsnorm" or ops[norm].attr("group") or act is None:
            continue
        users = cons.get(ops[norm].outputs[0], [])
        up = next((j for j in users if j != gate), None)
        if len(users) != 2 or up is None or ops[up].kind != "matmul" or ops[act].kind != "gelu_mul":
            continue
        if ops[act].inputs != (op.outputs[0], ops[up].outputs[0]) or _sole(cons, ops[up].outputs[0]) != act:
            continue
        down = _sole(cons, ops[act].outputs[0])
        post = _sole(cons, ops[down].outputs[0]) if down is not None and ops[down].kind == "matmul" else None
        if post is None or ops[post].kind != "rmsnorm" or ops[post].attr("group"):
            continue
        res = _sole(cons, ops[post].outputs[0])
        if res is not None and ops[res].kind == "add" and ops[norm].inputs[0] in ops[res].inputs:
            return _fuse(ops, [norm, gate, i, up, act, down, post, res], "rmsnorm_topk_ffn", ops[res].outputs)
    return None


RULES: dict[str, Callable[[list[Op]], list[Op] | None]] = {
    "rmsnorm_rope": _rule_norm_rope,
    "rmsnorm_matmul": _rule_norm_matmul,
    "rmsnorm_matmul_gelu": _rule_norm_matmul_gelu,
    "matmul_rmsnorm_add": _rule_matmul_norm_add,
}


# rules fuse() applies only when named (kinds that not every fusing backend runs)
OPTIONAL_RULES: dict[str, Callable[[list[Op]], list[Op] | None]] = {"rmsnorm_topk_ffn": _rule_topk_ffn}


def fuse(graph: Graph, rules: tuple[str, ...] = tuple(RULES)) -> Graph:
    """The graph with every match of ``rules`` fused (applied in order, each until no match remains;
    names of :data:`RULES` or :data:`OPTIONAL_RULES`)."""
    ops = list(graph.ops)
    for name in rules:
        rule = RULES.get(name) or OPTIONAL_RULES[name]
        while (new := rule(ops)) is not None:
            ops = new
    return Graph(graph.config, graph.n_tokens, graph.n_logits, ops, graph.tensors, graph.weights, graph.outputs,
                 graph.rewrites + tuple(rules))  # fmt: skip
