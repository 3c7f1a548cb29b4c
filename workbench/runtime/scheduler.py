"""Continuous batching: requests join and leave between steps, under a KV-cache budget.

Each :meth:`Scheduler.step` builds one ragged step (see :mod:`workbench.runtime.batch`): one token for every
running request that is decoding, plus prefill chunks (prompt, or prompt and output again after a
preemption) up to ``max_step_tokens``. Policies:

* **admission**: waiting requests are admitted oldest first while there is a batch slot and their KV cache
  fits the budget; a request whose whole length could never fit is refused when it is submitted.
* **preemption** (evict and recompute): when the running requests' caches would outgrow the budget, the most
  recently arrived running request is evicted, its cache freed, and it waits again with its tokens so far;
  on readmission its prompt and output are prefilled again and it continues where it stopped.
* **fairness**: the queue is ordered by arrival (a preempted request keeps its place), admission never
  skips the head of the queue, and only the youngest request is evicted, so the oldest request always
  progresses and none starves.
* **back pressure**: more than ``max_queue`` waiting requests raise :class:`QueueFullError` (HTTP 429).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..models.config import ModelConfig
from .batch import SeqChunk, forward_batch
from .engine import Engine, SequenceState
from .sampling import SamplingParams, make_sampler


class QueueFullError(RuntimeError):
    """The waiting queue is full; ``retry_after_s`` estimates when to try again."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


def seq_kv_bytes(config: ModelConfig, n_tokens: int, max_len: int, slack: int = 0) -> int:
    """Bytes the host KV cache (:mod:`workbench.runtime.kv_cache`) holds for a sequence of ``n_tokens``:
    full rings on sliding layers, global layers grown by doubling from 256 slots up to ``max_len``."""
    slot = config.kv_dim * 2 * 4
    total = 0
    for i in range(config.n_layers):
        if config.is_sliding(i):
            total += (config.sliding_window + slack) * slot
            continue
        cap = min(max_len, 256)
        while cap < n_tokens:
            cap = min(max_len, max(n_tokens, 2 * cap))
        total += cap * slot
    return total


@dataclass
class Request:
    """One generation request and its state. ``on_update(request, token, text)`` is called from the
    scheduler's thread for each new token (``token`` None with ``request.done`` set when it finishes)."""

    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_ids: frozenset[int] = frozenset()
    on_update: Callable[[Request, int | None, str], None] | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    output_ids: list[int] = field(default_factory=list)
    status: str = "new"  # new | waiting | running | finished
    finish_reason: str | None = None
    error: str | None = None
    preemptions: int = 0
    arrival_s: float = 0.0
    first_token_s: float | None = None
    finished_s: float | None = None
    cancelled: bool = False
    seq: SequenceState | None = field(default=None, repr=False)
    _sample: Callable | None = field(default=None, repr=False)
    _decoder: object = field(default=None, repr=False)
    _text: list[str] = field(default_factory=list, repr=False)

    @property
    def done(self) -> bool:
        return self.status == "finished"

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def max_len(self) -> int:
        return len(self.prompt_ids) + self.max_tokens


@dataclass
class SchedulerStats:
    """Counters since start (tokens/s over the last ``window_s`` seconds of steps)."""

    steps: int = 0
    requests_finished: int = 0
    requests_rejected: int = 0
    preemptions: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    step_busy_s: float = 0.0
    batch_sizes: Counter[int] = field(default_factory=Counter)


