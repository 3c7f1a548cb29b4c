"""Facts about the host machine (CPU model, family, instruction sets, cores) for device labels and run records."""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import Any

# Instruction-set extensions a run record names when the CPU has them (Linux /proc/cpuinfo flag names): the
# ones our kernels or BLAS choose code by.
ISA_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512dq", "avx512cd", "avx512bw",
    "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx512ifma", "avx512vbmi", "avx512_vbmi2",
    "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp", "asimdhp", "sve", "sve2", "i8mm", "bf16",
)  # fmt: skip
CPUINFO_KEYS = {
    "vendor_id": "vendor",
    "cpu family": "family",
    "model": "model",
    "stepping": "stepping",
    "microcode": "microcode",
    "CPU implementer": "implementer",
    "CPU architecture": "architecture",
    "CPU variant": "variant",
    "CPU part": "part",
    "CPU revision": "revision",
}


def parse_cpuinfo(text: str) -> dict[str, str]:
    """The key/value lines of the first processor block of a /proc/cpuinfo text."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if out:
                break
            continue
        if ":" in line:
            k, v = line.split(":", 1)
            out.setdefault(k.strip(), v.strip())
    return out


def _cpuinfo() -> dict[str, str]:
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return {}


@functools.cache
def host_cpu_name() -> str:
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_info(raw: dict[str, str]) -> dict[str, Any]:
    """Vendor, family/model/stepping (or the ARM implementer and part) and the instruction-set extensions of
    :data:`ISA_FLAGS` that ``raw`` (:func:`parse_cpuinfo`) names."""
    info: dict[str, Any] = {}
    for key, name in CPUINFO_KEYS.items():
        if key in raw:
            info[name] = int(raw[key]) if raw[key].isdigit() else raw[key]
    flags = set((raw.get("flags") or raw.get("Features") or "").split())
    info["isa"] = [f for f in ISA_FLAGS if f in flags]
    return info


@functools.cache
def host_cpu_info() -> dict[str, Any]:
    """This host's CPU as a run record names it: model name, machine, :func:`cpu_info`, and LLVM's name for
    its microarchitecture (what numba compiles for)."""
    info: dict[str, Any] = {
        "model_name": host_cpu_name(),
        "machine": platform.machine(),
        **cpu_info(_cpuinfo()),
    }
    try:
        from llvmlite import binding

        info["llvm_cpu"] = binding.get_host_cpu_name()
    except Exception:  # llvmlite missing or unable to tell
        pass
    return info


def host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
