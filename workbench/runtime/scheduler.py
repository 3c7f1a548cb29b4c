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
* **back pressure**: more than ``max_queue`` waiting requests, or (with ``max_waiting_kv_bytes``) waiting
  requests whose KV caches at full length would need more than that, raise :class:`QueueFullError`
  (HTTP 429 with Retry-After).
* **faults**: a step that raises fails only the request at fault. A failing step of one request fails that
  request (``finish_reason`` "error", the exception in ``error``); a failing step of several requests marks
  them *suspect*, frees their caches (a failed step may have written part of them) and queues them again:
  each suspect then steps alone until it has fed its context, so the one at fault fails alone and the
  others go on with the same tokens (recomputed, as after a preemption). Errors in sampling or in a
  request's callback fail that request; :meth:`Scheduler.serve_forever` survives anything a step raises.
"""

from __future__ import annotations

import logging
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

log = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """The waiting queue is full (``code`` "queue_full": too many requests; "kv_budget_full": their KV caches
    would need more than the waiting budget); ``retry_after_s`` estimates when to try again."""

    def __init__(self, message: str, retry_after_s: float, code: str = "queue_full"):
        super().__init__(message)
        self.retry_after_s, self.code = retry_after_s, code


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


def default_kv_budget(engine: Engine) -> int:
    """The KV budget when none is given: 8 sequences of the engine's full context."""
    return 8 * seq_kv_bytes(engine.model.config, engine.max_context, engine.max_context)


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
    suspect: bool = False  # in a step that failed: steps alone until it has fed its context again
    admitted: bool = False
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
    step_errors: int = 0
    preemptions: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    step_busy_s: float = 0.0
    batch_sizes: Counter[int] = field(default_factory=Counter)
    finish_reasons: Counter[str] = field(default_factory=Counter)  # stop, length, cancelled, error