class Scheduler:
    """Continuous batching over one engine (see the module docstring for the policies).

    ``kv_budget_bytes`` bounds the KV cache of all running requests (default: 8 sequences of the engine's
    context); ``max_batch`` bounds the sequences per step; ``max_step_tokens`` the tokens per step.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_batch: int = 8,
        max_step_tokens: int = 256,
        kv_budget_bytes: int | None = None,
        max_queue: int = 256,
        window_s: float = 10.0,
    ):
        if max_batch < 1 or max_step_tokens < max_batch or max_queue < 0:
            raise ValueError("need max_batch >= 1, max_step_tokens >= max_batch and max_queue >= 0")
        self.engine = engine
        self.config = engine.model.config
        self.max_batch, self.max_step_tokens, self.max_queue = max_batch, max_step_tokens, max_queue
        self.kv_budget = kv_budget_bytes or 8 * seq_kv_bytes(
            self.config, engine.max_context, engine.max_context
        )
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.stats = SchedulerStats()
        self._recent: deque[tuple[float, int]] = deque()
        self._window_s = window_s
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stop = False

    # -- requests ----------------------------------------------------------------------------------
    def check(self, req: Request) -> None:
        """Raise ValueError for a request that can never run (bad lengths, KV cache larger than the budget)."""
        if not req.prompt_ids:
            raise ValueError("the prompt is empty (no tokens)")
        if req.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {req.max_tokens}")
        vocab = self.config.vocab_size
        if min(req.prompt_ids) < 0 or max(req.prompt_ids) >= vocab:
            raise ValueError(f"token ids must be in 0..{vocab - 1}")
        limit = self.engine.max_context
        if req.max_len > limit:
            raise ValueError(
                f"prompt of {len(req.prompt_ids)} tokens + max_tokens {req.max_tokens} = {req.max_len} "
                f"exceeds the context limit of {limit} tokens"
            )
        need = seq_kv_bytes(self.config, req.max_len, req.max_len)
        if need > self.kv_budget:
            raise ValueError(
                f"the request needs {need / 2**20:.1f} MiB of KV cache, more than the whole budget of "
                f"{self.kv_budget / 2**20:.1f} MiB"
            )

    def submit(self, req: Request) -> Request:
        """Queue ``req`` (ValueError if it can never run, QueueFullError if the queue is full)."""
        self.check(req)
        with self._lock:
            if len(self.waiting) >= self.max_queue:
                self.stats.requests_rejected += 1
                raise QueueFullError(
                    f"{len(self.waiting)} requests are already waiting (max_queue {self.max_queue})",
                    self.retry_after_s(),
                )
            req.status, req.arrival_s = "waiting", time.perf_counter()
            req._sample = make_sampler(req.sampling)
            req._decoder = self.engine.tokenizer.stream()
            self.waiting.append(req)
            self._wake.notify_all()
        return req

    def cancel(self, req: Request) -> None:
        """Stop ``req`` (a client went away): it is finished and its cache freed before the next step."""
        with self._lock:
            req.cancelled = True
            self._wake.notify_all()

    def retry_after_s(self) -> float:
        rate = self.tokens_per_s()
        backlog = sum(r.max_tokens for r in self.waiting)
        return float(min(60.0, max(1.0, backlog / rate if rate > 0 else 5.0)))

    # -- accounting --------------------------------------------------------------------------------
    def kv_used_bytes(self) -> int:
        return sum(r.seq.cache.nbytes for r in self.running if r.seq is not None)

    def tokens_per_s(self) -> float:
        now = time.perf_counter()
        while self._recent and self._recent[0][0] < now - self._window_s:
            self._recent.popleft()
        if not self._recent:
            return 0.0
        span = max(now - self._recent[0][0], 1e-3)
        return sum(n for _, n in self._recent) / span

    def snapshot(self) -> dict[str, float]:
        """Queue depth, batch size, KV bytes held and budget, tokens/s over the last ``window_s``."""
        with self._lock:
            return {"waiting": len(self.waiting), "running": len(self.running), "kv_used": self.kv_used_bytes(),
                    "kv_budget": self.kv_budget, "tokens_per_s": self.tokens_per_s(), "window_s": self._window_s}  # fmt: skip

    def _bytes_after(self, req: Request, extra: int) -> int:
        n = (req.seq.cache.length if req.seq is not None else 0) + extra
        return seq_kv_bytes(self.config, n, req.max_len)

    # -- the step ----------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> int:
        """Admit, preempt, run one batched step and sample; returns the number of sequences stepped."""
        with self._lock:
            self._drop_cancelled()
            self._admit()
            plan = self._plan()
        if not plan:
            return 0
        t0 = time.perf_counter()
        chunks = [SeqChunk(r.seq, toks, "last" if wants else "none") for r, toks, wants in plan]
        try:
            logits = forward_batch(self.engine, chunks)
        except Exception as e:  # a failing step fails its requests; the others go on
            with self._lock:
                for r, _, _ in plan:
                    r.error = f"{type(e).__name__}: {e}"
                    self._finish(r, "error")
            return len(plan)
        now = time.perf_counter()
        new_tokens = 0
        with self._lock:
            for (r, _, wants), rows in zip(plan, logits, strict=True):
                if wants and r.status == "running":
                    self._emit(r, rows[-1], now)
                    new_tokens += 1
            self.stats.steps += 1
            self.stats.step_busy_s += now - t0
            self.stats.batch_sizes[len(plan)] += 1
            self._recent.append((now, new_tokens))
        return len(plan)

    def _drop_cancelled(self) -> None:
        for r in [r for r in self.waiting + self.running if r.cancelled]:
            self._finish(r, "cancelled")

    def _admit(self) -> None:
        self.waiting.sort(key=lambda r: r.arrival_s)
        used = sum(self._bytes_after(r, self._next_tokens(r)) for r in self.running)
        while self.waiting and len(self.running) < self.max_batch:
            r = self.waiting[0]
            first_chunk = min(len(r.context), self.max_step_tokens)
            need = seq_kv_bytes(self.config, first_chunk, r.max_len)
            if used + need > self.kv_budget and self.running:
                break  # the head waits for room (never skipped: no starvation)
            self.waiting.pop(0)
            if not r.preemptions:
                self.stats.prompt_tokens += len(r.prompt_ids)
            r.seq = self.engine.new_sequence(r.max_len)
            r.status = "running"
            self.running.append(r)
            used += need

    def _next_tokens(self, r: Request) -> int:
        return min(len(r.context) - r.seq.cache.length, self.max_step_tokens)

    def _plan(self) -> list[tuple[Request, list[int], bool]]:
        """Per running request the tokens it feeds this step and whether it samples after them; evicts
        the youngest requests while the caches would outgrow the budget."""
        while True:
            plan, budget = [], self.max_step_tokens
            # decoding requests first (one token each), then prefill chunks, oldest first
            order = sorted(self.running, key=lambda r: (len(r.context) - r.seq.cache.length > 1, r.arrival_s))
            for r in order:
                ctx = r.context
                fed = r.seq.cache.length
                n = min(len(ctx) - fed, budget)
                if n <= 0:
                    continue
                plan.append((r, ctx[fed : fed + n], fed + n == len(ctx)))
                budget -= n
            total = sum(self._bytes_after(r, len(toks)) for r, toks, _ in plan)
            if total <= self.kv_budget or len(self.running) <= 1:
                return plan
            self._preempt(max(self.running, key=lambda r: r.arrival_s))

    def _preempt(self, r: Request) -> None:
        self.running.remove(r)
        r.seq, r.status = None, "waiting"
        r.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.append(r)

    def _emit(self, r: Request, logits: np.ndarray, now: float) -> None:
        tok = r._sample(logits, r.context)
        r.output_ids.append(tok)
        self.stats.generated_tokens += 1
        if r.first_token_s is None:
            r.first_token_s = now - r.arrival_s
        if tok in r.stop_ids:
            self._finish(r, "stop")
            return
        text = r._decoder.push(tok)
        if text:
            r._text.append(text)
        if r.on_update is not None:
            r.on_update(r, tok, text)
        if len(r.output_ids) >= r.max_tokens:
            self._finish(r, "length")

    def _finish(self, r: Request, reason: str) -> None:
        if r.status == "finished":
            return
        if r in self.running:
            self.running.remove(r)
        if r in self.waiting:
            self.waiting.remove(r)
        tail = r._decoder.flush() if r._decoder is not None else ""
        if tail:
            r._text.append(tail)
        r.seq, r.status, r.finish_reason = None, "finished", reason
        r.finished_s = time.perf_counter()
        self.stats.requests_finished += 1
        if r.on_update is not None:
            if tail:
                r.on_update(r, -1, tail)
            r.on_update(r, None, "")

    # -- driving -----------------------------------------------------------------------------------
    def run_until_done(self, requests: Sequence[Request] = ()) -> list[Request]:
        """Submit ``requests`` and step until nothing is left (for benchmarks, tests and notebooks)."""
        for r in requests:
            self.submit(r)
        while self.has_work():
            self.step()
        return list(requests)

    def serve_forever(self) -> None:
        """Step while there is work, sleep while there is none, until :meth:`stop` (a server's thread)."""
        while True:
            with self._lock:
                while not self._stop and not self.has_work():
                    self._wake.wait(timeout=1.0)
                if self._stop:
                    return
            self.step()

    def stop(self) -> None:
        with self._lock:
            self._stop = True
            self._wake.notify_all()
