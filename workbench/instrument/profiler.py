"""Per-op profiling: one row per op execution, with time, bytes, FLOPs and the fraction of the device's peak.

Recording is cheap (a tuple per op); costs and derived columns are computed when the rows are read.
Each step also records its wall time, so per-op times can be checked against it and the remainder shown
as explicit ``overhead``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..backends.base import Backend, Step
from ..ops.graph import Graph, Op
from ..ops.kinds import op_cost
from .devices import DeviceProfile, profile_or_unknown


@dataclass
class StepRecord:
    """One executed step: its shape, where it ran, when, and its host wall time."""

    index: int
    phase: str
    n_tokens: int
    positions: np.ndarray
    graph: Graph
    backend: str
    device: str
    profile_key: str
    start_s: float
    wall_s: float
    ops: list[tuple[Op, float, float, float | None]] = field(default_factory=list)


class Profiler:
    """Collects op rows from a backend run (pass it as the engine's ``observer``)."""

    def __init__(self, run_id: str | None = None, profiles: dict[str, DeviceProfile] | None = None):
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.steps: list[StepRecord] = []
        self._pending: list[tuple[Op, float, float, float | None]] = []
        self._profiles = dict(profiles or {})

    # -- observer protocol -----------------------------------------------------------------------
    def on_op(self, op: Op, step: Step, start_s: float, host_s: float, device_s: float | None = None) -> None:
        self._pending.append((op, start_s, host_s, device_s))

    def on_step(self, step: Step, graph: Graph, backend: Backend, start_s: float, wall_s: float) -> None:
        dev = backend.device
        self.steps.append(
            StepRecord(
                step.index,
                step.phase,
                step.n_tokens,
                step.positions.copy(),
                graph,
                backend.name,
                dev.label(),
                dev.details.get("profile", "host"),
                start_s,
                wall_s,
                self._pending,
            )
        )
        self._pending = []

    def clear(self) -> None:
        self.steps.clear()
        self._pending = []

    # -- rows ------------------------------------------------------------------------------------
    def profile(self, key: str) -> DeviceProfile:
        if key not in self._profiles:
            self._profiles[key] = profile_or_unknown(key)
        return self._profiles[key]

    def dataframe(self) -> pd.DataFrame:
        """One row per op execution (see the module docstring for the columns)."""
        rows: list[dict[str, Any]] = []
        t_origin = self.steps[0].start_s if self.steps else 0.0
        for s in self.steps:
            prof = self.profile(s.profile_key)
            g = s.graph
            for op, start, host_s, dev_s in s.ops:
                cost = op_cost(op, g, s.positions)
                t = dev_s if dev_s is not None else host_s
                wtypes = sorted({g.weights[w].type for w in op.weights})
                dtype = op.attrs.get("dtype", "fp32")
                gbps = cost.bytes / t / 1e9 if t > 0 else np.nan
                gflops = cost.flops / t / 1e9 if t > 0 else np.nan
                bw_frac = gbps * 1e9 / prof.mem_bw
                fl_frac = gflops * 1e9 / prof.peak(dtype)
                rows.append(
                    {
                        "run_id": self.run_id,
                        "phase": s.phase,
                        "step": s.index,
                        "op": op.name,
                        "kind": op.kind,
                        "layer": -1 if op.layer is None else op.layer,
                        "backend": s.backend,
                        "device": op.attrs.get("device", s.device),  # backends that place ops say where
                        "n_tokens": s.n_tokens,
                        "shapes": " ".join(
                            f"{n}{list(g.tensors[n].shape)}" for n in op.inputs if n in g.tensors
                        )
                        + " -> "
                        + " ".join(f"{list(g.tensors[n].shape)}" for n in op.outputs),
                        "weights": ",".join(wtypes),
                        "dtype": dtype,
                        "start_s": start - t_origin,
                        "host_s": host_s,
                        "device_s": np.nan if dev_s is None else dev_s,
                        "time_s": t,
                        "timing": op.attrs.get("timing") or ("device" if dev_s is not None else "host"),
                        "bytes_read": cost.bytes_read,
                        "bytes_written": cost.bytes_written,
                        "flops": cost.flops,
                        "gbps": gbps,
                        "gflops": gflops,
                        "bw_frac": bw_frac,
                        "flops_frac": fl_frac,
                        "peak_frac": max(bw_frac, fl_frac),
                    }
                )
        return pd.DataFrame(rows)

    def step_frame(self) -> pd.DataFrame:
        """One row per step: wall time, the sum of its op times, and the overhead between them."""
        rows = []
        for s in self.steps:
            host = sum(h for _, _, h, _ in s.ops)
            dev = [d for _, _, _, d in s.ops if d is not None]
            rows.append(
                {
                    "run_id": self.run_id,
                    "phase": s.phase,
                    "step": s.index,
                    "n_tokens": s.n_tokens,
                    "backend": s.backend,
                    "device": s.device,
                    "wall_s": s.wall_s,
                    "ops_host_s": host,
                    "ops_device_s": sum(dev) if dev else np.nan,
                    "n_ops": len(s.ops),
                    "overhead_s": s.wall_s - host,
                    "ops_share": host / s.wall_s if s.wall_s > 0 else np.nan,
                }
            )
        return pd.DataFrame(rows)


# -- the usual views -----------------------------------------------------------------------------
def _grouped(df: pd.DataFrame, by: str | list[str]) -> pd.DataFrame:
    if df.empty:
        return df
    g = df.groupby(by, sort=False).agg(
        calls=("op", "size"),
        time_s=("time_s", "sum"),
        bytes=("bytes_read", "sum"),
        bytes_written=("bytes_written", "sum"),
        flops=("flops", "sum"),
    )
    g["bytes"] += g.pop("bytes_written")
    g["share"] = g["time_s"] / g["time_s"].sum()
    g["gbps"] = g["bytes"] / g["time_s"] / 1e9
    g["gflops"] = g["flops"] / g["time_s"] / 1e9
    return g.sort_values("time_s", ascending=False)


def by_kind(df: pd.DataFrame) -> pd.DataFrame:
    """Time, bytes and FLOPs per op kind, largest first."""
    return _grouped(df, "kind")


def by_layer(df: pd.DataFrame) -> pd.DataFrame:
    """Per layer (-1: embedding and head); keeps layer order."""
    return _grouped(df, "layer").sort_index()


def by_device(df: pd.DataFrame) -> pd.DataFrame:
    return _grouped(df, "device")


def by_placement(df: pd.DataFrame) -> pd.DataFrame:
    """Per op kind, device and timing (``emulated`` / ``measured``): for backends that place ops on several."""
    return _grouped(df, ["kind", "device", "timing"])


def by_op(df: pd.DataFrame) -> pd.DataFrame:
    return _grouped(df, ["op", "kind"])


def top(df: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The ``n`` slowest individual op executions."""
    cols = ["phase", "step", "op", "kind", "shapes", "weights", "time_s", "gbps", "gflops", "peak_frac"]
    return df.nlargest(n, "time_s")[cols]


def overhead_summary(steps: pd.DataFrame) -> dict[str, float]:
    """Medians per phase of wall time, op time and overhead share (the 'per-op times add up' check)."""
    out: dict[str, float] = {}
    for phase, g in steps.groupby("phase"):
        out[f"{phase}_wall_ms"] = float(g["wall_s"].median() * 1e3)
        out[f"{phase}_ops_ms"] = float(g["ops_host_s"].median() * 1e3)
        out[f"{phase}_overhead_share"] = float((g["overhead_s"] / g["wall_s"]).median())
    return out