class Scheduler:
    """Continuous batching over one engine (see the module docstring for the policies).

    ``kv_budget_bytes`` bounds the KV cache of all running requests (default: 8 sequences of the engine's
    context); ``max_batch`` bounds the sequences per step; ``max_step_tokens`` the tokens per step;
    ``max_queue`` the waiting requests and ``max_waiting_kv_bytes`` (None: unbounded) the KV bytes they will
    need at full length. ``error_window_s`` is how long a failed request keeps :meth:`health` degraded.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_batch: int = 8,
        max_step_tokens: int = 256,
        kv_budget_bytes: int | None = None,
        max_queue: int = 256,
        max_waiting_kv_bytes: int | None = None,
        window_s: float = 10.0,
        error_window_s: float = 60.0,
    ):
        if max_batch < 1 or max_step_tokens < max_batch or max_queue < 0:
            raise ValueError("need max_batch >= 1, max_step_tokens >= max_batch and max_queue >= 0")
        self.engine = engine
        self.config = engine.model.config
        self.max_batch, self.max_step_tokens, self.max_queue = max_batch, max_step_tokens, max_queue
        self.kv_budget = kv_budget_bytes or default_kv_budget(engine)
        self.max_waiting_kv = max_waiting_kv_bytes
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.stats = SchedulerStats()
        self._recent: deque[tuple[float, int]] = deque()
        self._window_s = window_s
        self._errors: deque[tuple[float, str]] = deque(maxlen=64)
        self._error_window_s = error_window_s
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
        need = self.full_kv_bytes(req)
        if need > self.kv_budget:
            raise ValueError(
                f"the request needs {need / 2**20:.1f} MiB of KV cache, more than the whole budget of "
                f"{self.kv_budget / 2**20:.1f} MiB"
            )

    def full_kv_bytes(self, req: Request) -> int:
        """KV cache bytes ``req`` holds at its full length (prompt + max_tokens)."""
        return seq_kv_bytes(self.config, req.max_len, req.max_len)

    def submit(self, req: Request) -> Request:
        """Queue ``req`` (ValueError if it can never run, QueueFullError if the queue is full)."""
        self.check(req)
        with self._lock:
            if len(self.waiting) >= self.max_queue:
                self._reject(f"{len(self.waiting)} requests are already waiting (max_queue {self.max_queue})")
            if self.max_waiting_kv is not None and self.waiting:  # one request alone always may wait
                waiting_kv = sum(self.full_kv_bytes(r) for r in self.waiting) + self.full_kv_bytes(req)
                if waiting_kv > self.max_waiting_kv:
                    self._reject(
                        f"the waiting requests would need {waiting_kv / 2**20:.1f} MiB of KV cache, more "
                        f"than the waiting budget of {self.max_waiting_kv / 2**20:.1f} MiB",
                        "kv_budget_full",
                    )
            req.status, req.arrival_s = "waiting", time.perf_counter()
            req._sample = make_sampler(req.sampling)
            req._decoder = self.engine.tokenizer.stream()
            self.waiting.append(req)
            self._wake.notify_all()
        return req

    def _reject(self, message: str, code: str = "queue_full") -> None:
        self.stats.requests_rejected += 1
        raise QueueFullError(message, self.retry_after_s(), code)

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

    def health(self) -> dict[str, object]:
        """Requests failed by errors within the last ``error_window_s`` seconds, and the last error."""
        with self._lock:
            now = time.perf_counter()
            recent = [(t, e) for t, e in self._errors if t >= now - self._error_window_s]
            last = self._errors[-1] if self._errors else None
            return {
                "errors_recent": len(recent),
                "error_window_s": self._error_window_s,
                "requests_failed": self.stats.finish_reasons["error"],
                "last_error": last[1] if last else None,
                "last_error_age_s": round(now - last[0], 3) if last else None,
            }

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
        except Exception as e:  # fails the request at fault only (see the module docstring)
            log.warning("a step of %d sequences failed: %s: %s", len(plan), type(e).__name__, e)
            with self._lock:
                self.stats.step_errors += 1
                if len(plan) == 1:
                    self._fail(plan[0][0], e)
                else:
                    for r, _, _ in plan:
                        self._requeue(r)
                        r.suspect = True
            return len(plan)
        now = time.perf_counter()
        new_tokens = 0
        with self._lock:
            for (r, _, wants), rows in zip(plan, logits, strict=True):
                if wants and r.status == "running":
                    r.suspect = False
                    try:
                        self._emit(r, rows[-1], now)
                    except Exception as e:  # sampling or the request's callback: that request fails
                        self._fail(r, e)
                        continue
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
            try:
                r.seq = self.engine.new_sequence(r.max_len)
            except Exception as e:  # e.g. no memory for its cache: this request fails, the queue goes on
                self._fail(r, e)
                continue
            if not r.admitted:
                self.stats.prompt_tokens += len(r.prompt_ids)
            r.status, r.admitted = "running", True
            self.running.append(r)
            used += need

    def _next_tokens(self, r: Request) -> int:
        return min(len(r.context) - r.seq.cache.length, self.max_step_tokens)

    def _plan(self) -> list[tuple[Request, list[int], bool]]:
        """Per running request the tokens it feeds this step and whether it samples after them; evicts
        the youngest requests while the caches would outgrow the budget. A suspect steps alone."""
        while True:
            plan, budget = [], self.max_step_tokens
            # decoding requests first (one token each), then prefill chunks, oldest first
            order = sorted(self.running, key=lambda r: (len(r.context) - r.seq.cache.length > 1, r.arrival_s))
            suspects = [r for r in self.running if r.suspect]
            if suspects:
                order = [min(suspects, key=lambda r: r.arrival_s)]
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
        self._requeue(r)
        r.preemptions += 1
        self.stats.preemptions += 1

    def _requeue(self, r: Request) -> None:
        """Free ``r``'s cache and queue it again (it keeps its place); readmitted, its context is recomputed."""
        self.running.remove(r)
        r.seq, r.status = None, "waiting"
        self.waiting.append(r)

    def _fail(self, r: Request, e: BaseException) -> None:
        r.error = f"{type(e).__name__}: {e}"
        self._errors.append((time.perf_counter(), r.error))
        self._finish(r, "error")

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
        self.stats.finish_reasons[reason] += 1
        if r.on_update is None:
            return
        try:
            if tail:
                r.on_update(r, -1, tail)
            r.on_update(r, None, "")
        except Exception as e:  # whoever waited for this request is gone; nothing is left to tell
            log.warning("request %s: its callback failed at the end: %s: %s", r.id, type(e).__name__, e)

    # -- driving -----------------------------------------------------------------------------------
    def run_until_done(self, requests: Sequence[Request] = ()) -> list[Request]:
        """Submit ``requests`` and step until nothing is left (for benchmarks, tests and notebooks)."""
        for r in requests:
            self.submit(r)
        while self.has_work():
            self.step()
        return list(requests)

    def serve_forever(self) -> None:
        """Step while there is work, sleep while there is none, until :meth:`stop` (a server's thread).

        Whatever a step raises past its own handling fails the running requests (their state may be
        inconsistent) and serving goes on: the thread ends only at :meth:`stop`."""
        while True:
            with self._lock:
                while not self._stop and not self.has_work():
                    self._wake.wait(timeout=1.0)
                if self._stop:
                    return
            try:
                self.step()
            except Exception as e:
                log.exception("scheduler step failed")
                with self._lock:
                    self.stats.step_errors += 1
                    for r in list(self.running):
                        self._fail(r, e)

    def stop(self) -> None:
        with self._lock:
            self._stop = True
            self._wake.notify_all()
