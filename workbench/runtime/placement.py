"""Placement: each op of a step assigned to a device (``cpu``, ``vulkan`` = the iGPU, ``npu``), with explicit
transfers where a tensor crosses devices, and the step's timeline, tokens/s and J/token.

Named strategies (:data:`STRATEGIES`) come from the design notes this project grew from. The NPU takes
only the op kinds its schedules cover (:data:`workbench.backends.npu.NPU_KINDS`); other ops of an NPU
segment go to the iGPU, and every crossing is a transfer: zero-copy (a cache flush and a queue sync) on
unified-memory laptops, a copy over PCIe where the devices have separate memory. Where prefill and decode
run attention on different devices, each layer's KV cache moves once after prefill (also a transfer).

How each time is obtained, and said in every result: NPU ops ``emulated`` (AIE cost model); iGPU ops
``projected`` (roofline of the device profile with the efficiency factors of
:mod:`~workbench.runtime.placement_platforms`) unless a real backend ran them; ``cpu`` ops ``measured``
when run here, else ``projected``; transfers ``modeled`` (and ``measured`` host copies in
:func:`run_placed`).

This module gathers the public names of the modules that do the work, one job each:

- :mod:`~workbench.runtime.placement_platforms`: platforms, the projections' figures, the strategies as data
- :mod:`~workbench.runtime.placement_rules`: op -> device (:func:`assign`: named strategies, ``custom:`` rules)
- :mod:`~workbench.runtime.placement_times`: seconds of one op on a device, of one transfer
- :mod:`~workbench.runtime.placement_projection`: the projection of a step (:func:`project`, :func:`sweep`)
- :mod:`~workbench.runtime.placement_backend`: the backend running each op on its device (:class:`PlacedBackend`)
- :mod:`~workbench.runtime.placement_run`: a placement run here by the engine (:func:`run_placed`)
"""

from __future__ import annotations

from .placement_backend import PlacedBackend, PlacedStep
from .placement_platforms import (
    BW_EFFICIENCY,
    DISPATCH_S,
    FLOP_EFFICIENCY,
    KV_BYTES,
    PCIE_BW,
    PCIE_LATENCY_S,
    PLATFORMS,
    SPARSE_KINDS,
    SPARSE_ROUND,
    STRATEGIES,
    STRATEGY_SPLITS,
    SYNC_S,
    Platform,
    Split,
    get_platform,
)
from .placement_projection import (
    PhaseResult,
    device_power,
    handoff_tasks,
    kv_handoffs,
    project,
    step_tasks,
    sweep,
)
from .placement_rules import assign
from .placement_run import IGPU_MODES, MeasuredSteps, run_placed
from .placement_times import (
    kept_units,
    npu_schedule,
    op_seconds,
    roofline_seconds,
    sparse_op_seconds,
    transfer_seconds,
)

__all__ = [
    "BW_EFFICIENCY",
    "DISPATCH_S",
    "FLOP_EFFICIENCY",
    "IGPU_MODES",
    "KV_BYTES",
    "PCIE_BW",
    "PCIE_LATENCY_S",
    "PLATFORMS",
    "SPARSE_KINDS",
    "SPARSE_ROUND",
    "STRATEGIES",
    "STRATEGY_SPLITS",
    "SYNC_S",
    "MeasuredSteps",
    "PhaseResult",
    "PlacedBackend",
    "PlacedStep",
    "Platform",
    "Split",
    "assign",
    "device_power",
    "get_platform",
    "handoff_tasks",
    "kept_units",
    "kv_handoffs",
    "npu_schedule",
    "op_seconds",
    "project",
    "roofline_seconds",
    "run_placed",
    "sparse_op_seconds",
    "step_tasks",
    "sweep",
    "transfer_seconds",
]
