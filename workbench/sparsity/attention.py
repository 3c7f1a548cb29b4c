"""Attention variants: every layer local (sliding window), the global layers included."""

from __future__ import annotations

from ..ops.graph import Graph, Op


def local_window(graph: Graph, window: int) -> Graph:
    """Each attention op attends to at most the last ``window`` keys (its own window if smaller)."""
    ops = []
    for op in graph.ops:
        if op.kind == "attention":
            current = op.attr("window", 0)
            attrs = {**op.attrs, "window": min(current, window) if current else window}
            op = Op(op.name, op.kind, op.inputs, op.outputs, op.weights, attrs, op.layer)
        ops.append(op)
    return Graph(graph.config, graph.n_tokens, graph.n_logits, ops, graph.tensors, graph.weights, graph.outputs,
                 (*graph.rewrites, f"attn_window={window}"))  # fmt: skip
