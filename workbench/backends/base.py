"""What every backend provides, and the step a backend runs.

A backend executes op kinds (never the model itself): it prepares the model's weights once, creates KV
caches, and runs a step graph with the step's inputs, optionally reporting each op to a profiler.
The contract and the layering rules around it: docs/architecture.md#backends-and-the-backend-contract.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..hostinfo import host_cores
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
    def single(
        cls,
        cache: Any,
        tokens,
        start_pos: int,
        logits: str | np.ndarray = "last",
        phase: str = "prefill",
        index: int = 0,
    ) -> Step:
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
    """Receives one call per executed op and one per step (the profiler implements this).

    ``start_s`` is a ``time.perf_counter()`` value; ``host_s`` the host wall time of the op; ``device_s``
    the device's own measurement where the backend has a clock (Vulkan timestamps, emulator cycles).
    """

    def on_op(
        self, op: Op, step: Step, start_s: float, host_s: float, device_s: float | None = None
    ) -> None: ...

    def on_step(self, step: Step, graph: Graph, backend: Backend, start_s: float, wall_s: float) -> None: ...


MAX_THREADS = 1024


def check_threads(threads: int | None) -> int | None:
    """``threads`` if it is a sensible host thread count (1 .. 4x the cores), else a clear error."""
    if threads is None:
        return None
    limit = min(MAX_THREADS, 4 * host_cores())
    if not isinstance(threads, int) or not 1 <= threads <= limit:
        raise ValueError(
            f"threads must be an integer from 1 to {limit} on this host ({host_cores()} cores), got {threads!r}"
        )
    return threads


def parse_tune(text: str | None) -> dict[str, str]:
    """``"a=1,b=x"`` -> ``{"a": "1", "b": "x"}`` (backend tunables from ``--tune``)."""
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in (text or "").split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"tunable {item!r} is not name=value")
        out[key.strip()] = value.strip()
    return out


class Backend(ABC):
    """A backend prepared for one model.

    ``tune`` is the ``--tune`` text (``name=value,...``); a backend takes the names it knows with
    :meth:`tunable` and calls :meth:`check_tunables_used` so that a misspelt name is an error.
    """

    name: str = "?"
    tunable_names: tuple[str, ...] = ()

    def __init__(self, model: Model, threads: int | None = None, tune: str | None = None):
        self.model = model
        self.threads = check_threads(threads)
        self._tune = parse_tune(tune)
        unknown = sorted(set(self._tune) - set(self.tunable_names))
        if unknown:
            known = ", ".join(self.tunable_names) or "none"
            raise ValueError(f"{self.name} backend: unknown tunables {unknown} (known: {known})")

    def tunable(self, name: str, default: Any) -> Any:
        """The ``--tune`` value of ``name`` converted to the type of ``default``, else ``default``."""
        if name not in self._tune:
            return default
        text = self._tune[name]
        if isinstance(default, bool):
            return text.lower() not in ("0", "false", "no", "off")
        try:
            return type(default)(text)
        except ValueError:
            raise ValueError(
                f"{self.name} backend: tunable {name}={text!r} is not a {type(default).__name__}"
            ) from None

    @property
    @abstractmethod
    def device(self) -> DeviceInfo: ...

    @classmethod
    def probe(cls) -> dict[str, Any]:
        """``{"available": bool, "devices": [...], "reason": str}`` without loading a model."""
        return {"available": True, "devices": [], "reason": ""}

    @classmethod
    def auto_rejection(cls, **options: Any) -> str | None:
        """Why ``auto`` should skip this backend with these ``options`` before building it (loading weights,
        compiling), or None to build it."""
        return None

    def supports(self, op: Op) -> bool:
        """Whether this backend executes ``op`` itself."""
        return True

    @abstractmethod
    def new_cache(self, max_len: int, slack: int = 0) -> Any:
        """A KV cache for one sequence of up to ``max_len`` tokens."""

    @abstractmethod
    def run(self, graph: Graph, step: Step, observer: OpObserver | None = None) -> np.ndarray:
        """Execute the step; return logits (n_logits, vocab) as float32 on the host."""

    def run_greedy(self, graph: Graph, step: Step, observer: OpObserver | None = None) -> int:
        """The argmax token of the step's last logits row (backends that sample on the device override this
        to skip reading the logits back)."""
        return int(np.argmax(self.run(graph, step, observer)[-1]))

    def run_argmax(self, graph: Graph, step: Step, observer: OpObserver | None = None) -> np.ndarray:
        """The argmax token of every logits row of the step (greedy decoding of a batch; backends that sample
        on the device override this to skip reading the logits back)."""
        return np.argmax(self.run(graph, step, observer), axis=-1).astype(np.int64)

    def threads_used(self) -> int:
        """Host threads this backend computes with (what a fair comparison gives llama.cpp)."""
        return self.threads or host_cores()

    def prepare_graph(self, graph: Graph) -> Graph:
        """The graph this backend runs for a step shape (backends that fuse ops rewrite it here)."""
        return graph

    def close(self) -> None:  # noqa: B027 (a no-op is right for host backends)
        """Release device resources."""

    def run_ops(self, graph: Graph, step: Step, kernel_for, observer: OpObserver | None) -> np.ndarray:
        """Host op loop shared by host backends: ``kernel_for(op)`` gives ``kernel(backend, op, env, step)``
        (or None: unsupported); each op is reported to ``observer`` (with the device seconds a kernel may
        return, e.g. an emulator's); sequence lengths advance at the end."""
        env: dict[str, np.ndarray] = {
            "tokens": step.tokens,
            "positions": step.positions,
            "logit_rows": step.logit_rows,
        }
        for op in graph.ops:
            kernel = kernel_for(op)
            if kernel is None:
                raise UnsupportedOpError(
                    f"{self.name} backend: op {op.name!r} has unsupported kind {op.kind!r}"
                )
            if observer is None:
                kernel(self, op, env, step)
            else:
                t0 = time.perf_counter()
                device_s = kernel(self, op, env, step)
                observer.on_op(op, step, t0, time.perf_counter() - t0, device_s)
        for s in step.seqs:
            s.cache.length = int(step.positions[s.stop - 1]) + 1
        return env[graph.outputs[0]]

    def device_step_seconds(self) -> float | None:
        """Accelerator time of the last step where the backend measures it (GPU timestamps), else None: the
        step's wall time minus this is the host overhead."""
        return None

    def check_tokens(self, step: Step) -> None:
        vocab = self.model.config.vocab_size
        if step.n_tokens <= 64:  # decode steps: Python comparisons are much cheaper than two numpy reductions
            if any(not 0 <= t < vocab for t in step.tokens.tolist()):
                raise ValueError(f"token ids must be in 0..{vocab - 1}")
        elif step.tokens.min() < 0 or step.tokens.max() >= vocab:
            raise ValueError(f"token ids must be in 0..{vocab - 1}")
        ple = self.model.config.ple_vocab_size
        if 0 < ple < vocab and (past := step.tokens[step.tokens >= ple]).size:
            # Gemma 3n: an id the embedding has but the per-layer embedding table has not
            raise ValueError(
                f"token id {int(past[0])} is past the per-layer embedding table per_layer_token_embd "
                f"({ple} rows, of a vocabulary of {vocab}): the model has no per-layer input for it"
            )
