"""The device's streaming read bandwidth, measured: the denominator of a kernel's bandwidth share.

``measure_stream_read`` reads a buffer of ``mib`` MiB once per run with ``shaders/stream_read.comp``
(grid-stride 16-byte loads, the pattern of a well coalesced kernel) and times each run with device
timestamps. The buffer holds a known pattern and the shader sums every word it read into one arena word, so
a run that skipped words fails its check instead of reporting a bandwidth. ``role="host"`` measures
host-visible memory (where weights go when the device-local heap is full: docs/backend-vulkan.md#tunables, "Memory heaps").
The published figure of a device (:mod:`workbench.instrument.devices`) is a peak; this is what a kernel can
reach, so a share of it says how much a kernel leaves on the table (docs/backend-vulkan.md#bandwidth-probe).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .memory import Buffer
from .program import Dispatch
from .recorded import Recorded

PROBE_MIB = 512  # > 10x the L2 of the GPUs we target, so that reads come from memory
CPU_PROBE_MIB = 64  # CPU implementations (lavapipe): past the caches, without seconds of reads in tests
GROUPS = 4096  # workgroups of the grid-stride read
WARM_S = 0.2  # seconds of runs before the timed ones (clocks rise under sustained load)


@dataclass
class StreamBandwidth:
    role: str  # "device" (device-local) or "host" (host-visible)
    mib: int
    best_gbs: float
    median_gbs: float
    runs: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "mib": self.mib,
            "best_gbs": round(self.best_gbs, 1),
            "median_gbs": round(self.median_gbs, 1),
            "runs": self.runs,
            "how": f"measured: shaders/stream_read.comp reading {self.mib} MiB of {self.role} memory once a run, "
            f"device timestamps, best and median of {self.runs} runs",
        }


def probe_words(n: int) -> np.ndarray:
    """The probe buffer's contents: ``n`` uint32 words of a multiplicative hash of their index (no runs of
    equal words for a compressing memory system to exploit)."""
    return np.arange(n, dtype=np.uint32) * np.uint32(2654435761)


def measure_stream_read(
    backend, mib: int | None = None, runs: int = 9, role: str = "device"
) -> StreamBandwidth:
    """Streaming read bandwidth of ``backend``'s device (a VulkanBackend) over ``mib`` MiB of ``role`` memory
    (default PROBE_MIB, CPU_PROBE_MIB on a CPU implementation; at most the device's largest storage buffer).

    Raises RuntimeError when a run's sum differs from the buffer's (a word not read, or read wrong)."""
    f = backend.dev.features
    if mib is None:
        mib = min(CPU_PROBE_MIB if f.is_cpu else PROBE_MIB, f.max_storage_buffer_range // 2**20)
    if mib < 1 or runs < 1:
        raise ValueError(f"bandwidth probe: mib={mib} and runs={runs} must be positive")
    words = probe_words(mib * 2**18)
    want = int(words.sum(dtype=np.uint64)) % 2**32
    dev = backend.dev
    buf = Buffer(dev, words.nbytes, name=f"bandwidth probe ({role})", role=role)
    prog = None
    try:
        backend.transfers.upload(buf, words)
        d = Dispatch("bandwidth_probe", "stream_read", (), sorted(backend.tuning.spec("stream_read")),
                     {"n4": words.size // 4, "out_off": 0}, (GROUPS, 1, 1), (), ("sum",), weight=buf)  # fmt: skip
        prog = Recorded(dev, backend.pipes, [d], 4, backend.params, backend.smalls, backend.dummy, (0, 1), True,
                        np.zeros(1, np.uint32))  # fmt: skip
        backend.transfers.upload(prog.arena, np.zeros(4, np.uint32))
        zeros, done = np.zeros(1, np.int64), 0

        def run_checked() -> None:
            nonlocal done
            prog.run(zeros, zeros, zeros)
            done += 1
            got = int(prog.readback.view(np.uint32)[0])
            if got != done * want % 2**32:
                raise RuntimeError(
                    f"bandwidth probe: run {done} summed {got:#x}, expected {done * want % 2**32:#x} "
                    "(the device did not read the buffer it was given)"
                )

        end = time.monotonic() + WARM_S
        while True:
            run_checked()
            if time.monotonic() >= end:
                break
        seconds = []
        for _ in range(runs):
            run_checked()
            t = prog.step_seconds()
            if not t:
                raise RuntimeError("bandwidth probe: the device gave no timestamps for its runs")
            seconds.append(t)
        gbs = [words.nbytes / s / 1e9 for s in seconds]
        return StreamBandwidth(role, mib, float(max(gbs)), float(np.median(gbs)), runs)
    finally:
        if prog is not None:
            prog.destroy()
        buf.destroy()
