"""Batched decode benchmarks: aggregate tokens/s and per-request latency vs batch size and prompt length,
beside the bandwidth bound of a batched decode step.

Batch sizes run interleaved (repeat 1 of every size, then repeat 2, ...) so that machine noise hits every
size alike; ratios to batch 1 come from the same run. Every figure is ``measured`` (host wall clock, on the
engine's device) except the bound, which is ``projected`` from the step graph's bytes and the device profile.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..instrument.devices import DeviceProfile, get_profile
from ..instrument.roofline import DEFAULT_COMPUTE_DTYPE
from ..models.model import Model
from ..ops.kinds import op_cost, step_cost
from ..runtime.batch import SeqChunk, greedy_batch
from ..runtime.engine import Engine
from ..runtime.scheduler import Request, Scheduler
from .prompts import bench_prompt
from .stats import median_ci, percentiles, ratio_ci

BOUND_HOW = "projected (bytes of the batched decode step / the device's streaming bandwidth)"


def batch_prompts(model: Model, batch: int, prompt_tokens: int) -> list[list[int]]:
    """``batch`` different prompts of exactly ``prompt_tokens`` ids (the bench text, each from another offset)."""
    text = bench_prompt(model, prompt_tokens + 8 * batch)
    head = text[:1] if model.tokenizer.add_bos else []
    body = text[len(head) :]
    return [(head + body[8 * i :])[:prompt_tokens] for i in range(batch)]


def decode_step_bytes(model: Model, batch: int, context: int) -> float:
    """Bytes one batched decode step must move: the weights once, and per sequence its KV cache (at
    ``context`` tokens) and activations."""
    one = model.graph(1, 1)
    pos = np.array([context - 1])
    attention = sum(op_cost(op, one, pos).bytes for op in one.ops if op.kind == "attention")
    many = model.graph(batch, batch)
    return step_cost(many, np.full(batch, context - 1)).bytes + (batch - 1) * attention


def decode_bound_tok_s(model: Model, batch: int, context: int, profile: DeviceProfile) -> float:
    """Aggregate decode tokens/s that the device's memory bandwidth allows at ``batch`` (projected)."""
    return batch * profile.mem_bw / decode_step_bytes(model, batch, context)


def device_profile(engine: Engine) -> DeviceProfile | None:
    """The device profile the backend names (``details['profile']``, the host by default); None when the
    backend names one that is not known (no bound is drawn then)."""
    try:
        return get_profile(engine.backend.device.details.get("profile", "host"))
    except ValueError:
        return None


def time_batched_decode(engine: Engine, prompts: Sequence[Sequence[int]], gen: int) -> list[float]:
    """Prefill each prompt alone, then ``gen`` greedy decode steps with every sequence in one step; the
    seconds of each decode step."""
    seqs = [engine.new_sequence(len(p) + gen + 1) for p in prompts]
    toks = [int(np.argmax(engine.forward(s, p))) for s, p in zip(seqs, prompts, strict=True)]
    times = []
    for _ in range(gen):
        t0 = time.perf_counter()
        toks = greedy_batch(engine, [SeqChunk(s, [t]) for s, t in zip(seqs, toks, strict=True)])
        times.append(time.perf_counter() - t0)
    return times


