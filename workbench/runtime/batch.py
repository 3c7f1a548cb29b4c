"""Ragged multi-sequence steps: several sequences, each with its own tokens, positions and KV cache, in one
forward step (batched decode, chunked prefill mixed with decode, speculative verification).

A step is expressed only through :class:`~workbench.backends.base.Step` and its ``SeqSlice`` list, so any
backend that runs a multi-sequence ``Step`` (each attention op attends per sequence over that sequence's
cache, with causal and sliding-window masks from the per-token positions) runs these batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..backends.base import SeqSlice, Step
from .engine import Engine, SequenceState


@dataclass
class SeqChunk:
    """One sequence's part of a batched step: ``tokens`` appended after what ``seq`` holds.

    ``logits``: ``"last"`` (the last token's row), ``"all"``, ``"none"`` (a prefill chunk that is not the
    last) or indices into ``tokens``.
    """

    seq: SequenceState
    tokens: Sequence[int]
    logits: str | Sequence[int] = "last"

    def rows(self) -> list[int]:
        """The chunk's logit rows, ascending indices into ``tokens``."""
        n = len(self.tokens)
        if isinstance(self.logits, str):
            if self.logits == "last":
                return [n - 1]
            if self.logits == "all":
                return list(range(n))
            if self.logits == "none":
                return []
            raise ValueError(f"logits must be 'last', 'all', 'none' or row indices, got {self.logits!r}")
        rows = np.unique(np.asarray(self.logits, dtype=np.int64))
        if len(rows) and (rows.min() < 0 or rows.max() >= n):
            raise ValueError(f"logit rows must be indices in 0..{n - 1}, got {list(self.logits)}")
        return rows.tolist()


def build_step(chunks: Sequence[SeqChunk], phase: str | None = None) -> tuple[Step, list[slice]]:
    """The ragged step for ``chunks`` and, per chunk, the slice of the step's logit rows that are its own.

    A step needs at least one logit row: when no chunk asks for any, the last token's row is computed and
    dropped.
    """
    if not chunks:
        raise ValueError("a batched step needs at least one sequence")
    if len({id(c.seq.cache) for c in chunks}) != len(chunks):
        raise ValueError("a sequence may appear only once in a step")
    tokens, positions, logit_rows, seqs, owned = [], [], [], [], []
    start = 0
    for c in chunks:
        n, cache = len(c.tokens), c.seq.cache
        if n == 0:
            raise ValueError("every sequence in a step needs at least one token")
        cache.check_room(n)
        first = cache.length
        if (
            n == 1 and isinstance(c.logits, str) and c.logits == "last"
        ):  # a decode token (the common case, kept cheap)
            tokens.append(int(c.tokens[0]))
            positions.append(first)
            owned.append(slice(len(logit_rows), len(logit_rows) + 1))
            logit_rows.append(start)
        else:
            tokens.extend(int(t) for t in c.tokens)
            positions.extend(range(first, first + n))
            rows = c.rows()
            owned.append(slice(len(logit_rows), len(logit_rows) + len(rows)))
            logit_rows.extend(r + start for r in rows)
        seqs.append(SeqSlice(cache, start, start + n))
        start += n
    if not logit_rows:
        logit_rows = [start - 1]
    if phase is None:
        phase = "decode" if all(len(c.tokens) == 1 for c in chunks) else "mixed"
    step = Step(
        np.asarray(tokens, np.int32),
        np.asarray(positions, np.int32),
        np.asarray(logit_rows, np.int32),
        seqs,
        phase,
    )
    return step, owned


def forward_batch(engine: Engine, chunks: Sequence[SeqChunk], phase: str | None = None) -> list[np.ndarray]:
    """Run ``chunks`` in one step on ``engine``; per chunk its logits rows, shape (rows, vocab)."""
    step, owned = build_step(chunks, phase)
    logits = engine.run_step(step)
    for c in chunks:
        c.seq.tokens.extend(int(t) for t in c.tokens)
    return [logits[sl] for sl in owned]


def greedy_batch(engine: Engine, chunks: Sequence[SeqChunk]) -> list[int]:
    """Run ``chunks`` (each asking for its last row) in one step; per chunk the argmax token of that row,
    sampled on the device where the backend can (only the token ids come back)."""
    if any(c.logits != "last" for c in chunks):
        raise ValueError("greedy_batch needs logits='last' for every chunk")
    step, _ = build_step(chunks)
    tokens = engine.run_step(step, greedy="rows")
    for c in chunks:
        if len(c.tokens) == 1:
            c.seq.tokens.append(int(c.tokens[0]))
        else:
            c.seq.tokens.extend(int(t) for t in c.tokens)
    return np.asarray(tokens).tolist()
