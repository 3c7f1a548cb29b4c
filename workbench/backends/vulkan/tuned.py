"""Per-shape kernel parameters found on a device by ``workbench tune`` and kept in a database.

An entry is keyed by the device's name, its driver version and an op shape (:func:`matvec_key`,
:func:`gemm_key`); its parameters replace the tunables' defaults for that shape alone. Entries of another
driver are never applied (kernels tuned on one driver can be slow or invalid on another), nor entries found
for another version of the kernel's source (an entry records :func:`~.shaders.source_hash`; entries written
before it was recorded still apply, counted as unversioned); they are counted and reported in the backend's
device details, as are entries the device cannot run. The file is JSON,
``$WORKBENCH_TUNING_DB`` or ``<cache>/tuning/vulkan.json``; writes go through a temporary file and a rename,
so an interrupted ``tune`` loses nothing already stored. See docs/backend-vulkan.md#the-autotuner.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...paths import cache_dir
from .device import DeviceFeatures
from .kernels import coop_errors
from .shaders import source_hash

FORMAT_VERSION = 1
# the parameters an entry may set, per kernel
PARAMS = {"matvec": ("wg", "row_threads", "rows"), "matmul_coop": ("wg", "wm", "tm", "tn", "bk", "ahead")}


def default_path() -> Path:
    env = os.environ.get("WORKBENCH_TUNING_DB")
    return Path(env) if env else cache_dir("tuning") / "vulkan.json"


def matvec_key(fmt: str, variant: str, rows: int, cols: int, tokens: int) -> str:
    """``matvec/Q4_K/q8+gelu_pair/21504x5376/t1``: one decode projection's shape."""
    return f"matvec/{fmt}/{variant}/{rows}x{cols}/t{tokens}"


def gemm_key(fmt: str, rows: int, cols: int) -> str:
    """``matmul_coop/Q4_K/21504x5376``: a prefill projection's shape (any prompt length)."""
    return f"matmul_coop/{fmt}/{rows}x{cols}"


def driver_of(f: DeviceFeatures) -> str:
    return str(f.driver_version)


def param_errors(kernel: str, params: dict[str, int], f: DeviceFeatures) -> list[str]:
    """Why ``params`` cannot run on device ``f`` (empty when they can)."""
    errors = [f"unknown parameter {k!r}" for k in params if k not in PARAMS.get(kernel, ())]
    if errors or kernel not in PARAMS:
        return errors or [f"unknown kernel {kernel!r}"]
    sg, wg = max(f.subgroup_size, 1), params.get("wg", 0)
    if wg < 1 or wg % sg or wg > f.max_invocations or wg > f.max_workgroup_size[0]:
        errors.append(f"wg={wg} must be a multiple of the subgroup size {sg} up to {f.max_invocations}")
    if kernel == "matvec":
        rt, rows = params.get("row_threads", 0), params.get("rows", 0)
        if rt < 1 or rt & (rt - 1) or (rt > sg and rt % sg) or (wg and wg % rt):
            errors.append(f"row_threads={rt} must be a power of two dividing wg")
        if not 1 <= rows <= 8:
            errors.append(f"rows={rows} must be 1..8")
    elif not errors:
        if params.get("ahead", 0) not in (0, 1):
            errors.append(f"ahead={params['ahead']} must be 0 or 1")
        errors += coop_errors(
            wg, params.get("wm", 0), params.get("tm", 0), params.get("tn", 0), f, params.get("bk", 32)
        )
    return errors


@dataclass
class TuningDB:
    """The entries of one database file, and what applies to one device."""

    path: Path
    entries: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path | None = None) -> TuningDB:
        path = Path(path) if path else default_path()
        if not path.exists():
            return cls(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"tuning database {path} is unreadable ({e}); move it away or fix it") from None
        if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
            raise ValueError(f"tuning database {path} is not a version-{FORMAT_VERSION} workbench database")
        entries = data.get("entries")
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise ValueError(f"tuning database {path}: 'entries' must be a list of objects")
        return cls(path, entries)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"version": FORMAT_VERSION, "entries": self.entries}, indent=1))
        tmp.replace(self.path)

    def remove(self, f: DeviceFeatures, key: str) -> None:
        """Drop the entry for ``key`` on this device and driver (a tune whose default won: an older winner,
        perhaps of another kernel version, must not stay)."""
        self.entries = [
            e
            for e in self.entries
            if not (e.get("device") == f.name and e.get("driver") == driver_of(f) and e.get("key") == key)
        ]

    def put(self, f: DeviceFeatures, key: str, params: dict[str, int], record: dict[str, Any]) -> None:
        """Store (or replace) the winner for ``key`` on this device and driver."""
        self.remove(f, key)
        entry = {"device": f.name, "driver": driver_of(f), "key": key, "params": dict(params),
                 "kernel": source_hash(key.split("/", 1)[0])}  # fmt: skip
        self.entries.append({**entry, "when": time.strftime("%Y-%m-%dT%H:%M:%S"), **record})

    def for_device(self, f: DeviceFeatures) -> AppliedTuning:
        """The entries this device can use, and counts of those it cannot (other driver, other kernel
        version, invalid)."""
        usable: dict[str, dict[str, int]] = {}
        other_driver = other_kernel = unversioned = invalid = 0
        notes: list[str] = []
        versions: dict[str, str] = {}
        for e in self.entries:
            if e.get("device") != f.name:
                continue
            if e.get("driver") != driver_of(f):
                other_driver += 1
                continue
            key, params = str(e.get("key", "")), e.get("params")
            kernel = key.split("/", 1)[0]
            errors = param_errors(kernel, params, f) if isinstance(params, dict) else ["no params"]
            if errors:
                invalid += 1
                notes.append(f"{key}: {'; '.join(errors)}")
                continue
            if "kernel" in e and e["kernel"] != versions.setdefault(kernel, source_hash(kernel)):
                other_kernel += 1
                continue
            usable[key] = {k: int(v) for k, v in params.items()}
            unversioned += "kernel" not in e
        return AppliedTuning(self.path, usable, other_driver, invalid, notes, other_kernel, unversioned)


@dataclass
class AppliedTuning:
    """Per-shape parameters in force on one device, and what was left out and why."""

    path: Path | None
    params: dict[str, dict[str, int]]
    other_driver: int = 0
    invalid: int = 0
    notes: list[str] = field(default_factory=list)
    other_kernel: int = 0  # found for another version of the kernel's source
    unversioned: int = 0  # applied, but written before entries recorded their kernel's version
    used: set[str] = field(default_factory=set)

    def get(self, key: str) -> dict[str, int] | None:
        p = self.params.get(key)
        if p is not None:
            self.used.add(key)
        return p

    def describe(self) -> dict[str, Any]:
        return {
            "db": str(self.path) if self.path else None,
            "entries": len(self.params),
            "used": len(self.used),
            "ignored_other_driver": self.other_driver,
            "ignored_other_kernel": self.other_kernel,
            "unversioned": self.unversioned,
            "ignored_invalid": self.invalid,
            **({"invalid": self.notes[:5]} if self.notes else {}),
        }
