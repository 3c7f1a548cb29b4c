"""Facts about the host machine (CPU model, cores) for device labels and run records."""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path


@functools.cache
def host_cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