def decode_sweep(
    engine: Engine,
    batch_sizes: Sequence[int],
    prompt_tokens: int,
    gen_tokens: int,
    repeats: int,
    warmups: int = 1,
    progress: Callable[[str], None] | None = None,
    warmup_s: float = 2.0,
) -> list[dict[str, Any]]:
    """One row per batch size: aggregate decode tokens/s (median, interval, samples), the per-token latency
    each request sees (step time percentiles), the ratio to batch 1 and the bandwidth bound.

    Each size warms up for ``warmups`` runs of the measured shape and (unless ``warmups`` is 0) at least
    ``warmup_s`` seconds: a GPU driver may run a newly created pipeline several times slower for its first
    seconds (docs/backend-vulkan.md#batched-decode)."""
    sizes = sorted(set(batch_sizes))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch sizes must be >= 1, got {list(batch_sizes)}")
    if repeats < 1 or gen_tokens < 1 or prompt_tokens < 1:
        raise ValueError("repeats, gen_tokens and prompt_tokens must be >= 1")
    need = prompt_tokens + gen_tokens + 1
    if need > engine.max_context:
        raise ValueError(
            f"prompt_tokens + gen_tokens ({need - 1}) exceed the context of {engine.max_context}"
        )
    model = engine.model
    prompts = {b: batch_prompts(model, b, prompt_tokens) for b in sizes}
    for b in sizes:
        start, done = time.perf_counter(), 0
        while done < warmups or (warmups and time.perf_counter() - start < warmup_s):
            time_batched_decode(engine, prompts[b], gen_tokens)  # the measured shape (same cache sizes)
            done += 1
    samples: dict[int, list[float]] = {b: [] for b in sizes}
    steps: dict[int, list[float]] = {b: [] for b in sizes}
    for r in range(repeats):
        for b in sizes:
            t = time_batched_decode(engine, prompts[b], gen_tokens)
            samples[b].append(b * len(t) / sum(t))
            steps[b].extend(t)
            if progress:
                progress(f"  repeat {r + 1}/{repeats}, batch {b}: {samples[b][-1]:8.1f} tok/s aggregate")
    profile = device_profile(engine)
    dtype = DEFAULT_COMPUTE_DTYPE.get(profile.kind, "fp32") if profile else "fp32"
    context = prompt_tokens + gen_tokens // 2
    flops = step_cost(model.graph(1, 1), np.array([context - 1])).flops
    rows = []
    for b in sizes:
        row: dict[str, Any] = {
            "batch": b,
            "prompt_tokens": prompt_tokens,
            "gen_tokens": gen_tokens,
            "decode_tok_s": median_ci(samples[b]),
            "per_request_tok_s": float(np.median(samples[b]) / b),
            "step_latency_s": percentiles(steps[b]),
            "samples_tok_s": samples[b],
            "how": f"measured (host wall clock, {engine.backend.name} on {engine.backend.device.label()})",
            "step_bytes": decode_step_bytes(model, b, context),
        }
        if 1 in samples:
            row["vs_batch1"] = ratio_ci(samples[b], samples[1])
        if profile is not None:
            row["bound_tok_s"] = decode_bound_tok_s(model, b, context, profile)
            row["bound_how"] = f"{BOUND_HOW}: {profile.name}, {profile.mem_bw / 1e9:.1f} GB/s {profile.how}"
            row["compute_bound_tok_s"] = profile.peak(dtype) / flops
            row["compute_bound_how"] = (
                f"projected (FLOPs per token / {dtype} peak of {profile.name}, {profile.how})"
            )
        rows.append(row)
    return rows


def request_sweep(
    engine: Engine,
    batch_sizes: Sequence[int],
    prompt_lengths: Sequence[int],
    gen_tokens: int,
    max_step_tokens: int = 256,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """End to end through the continuous-batching scheduler: ``batch`` requests of one prompt length arrive
    together; per (batch, prompt length) the aggregate generated tokens/s, median time to first token and
    median request latency (measured, host wall clock)."""
    rows = []
    for p in prompt_lengths:
        for b in batch_sizes:
            if p + gen_tokens > engine.max_context:
                raise ValueError(f"prompt {p} + gen {gen_tokens} exceed the context of {engine.max_context}")
            sched = Scheduler(engine, max_batch=b, max_step_tokens=max(max_step_tokens, b))
            reqs = [Request(ids, gen_tokens) for ids in batch_prompts(engine.model, b, p)]
            t0 = time.perf_counter()
            sched.run_until_done(reqs)
            wall = time.perf_counter() - t0
            lat = [r.finished_s - r.arrival_s for r in reqs]
            rows.append({
                "batch": b,
                "prompt_tokens": p,
                "gen_tokens": gen_tokens,
                "aggregate_tok_s": sum(len(r.output_ids) for r in reqs) / wall,
                "ttft_s": float(np.median([r.first_token_s for r in reqs])),
                "request_latency_s": float(np.median(lat)),
                "how": f"measured (host wall clock, {engine.backend.name} on {engine.backend.device.label()})",
            })  # fmt: skip
            if progress:
                progress(f"  prompt {p}, batch {b}: {rows[-1]['aggregate_tok_s']:8.1f} tok/s, "
                         f"latency {rows[-1]['request_latency_s']:.2f} s")  # fmt: skip
    return rows
