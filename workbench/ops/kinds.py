"""Op kinds: what each computes (see :mod:`workbench.ops.reference`) and what it costs in FLOPs and bytes.

Costs count the arithmetic of the reference semantics and the bytes an ideal kernel must move: weights
in their stored format (quant blocks included), activations in float32, the KV cache as stored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .graph import Graph, Op

F32_BYTES = 4


@dataclass(frozen=True)
class Cost:
    flops: float
    bytes_read: float
    bytes_written: float

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.flops + other.flops,
            self.bytes_read + other.bytes_read,
            self.bytes_written + other.bytes_written,
        )


def visible_keys(positions: np.ndarray, window: int) -> int:
    """Sum over queries of the keys each one attends to (causal, optional sliding window)."""
    seen = positions.astype(np.int64) + 1
    if window:
        seen = np.minimum(seen, window)
    return int(seen.sum())


def _numel(graph: Graph, name: str) -> int:
    return int(np.prod(graph.tensors[name].shape, dtype=np.int64)) if name in graph.tensors else 0


def _act_bytes(graph: Graph, names) -> int:
    return sum(graph.tensors[n].nbytes for n in names if n in graph.tensors)


def _weights_bytes(graph: Graph, op: Op) -> int:
    return sum(graph.weights[w].nbytes for w in op.weights)


def _elementwise(flops_per_elem: float) -> Callable[[Op, Graph, np.ndarray], Cost]:
    def cost(op: Op, graph: Graph, positions: np.ndarray) -> Cost:
        n = _numel(graph, op.outputs[0])
        return Cost(
            flops_per_elem * n,
            _act_bytes(graph, op.inputs) + _weights_bytes(graph, op),
            _act_bytes(graph, op.outputs),
        )

    return cost


def _embed(op: Op, graph: Graph, positions: np.ndarray) -> Cost:
    w = graph.weights[op.weights[0]]
    rows = graph.n_tokens
    return Cost(
        _numel(graph, op.outputs[0]), rows * w.nbytes / w.shape[0] + rows * 4, _act_bytes(graph, op.outputs)
    )


def _matmul(op: Op, graph: Graph, positions: np.ndarray) -> Cost:
    """x (T, K) times one or more weights (N_i, K): fused projections list several weights."""
    x = graph.tensors[op.inputs[0]]
    t, k = x.shape
    n = sum(graph.weights[w].shape[0] for w in op.weights)
    return Cost(
        2.0 * t * n * k,
        _act_bytes(graph, op.inputs) + _weights_bytes(graph, op),
        _act_bytes(graph, op.outputs),
    )


def distinct_keys(positions: np.ndarray, window: int) -> int:
    """Cache entries an ideal kernel reads once per step: the keys visible to any query, per sequence.

    A step's sequences are the runs of consecutive positions.
    """
    p = positions.astype(np.int64)
    breaks = np.flatnonzero(np.diff(p) != 1) + 1
    total = 0
    for run in np.split(p, breaks):
        lo = max(0, int(run[0]) - window + 1) if window else 0
        total += int(run[-1]) - lo + 1
    return total


def _attention(op: Op, graph: Graph, positions: np.ndarray) -> Cost:
    a = op.attrs
    window = a.get("window", 0)
    keys = visible_keys(positions, window)
    hd, nh, nkv = a["head_dim"], a["n_heads"], a["n_kv_heads"]
    flops = 4.0 * keys * nh * hd + 5.0 * keys * nh  # QK^T, PV, and softmax
    kv_bytes = nkv * hd * 2 * a.get("cache_bytes", F32_BYTES)
    cache_read = distinct_keys(positions, window) * kv_bytes
    new_kv = graph.n_tokens * kv_bytes
    return Cost(flops, _act_bytes(graph, op.inputs) + cache_read, _act_bytes(graph, op.outputs) + new_kv)


def _shared_attention(op: Op, graph: Graph, positions: np.ndarray) -> Cost:
    """Attention over another layer's cache: as ``attention``, without writing keys and values."""
    full = _attention(op, graph, positions)
    a = op.attrs
    new_kv = graph.n_tokens * a["n_kv_heads"] * a["head_dim"] * 2 * a.get("cache_bytes", F32_BYTES)
    return Cost(full.flops, full.bytes_read, full.bytes_written - new_kv)


def _altup_projections(op: Op, graph: Graph, positions: np.ndarray) -> Cost:
    """The AltUp expansion or unembedding: n-1 (hidden x hidden) projections plus the rescaling."""
    w = graph.weights[op.weights[0]]
    t = graph.tensors[op.inputs[0]].shape[0]
    hidden = w.shape[-1]
    flops = 2.0 * t * w.shape[0] * hidden * hidden + 6.0 * t * (w.shape[0] + 1) * hidden
    return Cost(flops, _act_bytes(graph, op.inputs) + w.nbytes, _act_bytes(graph, op.outputs))


