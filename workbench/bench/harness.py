"""``workbench bench``: warm-ups, N timed repeats of prefill + decode, medians with bootstrap intervals,
optionally alternating with llama.cpp on the same GGUF, prompt, lengths, depth, device and threads, and a
profiled run. At a depth D every repeat first prefills D tokens untimed, then times the prompt's prefill and
the decode steps after them (llama-bench's ``-d``).
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..experiments.records import write_record
from ..instrument import environment
from ..instrument.profiler import Profiler, by_kind, overhead_summary
from ..runtime.engine import Engine
from .batching import decode_step_bytes
from .comparison import compare, open_llama_cpp
from .prompts import depth_and_prompt
from .stats import median_ci
from .timing import RunTiming, summarize

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class BenchConfig:
    model: str = "gemma3-270m"
    backend: str = "auto"
    prompt_tokens: int = 128
    gen_tokens: int = 32
    repeats: int = 5
    warmups: int = 1
    threads: int | None = None
    vs: str | None = None
    trace: str | None = None
    profile: bool = True
    backend_options: dict[str, Any] | None = None
    depth: int = 0  # tokens prefilled (untimed) before each timed prefill
    llama_cpp: str | None = None  # a llama-bench or llama-server binary (or its folder) for --backend vulkan

    def validate(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"--prompt-tokens must be >= 1, got {self.prompt_tokens}")
        if self.gen_tokens < 1:
            raise ValueError(f"--gen-tokens must be >= 1, got {self.gen_tokens}")
        if self.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {self.repeats}")
        if self.warmups < 0:
            raise ValueError(f"--warmups must be >= 0, got {self.warmups}")
        if self.depth < 0:
            raise ValueError(f"--depth must be >= 0, got {self.depth}")
        if self.llama_cpp and self.vs != "llama.cpp":
            raise ValueError("--llama-cpp is the binary of the comparison: give it with --vs llama.cpp")
        if self.vs not in (None, "llama.cpp"):
            raise ValueError(f"--vs accepts only 'llama.cpp', got {self.vs!r}")


def time_ours(engine: Engine, prompt: list[int], gen: int, depth: list[int] | None = None) -> RunTiming:
    """One repeat: prefill ``depth`` untimed (and unprofiled), then time the prefill of ``prompt`` after it
    and ``gen`` greedy decode steps, each."""
    depth = depth or []
    seq = engine.new_sequence(max_len=len(depth) + len(prompt) + gen + 1)
    if depth:
        observer, engine.observer = engine.observer, None
        try:
            engine.forward(seq, depth)  # returns the logits to the host: the device is done with it
        finally:
            engine.observer = observer
    t0 = time.perf_counter()
    logits = engine.forward(seq, prompt)
    t1 = time.perf_counter()
    tok = int(np.argmax(logits))
    ttft = time.perf_counter() - t0
    lat, dev = [], []
    for _ in range(gen):
        ts = time.perf_counter()
        tok = engine.greedy_step(seq, tok)
        lat.append(time.perf_counter() - ts)
        d = engine.backend.device_step_seconds()  # read after the timed region
        if d is not None:
            dev.append(d)
    return RunTiming(t1 - t0, ttft, lat, dev)


class BandwidthSideBySide:
    """The host's streaming read bandwidth measured after each repeat, so that decode is compared with the
    bandwidth bound of the same moment: on a shared VM the bandwidth moved 47-83 GB/s within an hour."""

    def __init__(self, engine: Engine, cfg: BenchConfig):
        from ..instrument.devices import stream_buffer

        self.threads = cfg.threads or engine.backend.threads_used()
        self.context = cfg.depth + cfg.prompt_tokens + cfg.gen_tokens // 2
        self.bytes = decode_step_bytes(engine.model, 1, self.context)
        self.buf = stream_buffer()
        self.gbs: list[float] = []
        self.round_trip_us: list[float] = []

    def measure(self) -> None:
        from ..instrument.devices import stream_read_gbs, thread_round_trip_us

        self.gbs.append(stream_read_gbs(self.threads, repeats=3, arr=self.buf))
        self.round_trip_us.append(thread_round_trip_us(self.threads, loops=500))

    def summary(self, decode_tok_s: list[float]) -> dict[str, Any]:
        """Decode tok/s over the bound (bandwidth / bytes per token) of each repeat: medians, intervals."""
        fractions = [d * self.bytes / (g * 1e9) for d, g in zip(decode_tok_s, self.gbs, strict=True)]
        return {
            "fraction": median_ci(fractions),
            "stream_read_gbs": median_ci(self.gbs),
            "thread_round_trip_us": median_ci(self.round_trip_us),
            "bytes_per_token": self.bytes,
            "context": self.context,
            "samples": {
                "fraction": fractions,
                "stream_read_gbs": self.gbs,
                "thread_round_trip_us": self.round_trip_us,
            },
            "how": (
                "measured: decode tok/s x bytes per token (weights and KV cache at the mean context) / the host's "
                f"streaming read bandwidth measured after each repeat ({self.threads} threads, numba prange sum "
                "over 256 MiB, best of 3); thread round trip: one empty parallel loop, measured after each repeat "
                "(on a VM it tells where the vCPUs sat: a slower round trip, slower exchanges between the threads)"
            ),
        }


def device_bandwidth(backend) -> dict[str, Any] | None:
    """The Vulkan device's streaming read bandwidth, measured (None for other backends); a probe that cannot
    run (no room for its buffer) says why instead of failing the benchmark."""
    if backend.name != "vulkan":
        return None
    from ..backends.vulkan.bandwidth import measure_stream_read  # the vulkan binding is an optional extra

    try:
        return measure_stream_read(backend).to_dict()
    except Exception as e:  # an auxiliary figure: the benchmark's own results still stand
        return {"error": f"not measured: {type(e).__name__}: {e}"}


def projection_shares(decode_ops: pd.DataFrame, bandwidth: dict[str, Any] | None) -> dict[str, Any]:
    """Bandwidth of the decode step's projections (op kinds with a matmul: the matvecs and what is fused into
    them), per kind and together, and their share of the measured streaming bandwidth where there is one."""
    w = decode_ops[decode_ops["kind"].str.contains("matmul")]
    if not len(w):
        return {}
    best = (bandwidth or {}).get("best_gbs")
    kinds = w.groupby("kind").agg(bytes=("bytes_read", "sum"), time_s=("time_s", "sum"))
    rows = []
    for kind, r in kinds.sort_values("time_s", ascending=False).iterrows():
        gbs = r["bytes"] / r["time_s"] / 1e9
        rows.append({"kind": kind, "gbps": gbs, "share": gbs / best if best else None})
    total = float(w["bytes_read"].sum() / w["time_s"].sum() / 1e9)
    return {
        "gbps": total,
        "share": total / best if best else None,
        "by_kind": rows,
        "how": "measured: bytes read (weights and activations) / time of the decode projections (profiled run)"
        + (f", over the measured streaming read bandwidth {best:.0f} GB/s" if best else ""),
    }


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_bench(cfg: BenchConfig, log=None) -> dict[str, Any]:
    """Run the benchmark of ``cfg``; write a run record; return the result (see ``workbench bench --json``)."""
    from .. import load

    cfg.validate()
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    model = load(cfg.model)
    need = cfg.depth + cfg.prompt_tokens + cfg.gen_tokens + 8
    if need > model.config.context_length:
        raise ValueError(
            f"--depth + --prompt-tokens + --gen-tokens ({cfg.depth} + {cfg.prompt_tokens} + {cfg.gen_tokens}, "
            f"+ 8 spare) exceed the context of {cfg.model} ({model.config.context_length} tokens)"
        )
    opts = dict(cfg.backend_options or {})
    if cfg.threads is not None:
        opts["threads"] = cfg.threads
    engine = Engine(model, cfg.backend, max_context=need, **opts)
    depth, prompt = depth_and_prompt(model, cfg.depth, cfg.prompt_tokens)
    theirs = None
    try:
        if cfg.vs == "llama.cpp":
            theirs = open_llama_cpp(model, engine, need + 8, cfg.threads, cfg.llama_cpp)
        dev = engine.backend.device
        log(
            f"bench: {model.name}{' (SYNTHETIC weights)' if model.synthetic else ''} on {engine.backend.name} "
            f"({dev.label()}), prompt {cfg.prompt_tokens}, gen {cfg.gen_tokens}, depth {cfg.depth}, "
            f"{cfg.warmups} warm-up + {cfg.repeats} repeats"
            + (f", alternating with {theirs.version} ({theirs.describe()['device']})" if theirs else "")
        )
        t_warm = time.perf_counter()
        for _ in range(cfg.warmups):
            time_ours(engine, prompt, cfg.gen_tokens, depth)
            if theirs:
                theirs.run(depth, prompt, cfg.gen_tokens)
        warm_s = time.perf_counter() - t_warm
        ours_runs, their_runs = [], []
        side = BandwidthSideBySide(engine, cfg) if dev.kind == "cpu" else None
        for i in range(cfg.repeats):
            ours_runs.append(time_ours(engine, prompt, cfg.gen_tokens, depth))
            if side:
                side.measure()
            if theirs:
                their_runs.append(theirs.run(depth, prompt, cfg.gen_tokens))
            r = ours_runs[-1]
            log(
                f"  repeat {i + 1}/{cfg.repeats}: prefill {cfg.prompt_tokens / r.prefill_s:8.1f} tok/s, "
                f"decode {cfg.gen_tokens / r.decode_s:7.1f} tok/s"
                + (
                    f"  | llama.cpp {cfg.prompt_tokens / their_runs[-1].prefill_s:8.1f} / "
                    f"{cfg.gen_tokens / their_runs[-1].decode_s:7.1f}"
                    if theirs
                    else ""
                )
            )
        ours = summarize(ours_runs, cfg.prompt_tokens, cfg.gen_tokens)
        ours["peak_rss_bytes"] = peak_rss_bytes()
        if side:
            ours["bandwidth_bound"] = side.summary(ours["samples"]["decode_tok_s"])
        bandwidth = device_bandwidth(engine.backend)
        if bandwidth:
            ours["device_bandwidth"] = bandwidth
        tables: dict[str, Any] = {}
        profile_info: dict[str, Any] = {}
        if cfg.profile or cfg.trace:
            prof = Profiler()
            engine.observer = prof
            prof_runs = [
                time_ours(engine, prompt, cfg.gen_tokens, depth) for _ in range(2 if cfg.repeats > 1 else 1)
            ]
            engine.observer = None
            ops, steps = prof.dataframe(), prof.step_frame()
            tables = {"ops": ops, "steps": steps}
            plain = np.median([cfg.gen_tokens / r.decode_s for r in ours_runs])
            profiled = np.median([cfg.gen_tokens / r.decode_s for r in prof_runs])
            decode_ops = ops[ops["phase"] == "decode"]
            profile_info = {
                "profiling_overhead": float(plain / profiled - 1.0),
                "steps": overhead_summary(steps),
                "decode_by_kind": by_kind(decode_ops).reset_index().to_dict("records")
                if len(decode_ops)
                else [],
                "decode_projections": projection_shares(decode_ops, bandwidth),
            }
            if cfg.trace:
                from ..instrument.trace import write_trace

                profile_info["trace"] = str(write_trace(prof, cfg.trace))
        result: dict[str, Any] = {
            "prefill_tok_s": ours["prefill_tok_s"]["median"],
            "decode_tok_s": ours["decode_tok_s"]["median"],
            "depth": cfg.depth,
            "ours": ours,
            "warmup_s": warm_s,
            "profile": profile_info,
        }
        if theirs:
            result["llama_cpp"], result["vs_llama_cpp"] = compare(
                ours, their_runs, theirs, cfg.prompt_tokens, cfg.gen_tokens
            )
        how = f"measured on {dev.label()} ({dev.kind})"
        if cfg.depth:
            how += f", at depth {cfg.depth} (that many tokens prefilled, untimed, before each timed prefill)"
        if model.synthetic:
            how += ", synthetic weights"
        record = {
            "kind": "bench",
            "how": how,
            "command": " ".join(sys.argv),
            "config": asdict(cfg),
            "model": model.describe(),
            "backend": engine.backend.name,
            "device": dev.label(),
            "environment": environment.capture(engine.backend, cfg.threads),
            "results": result,
        }
        path = write_record(record, tables)
        result["record"] = str(path)
        result["how"] = how
        result["backend"], result["device"], result["model"] = engine.backend.name, dev.label(), model.name
        result["command"], result["git"] = record["command"], record["environment"].get("git")
        return result
    finally:
        engine.close()
        if theirs:
            theirs.close()
