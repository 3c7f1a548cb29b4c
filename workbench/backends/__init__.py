"""Backend registry: names -> backend classes, loaded on demand, and the ``auto`` choice."""

from __future__ import annotations

import importlib
import sys
from typing import Any

from ..models.model import Model
from .base import Backend, BackendUnavailableError, DeviceInfo, SeqSlice, Step, UnsupportedOpError

# name -> "module:Class"; a backend module may raise BackendUnavailableError when its device is absent.
REGISTRY: dict[str, str] = {
    "numpy": "workbench.backends.numpy_ref:NumpyBackend",
    "cpu": "workbench.backends.numba_cpu:CpuBackend",
    "vulkan": "workbench.backends.vulkan:VulkanBackend",
    "npu": "workbench.backends.npu:NpuBackend",
}
ALL_NAMES = ("numpy", "cpu", "vulkan", "npu")
AUTO_ORDER = ("vulkan", "cpu", "numpy")


def backend_class(name: str) -> type[Backend]:
    if name not in REGISTRY:
        known = ", ".join([*REGISTRY, "auto"])
        raise BackendUnavailableError(f"unknown or unavailable backend {name!r} (available: {known})")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)


def auto_candidates() -> list[str]:
    return [n for n in AUTO_ORDER if n in REGISTRY]


def probe_backends() -> list[dict[str, Any]]:
    """For every backend name: whether it can run here, why not, and the devices it detects."""
    rows = []
    for name in ALL_NAMES:
        if name not in REGISTRY:
            rows.append(
                {"backend": name, "available": False, "reason": "not part of this build yet", "devices": []}
            )
            continue
        try:
            rows.append({"backend": name, **backend_class(name).probe()})
        except (BackendUnavailableError, ImportError, OSError) as e:
            rows.append({"backend": name, "available": False, "reason": str(e), "devices": []})
    return rows


def make_backend(name: str, model: Model, **options: Any) -> Backend:
    """Create backend ``name`` for ``model``. ``auto`` takes the fastest that works here, and says which.

    ``options`` (threads, tune, ...) go to the backend; with ``auto`` to each candidate tried.
    """
    if name != "auto":
        return backend_class(name)(model, **options)
    errors = []
    for cand in auto_candidates():
        try:
            why_not = backend_class(cand).auto_rejection(**options)
            if why_not:
                errors.append(f"{cand}: {why_not}")
                continue
            backend = backend_class(cand)(model, **options)
        except (BackendUnavailableError, UnsupportedOpError) as e:  # not here, or not for this model's ops
            errors.append(f"{cand}: {e}")
            continue
        if errors:
            print(f"workbench: backend auto -> {cand} ({'; '.join(errors)})", file=sys.stderr)
        return backend
    raise BackendUnavailableError("no backend available: " + "; ".join(errors))


__all__ = [
    "ALL_NAMES",
    "REGISTRY",
    "Backend",
    "BackendUnavailableError",
    "DeviceInfo",
    "SeqSlice",
    "Step",
    "UnsupportedOpError",
    "backend_class",
    "make_backend",
    "probe_backends",
]
