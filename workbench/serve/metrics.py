"""``/metrics``: the scheduler's and the server's state in the Prometheus text format (version 0.0.4)."""

from __future__ import annotations

import os
from collections import Counter

from ..runtime.scheduler import Scheduler

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """Current resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def render(scheduler: Scheduler, responses: Counter[tuple[str, int]], device: str) -> str:
    """Every gauge is a measured value on ``device`` (host wall clock for rates)."""
    s = scheduler.stats
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP workbench_{name} {help_}")
        lines.append(f"# TYPE workbench_{name} {kind}")
        lines.extend(f"workbench_{name}{labels} {value:g}" for labels, value in samples)

    snap = scheduler.snapshot()
    waiting, running, kv_used, rate = snap["waiting"], snap["running"], snap["kv_used"], snap["tokens_per_s"]
    metric("queue_depth", "gauge", "requests waiting for a batch slot", [("", waiting)])
    metric("running_requests", "gauge", "requests in the running batch", [("", running)])
    metric("tokens_per_second", "gauge",
           f"generated tokens per second over the last {snap['window_s']:g} s (measured on {device})",
           [("", rate)])  # fmt: skip
    metric("kv_cache_bytes", "gauge", "KV cache bytes held by running requests", [("", kv_used)])
    metric("kv_cache_budget_bytes", "gauge", "KV cache budget", [("", snap["kv_budget"])])
    metric(
        "kv_cache_usage_ratio", "gauge", "KV cache bytes held / budget", [("", kv_used / snap["kv_budget"])]
    )
    metric("generated_tokens_total", "counter", "tokens generated", [("", s.generated_tokens)])
    metric("prompt_tokens_total", "counter", "prompt tokens admitted", [("", s.prompt_tokens)])
    metric("requests_finished_total", "counter", "requests finished, by reason (stop, length, cancelled, error)",
           [(f'{{reason="{k}"}}', v) for k, v in sorted(s.finish_reasons.items())])  # fmt: skip
    metric("requests_rejected_total", "counter", "requests refused with 429 (queue or its KV budget full)",
           [("", s.requests_rejected)])  # fmt: skip
    metric("step_errors_total", "counter", "batched steps that raised", [("", s.step_errors)])
    metric("preemptions_total", "counter", "running requests evicted for KV room (recomputed later)",
           [("", s.preemptions)])  # fmt: skip
    metric("steps_total", "counter", "batched forward steps", [("", s.steps)])
    metric("step_busy_seconds_total", "counter", "host wall time spent in steps", [("", s.step_busy_s)])
    metric("step_batch_size_total", "counter", "steps by number of sequences",
           [(f'{{size="{k}"}}', v) for k, v in sorted(s.batch_sizes.items())])  # fmt: skip
    metric("http_responses_total", "counter", "HTTP responses by endpoint and status",
           [(f'{{path="{p}",status="{c}"}}', v) for (p, c), v in sorted(responses.items())])  # fmt: skip
    metric("process_resident_memory_bytes", "gauge", "resident set size of the server process",
           [("", resident_bytes())])  # fmt: skip
    return "\n".join(lines) + "\n"
