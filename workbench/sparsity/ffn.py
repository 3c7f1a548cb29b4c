"""FFN activation sparsity: which activations a token keeps, the ``sparse_ffn`` op kind and its rewrite.

A sparse FFN keeps, per token, a subset S of the ``ffn`` activations ``a = gelu(gate(h))`` and computes
``down(a_S * up_S(h))``: only the rows of ``ffn_up`` and the columns of ``ffn_down`` in S are needed, so a
kernel that reads only those does ``(1 - target)`` of their work. The subset:

* ``topk``: the ``ceil((1 - target) * ffn)`` largest ``|gelu(gate)|`` (magnitude top-k, as CATS does);
* ``stat``: Gemma 3n's statistical top-k: ``gate > mean(gate) + k * std(gate)`` over the token's gate
  pre-activations, ``k = Phi^-1(target)`` (a normal approximation of the top-k cutoff, no sort). Gemma 3n
  then subtracts the cutoff (its FFN was trained so); here the kept values are unchanged.

A kernel reads the kept columns of ``ffn_down`` as rows of its transpose; ``down`` (``ffn-down=`` in the
spec) says how that transpose is stored: ``fp32`` (the exact values), ``fp16``, or ``int8`` with one scale
per column (:func:`down_columns`). The reference multiplies by those stored values, so a compact format is
a re-quantization of ``ffn_down`` whose accuracy cost the evaluation measures.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from ..ops import reference as ref
from ..ops.graph import Graph, Op
from ..ops.kinds import KINDS, Cost, OpKind, register_kind
from ..quant.planar import dequantize_planes, matmul_input, parse_format, quantize
from .spec import FfnSparsity

KIND = "sparse_ffn"


def kept_count(ffn: int, target: float) -> int:
    return max(1, math.ceil((1.0 - target) * ffn))


def ffn_mask(gate: np.ndarray, act: np.ndarray, method: str, target: float) -> np.ndarray:
    """Boolean (tokens, ffn): the activations each token keeps (``act`` = gelu(gate))."""
    if method == "topk":
        k = kept_count(gate.shape[1], target)
        idx = np.argpartition(-np.abs(act), k - 1, axis=1)[:, :k]
        mask = np.zeros(gate.shape, bool)
        np.put_along_axis(mask, idx, True, axis=1)
        return mask
    if method == "stat":
        g = gate.astype(np.float64)
        cutoff = g.mean(axis=1, keepdims=True) + g.std(axis=1, keepdims=True) * NormalDist().inv_cdf(target)
        return g > cutoff
    raise ValueError(f"unknown FFN sparsity method {method!r}")


def down_columns(down_w: np.ndarray, down: str) -> dict[str, np.ndarray]:
    """The planes (:mod:`workbench.quant.planar`) of ``down_w.T`` (ffn, hidden) in format ``down``: row j holds
    the weights that activation j contributes (fp32: exact; int8: one scale per row)."""
    return quantize(np.ascontiguousarray(down_w.T), parse_format(down), "transposed ffn_down")


def down_values(down_w: np.ndarray, down: str) -> np.ndarray:
    """``down_w`` (hidden, ffn) as a sparse FFN stored as ``down`` multiplies by it."""
    if down == "fp32":
        return down_w
    return np.ascontiguousarray(dequantize_planes(down_columns(down_w, down), parse_format(down)).T)


def sparse_ffn(h: np.ndarray, gate_w, up_w, down_w, tensors, method: str, target: float) -> np.ndarray:
    """Reference semantics: the FFN with the dropped activations set to zero (dense arithmetic).

    ``down_w`` as the op's ``down`` format stores it (:func:`down_values`); ``tensors`` are the three stored
    weights (for the activation rounding of ``+a8`` formats)."""
    g = ref.matmul(matmul_input(tensors[0], h), gate_w)
    a = ref.gelu_tanh(g)
    mask = ffn_mask(g, a, method, target)
    u = ref.matmul(matmul_input(tensors[1], h), up_w)
    f = np.where(mask, a * u, np.float32(0.0)).astype(np.float32)
    return ref.matmul(matmul_input(tensors[2], f), down_w)


def _cost(op: Op, graph: Graph, positions: np.ndarray) -> Cost:
    """Gate in full; up rows and down columns of the kept activations only (what a skipping kernel reads)."""
    t = graph.n_tokens
    gate, up, down = (graph.weights[w] for w in op.weights)
    hidden, ffn = gate.shape[1], gate.shape[0]
    kept = (
        kept_count(ffn, op.attrs["target"])
        if op.attrs["method"] == "topk"
        else (1 - op.attrs["target"]) * ffn
    )
    frac = kept / ffn
    flops = 2.0 * t * hidden * ffn + frac * 2.0 * t * (2 * hidden * ffn) + 10.0 * t * ffn
    down_bytes = ffn * parse_format(op.attrs.get("down", "fp32")).row_bytes(down.shape[0])
    read = gate.nbytes + frac * (up.nbytes + down_bytes) + 4 * t * hidden
    return Cost(flops, read, 4.0 * t * hidden)


if KIND not in KINDS:
    register_kind(OpKind(KIND, "FFN with activation sparsity: gate, kept up rows, kept down columns", _cost))


def sparsify_ffn(graph: Graph, spec: FfnSparsity) -> Graph:
    """Replace each selected layer's gate/up/gelu/down ops by one ``sparse_ffn`` op."""
    ops: list[Op] = []
    by_name = {op.name: op for op in graph.ops}
    skip: set[str] = set()
    for op in graph.ops:
        if op.name in skip:
            continue
        layer = op.layer
        if op.kind == "matmul" and op.name == f"blk.{layer}.ffn_gate" and spec.applies(layer):
            p = f"blk.{layer}"
            up, act, down = by_name[f"{p}.ffn_up"], by_name[f"{p}.ffn_act"], by_name[f"{p}.ffn_down"]
            skip.update({up.name, act.name, down.name})
            ops.append(Op(f"{p}.ffn_sparse", KIND, op.inputs, down.outputs,
                          (op.weights[0], up.weights[0], down.weights[0]),
                          {"method": spec.method, "target": spec.target, "down": spec.down}, layer))  # fmt: skip
        else:
            ops.append(op)
    return Graph(graph.config, graph.n_tokens, graph.n_logits, ops, graph.tensors, graph.weights, graph.outputs,
                 (*graph.rewrites, f"sparse_ffn:{spec.method}={spec.target},down={spec.down}"))  # fmt: skip
