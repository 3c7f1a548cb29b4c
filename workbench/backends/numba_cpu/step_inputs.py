"""What a run of a one-token program reads besides its instructions: the position, the per-layer KV table
(addresses of each layer's cache arrays), the rope rows of the position and the LM head's task-maxima buffer;
and whether a step is one that programs run."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...ops import reference as ref
from . import matvec_table as mt
from .instructions import Program

if TYPE_CHECKING:
    from ..base import Step
    from . import CpuBackend

# columns of the per-step KV table (one row per layer)
KV_KEYS, KV_VALS, KV_POS, KV_CAP, KV_RING = range(5)


def runnable(step: Step) -> bool:
    """Whether a step is what programs run: one sequence, one token, its logits, a float32 host KV cache."""
    if not (step.n_tokens == 1 and len(step.seqs) == 1 and len(step.logit_rows) == 1):
        return False
    layers = getattr(step.seqs[0].cache, "layers", None)
    return bool(layers) and all(
        isinstance(getattr(layer, "keys", None), np.ndarray) and layer.keys.dtype == np.float32
        for layer in layers
    )


def read(b: CpuBackend, prog: Program, step: Step, argmax: bool) -> tuple:
    """What a run of ``prog`` for ``step`` reads besides the program: the position, the per-layer KV table,
    the rope rows and the LM head's per-task maxima buffer (empty: no argmax wanted)."""
    pos = int(step.positions[0])
    kv = kv_table(prog, step.seqs[0].cache, pos)
    maxima = maxima_buffer(prog, b.rows_per_task) if argmax else mt.NO_MAXIMA
    return pos, kv, rope_rows(prog, pos), maxima


def step_done(prog: Program, step: Step, pos: int) -> np.ndarray:
    """Mark the token at ``pos`` cached; the logits in the program's arena (a view)."""
    step.seqs[0].cache.length = pos + 1
    return prog.arena[prog.out_offset : prog.out_offset + prog.out_cols].reshape(1, -1)


def maxima_buffer(prog: Program, rpt: int) -> np.ndarray:
    """The buffer for the per-task maxima of the program's last projection (one float per task)."""
    if prog.maxima is None:
        _, starts, _ = mt.table_tasks(prog.wts[0, -1], 1, rpt)
        prog.maxima = np.empty(int(starts[1]), np.float32)
    return prog.maxima


ROPE_CHUNK = 256  # positions whose rope rows are computed at once


def kv_table(prog: Program, cache, pos: int) -> np.ndarray:
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


def rope_rows(prog: Program, pos: int) -> np.ndarray:
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
