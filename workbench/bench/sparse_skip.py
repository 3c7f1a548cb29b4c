"""Decode speed of Gemma 3n's sparse layers with their skipping on and off (the dense twin), per backend.

A backend that skips the units the Gaussian top-k zeroed (the up-projection rows and down-projection
columns of a sparse layer) says so by a tunable (:data:`SKIP_TUNABLES`: the cpu backend's ``sparse_skip``,
the vulkan backend's ``ffn.sparse_skip``); off, it computes every unit, which is the same arithmetic as a
dense model of the same weights. A backend without such a tunable computes every unit always and gets one
row, saying so; one that cannot run the model gets a row with the reason. Times are measured (host wall
clock of each decode step) except the npu backend's NPU ops, which the emulator's cost model times.
"""

from __future__ import annotations

import statistics
from typing import Any

from ..backends import backend_class
from ..models.model import Model
from ..runtime.engine import Engine
from .harness import time_ours
from .prompts import bench_prompt

SKIP_TUNABLES = ("sparse_skip", "ffn.sparse_skip")


def skip_tunable(backend: str) -> str | None:
    """The tunable that switches a backend's sparse-layer skipping, or None (it has none)."""
    names = backend_class(backend).tunable_names
    return next((t for t in SKIP_TUNABLES if t in names), None)


def _how(engine: Engine) -> str:
    if engine.backend.name == "npu":
        return (
            "host wall time of the emulator and the host ops (emulated_npu_s_per_run: the AIE cost model's)"
        )
    return f"measured (host wall clock per decode step, {engine.backend.device.name})"


def decode_rows(
    model: Model,
    backend: str,
    *,
    prompt_tokens: int = 16,
    gen_tokens: int = 16,
    repeats: int = 3,
    threads: int | None = None,
) -> list[dict[str, Any]]:
    """One row per setting (skipping on, off; or the one a backend has): median decode tok/s over
    ``repeats`` runs after one warm-up, its samples, the greedy tokens, and how the time was obtained."""
    base = {"backend": backend, "model": model.name}
    try:
        name = skip_tunable(backend)
    except Exception as e:  # an unknown or unloadable backend is reported, not raised
        return [{**base, "sparse_skip": "n/a", "status": f"unavailable: {e}"}]
    settings = [("on", f"{name}=1"), ("off", f"{name}=0")] if name else [("n/a: computes every unit", None)]
    prompt = bench_prompt(model, prompt_tokens)
    rows = []
    for label, tune in settings:
        row = {**base, "sparse_skip": label, "tune": tune or ""}
        try:
            engine = Engine(model, backend, threads=threads, tune=tune)
            time_ours(engine, prompt, 2)  # warm-up: kernels compiled, programs recorded
            emulated0 = getattr(engine.backend, "emulated_s", 0.0)
            runs = [time_ours(engine, prompt, gen_tokens) for _ in range(repeats)]
            emulated = getattr(engine.backend, "emulated_s", 0.0) - emulated0
        except Exception as e:  # a backend that cannot run Gemma 3n (yet) says why
            rows.append({**row, "status": f"cannot run: {type(e).__name__}: {e}"})
            continue
        samples = [len(r.decode_latencies_s) / sum(r.decode_latencies_s) for r in runs]
        rows.append(
            {
                **row,
                "status": "ok",
                "device": engine.backend.device.name,
                "decode_tok_s": statistics.median(samples),
                "samples": samples,
                "how": _how(engine),
            }
        )
        if engine.backend.name == "npu":  # the NPU ops' time by the cost model, prefills included
            rows[-1]["emulated_npu_s_per_run"] = emulated / repeats
        engine.backend.close()
    return rows


__all__ = ["SKIP_TUNABLES", "decode_rows", "skip_tunable"]
