"""Export profiled runs as Chrome / Perfetto trace JSON: one track per device, ops as slices with args."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .profiler import Profiler


def trace_events(profiler: Profiler) -> list[dict]:
    """Trace events: a process per device, a 'steps' thread with step slices, an 'ops' thread with op slices."""
    df = profiler.dataframe()
    steps = profiler.step_frame()
    events: list[dict] = []
    pids: dict[str, int] = {}
    origin = profiler.steps[0].start_s if profiler.steps else 0.0

    def pid(device: str) -> int:
        if device not in pids:
            pids[device] = len(pids) + 1
            events.append({"ph": "M", "name": "process_name", "pid": pids[device], "args": {"name": device}})
            for tid, name in ((1, "steps"), (2, "ops (host time)")):
                events.append(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": pids[device],
                        "tid": tid,
                        "args": {"name": name},
                    }
                )
        return pids[device]

    for s, row in zip(profiler.steps, steps.itertuples(index=False)):
        events.append(
            {
                "ph": "X",
                "name": f"{s.phase} #{s.index} ({s.n_tokens} tok)",
                "cat": "step",
                "pid": pid(s.device),
                "tid": 1,
                "ts": (s.start_s - origin) * 1e6,
                "dur": s.wall_s * 1e6,
                "args": {
                    "wall_ms": s.wall_s * 1e3,
                    "ops_ms": row.ops_host_s * 1e3,
                    "overhead_ms": row.overhead_s * 1e3,
                },
            }
        )
    for r in df.itertuples(index=False):
        args = {
            "kind": r.kind,
            "layer": r.layer,
            "shapes": r.shapes,
            "weights": r.weights,
            "host_us": r.host_s * 1e6,
            "bytes": r.bytes_read + r.bytes_written,
            "flops": r.flops,
            "gbps": r.gbps,
            "gflops": r.gflops,
            "peak_frac": r.peak_frac,
        }
        if not math.isnan(r.device_s):
            args["device_us"] = r.device_s * 1e6
        events.append(
            {
                "ph": "X",
                "name": r.op,
                "cat": r.kind,
                "pid": pid(r.device),
                "tid": 2,
                "ts": r.start_s * 1e6,
                "dur": r.host_s * 1e6,
                "args": {k: _plain(v) for k, v in args.items()},
            }
        )
    return events


def _plain(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v.item() if hasattr(v, "item") else v


def write_trace(profiler: Profiler, path: str | Path) -> Path:
    """Write the trace (open it in ui.perfetto.dev or chrome://tracing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "traceEvents": trace_events(profiler),
        "displayTimeUnit": "ms",
        "otherData": {"run_id": profiler.run_id, "timing": "measured (host wall clock; device time in args)"},
    }
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)
    return path


__all__ = ["trace_events", "write_trace"]
