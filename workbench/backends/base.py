"""What every backend provides, and the step a backend runs.

A backend executes op kinds (never the model itself): it prepares the model's weights once, creates KV
caches, and runs a step graph with the step's inputs, optionally reporting each op to a profiler.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..models.model import Model
from ..ops.graph import Graph, Op


class BackendUnavailableError(RuntimeError):
    """The backend cannot run here (missing driver, package or device); the message says what to install."""


class UnsupportedOpError(NotImplementedError):
    """A backend cannot execute an op (kind or weight format) and has no fallback for it."""


@dataclass(frozen=True)
class DeviceInfo:
    """What a backend runs on. ``kind``: cpu, gpu, npu or emulator."""

    backend: str
    name: str
    kind: str
    details: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        return f"{self.backend}:{self.name}"


@dataclass
class SeqSlice:
    """The tokens ``[start, stop)`` of a step belong to one sequence whose KV cache is ``cache``."""

    cache: Any
    start: int
    stop: int


@dataclass
class Step:
    """Inputs of one forward step: tokens, their positions, which rows need logits, and their sequences."""

    tokens: np.ndarray
    positions: np.ndarray
    logit_rows: np.ndarray
    seqs: list[SeqSlice]
    phase: str = "decode"
    index: int = 0

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @classmethod
    def single(cls, cache: Any, tokens, start_pos: int, logits: str | np.ndarray = "last", phase: str = "prefill",
               index: int = 0) -> Step:  # fmt: skip
        """A step of one sequence: ``tokens`` at positions ``start_pos...``.

        ``logits`` selects the rows that get logits: ``"last"``, ``"all"`` or an array of row indices.
        """
        toks = np.asarray(tokens, dtype=np.int32).reshape(-1)
        n = len(toks)
        if isinstance(logits, str):
            rows = np.arange(n, dtype=np.int32) if logits == "all" else np.array([n - 1], dtype=np.int32)
        else:
            rows = np.asarray(logits, dtype=np.int32).reshape(-1)
            if len(rows) == 0 or rows.min() < 0 or rows.max() >= n:
                raise ValueError(f"logit rows must be 1..{n} indices in 0..{n - 1}")
        pos = np.arange(start_pos, start_pos + n, dtype=np.int32)
        return cls(toks, pos, rows, [SeqSlice(cache, 0, n)], phase, index)


class OpObserver(Protocol):
    """Receives one call per executed op (the profiler implements this)."""

    def on_op(self, op: Op, graph: Graph, step: Step, host_s: float, device_s: float | None = None,
              device: str | None = None, note: str = "") -> None: ...  # fmt: skip


class Backend(ABC):
    """A backend prepared for one model."""

    name: str = "?"

    def __init__(self, model: Model):
        self.model = model

    @property
    @abstractmethod
    def device(self) -> DeviceInfo: ...

    @classmethod
    def probe(cls) -> dict[str, Any]:
        """``{"available": bool, "devices": [...], "reason": str}`` without loading a model."""
        return {"available": True, "devices": [], "reason": ""}

    def supports(self, op: Op) -> bool:
        """Whether this backend executes ``op`` itself."""
        return True

    @abstractmethod
    def new_cache(self, max_len: int, slack: int = 0) -> Any:
        """A KV cache for one sequence of up to ``max_len`` tokens."""

    @abstractmethod
    def run(self, graph: Graph, step: Step, observer: OpObserver | None = None) -> np.ndarray:
        """Execute the step; return logits (n_logits, vocab) as float32 on the host."""

    def prepare_graph(self, graph: Graph) -> Graph:
        """The graph this backend runs for a step shape (backends that fuse ops rewrite it here)."""
        return graph

    def close(self) -> None:  # noqa: B027 (a no-op is right for host backends)
        """Release device resources."""

    def check_tokens(self, step: Step) -> None:
        vocab = self.model.config.vocab_size
        if step.n_tokens and (step.tokens.min() < 0 or step.tokens.max() >= vocab):
            raise ValueError(f"token ids must be in 0..{vocab - 1}")
