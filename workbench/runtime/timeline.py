"""Per-device timelines of placed steps: when each op and transfer runs, with overlap across sequences.

Tasks run in program order on their device (one queue per device, transfers on their own ``link``
queue); a task starts when its device is free and its inputs are ready. With several independent
sequences interleaved op by op, one device works on sequence j while another works on sequence j+1,
which is where an NPU + iGPU split can gain. Energy is each device's busy time times its active power.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Task:
    """One op or transfer of a step: ``deps`` are indices of earlier tasks of the same sequence."""

    name: str
    device: str
    seconds: float
    how: str
    deps: tuple[int, ...] = ()
    kind: str = "op"  # op | transfer
    nbytes: int = 0


@dataclass
class Timeline:
    """Scheduled tasks: ``(sequence, task, start_s, end_s)`` rows, busy time per device, the makespan."""

    rows: list[tuple[int, Task, float, float]] = field(default_factory=list)
    busy: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    makespan_s: float = 0.0

    def energy_j(self, power_w: dict[str, float | None]) -> float | None:
        """Active energy: busy seconds x active power of each device (None if a busy device has no figure)."""
        total = 0.0
        for dev, s in self.busy.items():
            if s <= 0:
                continue
            p = power_w.get(dev)
            if p is None:
                return None
            total += s * p
        return total

    def to_records(self) -> list[dict]:
        return [
            {
                "sequence": j,
                "task": t.name,
                "device": t.device,
                "kind": t.kind,
                "start_s": a,
                "end_s": b,
                "how": t.how,
            }
            for j, t, a, b in self.rows
        ]


def schedule(tasks: list[Task], sequences: int = 1) -> Timeline:
    """Run ``sequences`` independent copies of ``tasks`` interleaved task by task (see the module docstring)."""
    if sequences < 1:
        raise ValueError(f"sequences must be >= 1, got {sequences}")
    tl = Timeline()
    free: dict[str, float] = defaultdict(float)
    done = [[0.0] * len(tasks) for _ in range(sequences)]
    for i, task in enumerate(tasks):
        for j in range(sequences):
            ready = max((done[j][d] for d in task.deps), default=0.0)
            start = max(ready, free[task.device])
            end = start + task.seconds
            free[task.device] = end
            done[j][i] = end
            tl.busy[task.device] += task.seconds
            tl.rows.append((j, task, start, end))
            tl.makespan_s = max(tl.makespan_s, end)
    return tl
