"""Attention variants: every layer local (sliding window), and block-sparse attention.

Block-sparse attention (``attn-blocks=B:sink:local[:stride]``) cuts positions into blocks of ``B`` tokens.
A query in block ``qb`` sees key block ``kb`` when ``kb < sink`` (attention sinks: the first blocks),
``qb - local < kb <= qb`` (the last ``local`` blocks, its own included), or ``stride > 0`` and
``kb % stride == 0`` (a strided summary); always with causality and the layer's own sliding window. It
is its own op kind, ``block_sparse_attention`` (attrs of ``attention`` plus ``blocks``), so a backend
without a kernel for it refuses it instead of running dense attention; a kernel skips the masked blocks.
"""

from __future__ import annotations

import numpy as np

from ..ops.graph import Graph, Op
from ..ops.kinds import KINDS, Cost, OpKind, op_cost, register_kind
from .spec import AttnBlocks

KIND = "block_sparse_attention"


def block_kept(kb: np.ndarray, qb: np.ndarray, blocks: tuple[int, int, int, int]) -> np.ndarray:
    """Whether key blocks ``kb`` are visible to query blocks ``qb`` (broadcast; causality not included)."""
    _, sink, local, stride = blocks
    keep = (kb < sink) | ((kb > qb - local) & (kb <= qb))
    if stride:
        keep |= kb % stride == 0
    return keep


def block_mask(q_pos: np.ndarray, k_pos: np.ndarray, blocks: tuple[int, int, int, int]) -> np.ndarray:
    """Boolean (T, S): the keys at ``k_pos`` whose block queries at ``q_pos`` see (reference semantics)."""
    b = blocks[0]
    return block_kept(k_pos[None, :] // b, q_pos[:, None] // b, blocks)


def _cost(op: Op, graph: Graph, positions: np.ndarray) -> Cost:
    """The dense attention's cost with only the kept (query, key) pairs computed and the kept keys read."""
    a = op.attrs
    dense = op_cost(
        Op(op.name, "attention", op.inputs, op.outputs, op.weights, a, op.layer), graph, positions
    )
    p = positions.astype(np.int64)
    pairs = kept_pairs = skipped_keys = 0
    for run in np.split(p, np.flatnonzero(np.diff(p) != 1) + 1):  # one run of positions per sequence
        k = np.arange(int(run[-1]) + 1)
        seen = k[None, :] <= run[:, None]
        if a.get("window"):
            seen &= k[None, :] > run[:, None] - a["window"]
        kept = seen & block_mask(run, k, a["blocks"])
        pairs, kept_pairs = pairs + seen.sum(), kept_pairs + kept.sum()
        skipped_keys += int(seen.any(axis=0).sum() - kept.any(axis=0).sum())
    kv_bytes = a["n_kv_heads"] * a["head_dim"] * 2 * a.get("cache_bytes", 4)
    return Cost(dense.flops * kept_pairs / max(1, pairs), dense.bytes_read - skipped_keys * kv_bytes,
                dense.bytes_written)  # fmt: skip


if KIND not in KINDS:
    register_kind(OpKind(KIND, "attention over key blocks: sinks, local blocks, strided blocks", _cost))


def _with(op: Op, kind: str, **attrs) -> Op:
    return Op(op.name, kind, op.inputs, op.outputs, op.weights, {**op.attrs, **attrs}, op.layer)


def _rebuild(graph: Graph, ops: list[Op], rewrite: str) -> Graph:
    return Graph(graph.config, graph.n_tokens, graph.n_logits, ops, graph.tensors, graph.weights, graph.outputs,
                 (*graph.rewrites, rewrite))  # fmt: skip


def local_window(graph: Graph, window: int) -> Graph:
    """Each attention op attends to at most the last ``window`` keys (its own window if smaller)."""
    ops = []
    for op in graph.ops:
        if op.kind in ("attention", KIND):
            current = op.attr("window", 0)
            op = _with(op, op.kind, window=min(current, window) if current else window)
        ops.append(op)
    return _rebuild(graph, ops, f"attn_window={window}")


def block_sparse(graph: Graph, spec: AttnBlocks) -> Graph:
    """The attention ops of the spec's layers become ``block_sparse_attention`` with ``blocks``."""
    blocks = (spec.block, spec.sink, spec.local, spec.stride)
    ops = [
        _with(op, KIND, blocks=blocks) if op.kind == "attention" and spec.applies(op.layer) else op
        for op in graph.ops
    ]
    return _rebuild(graph, ops, f"attn_blocks={spec.text}")