def _altup_router(op: Op, graph: Graph, positions: np.ndarray) -> Cost:
    """AltUp predict or correct: the router (a norm, an n x hidden product), then n x n mixing of the
    streams (predict) or one update per stream (correct)."""
    t, width = graph.tensors[op.outputs[0]].shape
    n = graph.weights[op.weights[1]].shape[0]
    hidden = width // n
    mix = 2.0 * n * width if op.kind == "altup_predict" else 3.0 * width
    flops = t * (4.0 * hidden + 2.0 * n * hidden + mix)
    return Cost(
        flops, _act_bytes(graph, op.inputs) + _weights_bytes(graph, op), _act_bytes(graph, op.outputs)
    )


def _ple_gate(op: Op, graph: Graph, positions: np.ndarray) -> Cost:
    """GELU of the gate times the layer's slice of the per-layer inputs (not all layers' inputs)."""
    out = _act_bytes(graph, op.outputs)
    return Cost(10.0 * _numel(graph, op.outputs[0]), 2 * out, out)


@dataclass(frozen=True)
class OpKind:
    name: str
    doc: str
    cost: Callable[[Op, Graph, np.ndarray], Cost]


KINDS: dict[str, OpKind] = {
    k.name: k
    for k in [
        OpKind("embed", "token embedding lookup times sqrt(hidden)", _embed),
        OpKind(
            "rmsnorm",
            "RMSNorm times its weight (Gemma 3: 1+w), over the row or over each head",
            _elementwise(4),
        ),
        OpKind("matmul", "x @ W.T with W in its stored format", _matmul),
        OpKind("rope", "rotary position embedding (rotate-half)", _elementwise(3)),
        OpKind(
            "attention", "causal GQA attention over the KV cache (sliding window on local layers)", _attention
        ),
        OpKind("gelu_mul", "gelu_tanh(gate) * up", _elementwise(10)),
        OpKind("add", "residual add", _elementwise(1)),
        OpKind("gather_rows", "select the rows that need logits", _elementwise(0)),
        OpKind("softcap", "tanh soft-capping of logits", _elementwise(3)),
        # Gemma 3n (docs/gemma3n.md); references in ops/reference_gemma3n.py
        OpKind(
            "rmsnorm_plain", "RMSNorm without a weight, over each head (Gemma 3n's V norm)", _elementwise(3)
        ),
        OpKind(
            "shared_kv_attention",
            "causal GQA attention over an earlier layer's KV cache (Gemma 3n's last layers): Q only",
            _shared_attention,
        ),
        OpKind(
            "altup_expand",
            "the AltUp streams of the embedding: it, and n-1 projections of it at its RMS",
            _altup_projections,
        ),
        OpKind(
            "altup_unembed",
            "the mean of the AltUp streams, n-1 of them projected back at the first one's RMS",
            _altup_projections,
        ),
        OpKind(
            "altup_predict",
            "AltUp predict: routed n x n mixing of the streams; also the active one",
            _altup_router,
        ),
        OpKind(
            "altup_correct",
            "AltUp correct: each stream moved by a routed multiple of the layer's innovation",
            _altup_router,
        ),
        OpKind(
            "laurel_residual",
            "((x + attn) + (h + laurel)) / sqrt(2): the residual with LAuReL",
            _elementwise(4),
        ),
        OpKind(
            "gaussian_topk",
            "relu(g - mean(g) - k std(g)): Gaussian top-k activation sparsity",
            _elementwise(6),
        ),
        OpKind(
            "ple_project", "per-layer inputs: (RMSNorm(proj * scale) + table rows) / sqrt(2)", _elementwise(6)
        ),
        OpKind("ple_gate", "gelu_tanh(gate) * the layer's per-layer input", _ple_gate),
        OpKind(
            "ple_inject",
            "add the per-layer embedding to every AltUp stream but the active one",
            _elementwise(1),
        ),
    ]
}


def register_kind(kind: OpKind) -> None:
    """Add an op kind (fused kinds are registered by the rewrites that create them)."""
    KINDS[kind.name] = kind


def op_cost(op: Op, graph: Graph, positions: np.ndarray) -> Cost:
    try:
        kind = KINDS[op.kind]
    except KeyError:
        raise ValueError(f"op {op.name!r}: unknown op kind {op.kind!r}") from None
    return kind.cost(op, graph, positions)


def step_cost(graph: Graph, positions: np.ndarray) -> Cost:
    total = Cost(0.0, 0.0, 0.0)
    for op in graph.ops:
        total = total + op_cost(op, graph, positions)
    return total
