"""The placed backend: a backend that runs each op of a step on its placed device, using what runs here,
through the shared op loop (:meth:`~workbench.backends.base.Backend.run_ops`).

- ``npu`` ops: the npu backend's kernel (:meth:`~workbench.backends.npu.NpuBackend.op_kernel`) on the AIE
  emulator: values with NPU numerics, ``emulated`` times
- ``vulkan`` (iGPU) ops: values by the numpy reference, times ``projected`` for the platform's iGPU
  (roofline, :func:`~workbench.runtime.placement_times.roofline_seconds`)
- ``cpu`` ops: the numpy reference, ``measured`` host time

An input a device reads from another is copied on the host (``measured``) before its op runs; after a
prefill step, each layer's KV cache that decode reads on another device is copied too. Each step is kept
in :attr:`PlacedBackend.steps` with its timeline on the platform, transfers ``modeled``
(:mod:`workbench.runtime.placement_projection`). The engine drives it like any backend.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..backends import Backend, DeviceInfo, Step, make_backend
from ..backends.base import OpObserver
from ..models.model import Model
from ..ops.graph import STEP_INPUTS, Graph, Op
from .placement_platforms import Platform
from .placement_projection import PhaseResult, device_power, handoff_tasks, kv_handoffs, step_tasks
from .placement_rules import assign
from .placement_times import roofline_seconds
from .timeline import schedule

Kernel = Callable[[Backend, Op, dict, Step], float | None]


@dataclass
class PlacedStep:
    """One step a placement ran: its timeline (:class:`PhaseResult`) and the host copies measured for it,
    ``(tensor, destination device) -> seconds``."""

    result: PhaseResult
    host_copies: dict[tuple[str, str], float] = field(default_factory=dict)

    def summary(self) -> dict:
        out = self.result.summary()
        out["measured_host_copies"] = {
            "count": len(self.host_copies),
            "seconds": float(sum(self.host_copies.values())),
        }
        return out


class PlacedBackend(Backend):
    """Each op on the device ``strategy`` places it on (see the module docstring), timed for ``platform``."""

    name = "placed"

    def __init__(
        self,
        model: Model,
        strategy: str,
        platform: Platform,
        npu_dtype: str = "bf16",
        first_n: int | None = None,
    ):
        super().__init__(model)
        self.strategy = strategy
        self.platform = platform
        self.first_n = first_n
        self.npu = make_backend("npu", model, tune=f"dtype={npu_dtype}")
        self.power = device_power(platform)
        self.steps: list[PlacedStep] = []

    @property
    def device(self) -> DeviceInfo:
        return DeviceInfo(
            "placed",
            f"{self.strategy} placement timed for {self.platform.name}",
            "emulator",
            {
                "strategy": self.strategy,
                "platform": self.platform.name,
                "npu": self.npu.device.label(),
                "timing": "NPU ops emulated; iGPU ops projected (values by numpy on this host); CPU ops and "
                "host copies measured; transfers modeled",
            },
        )

    def new_cache(self, max_len: int, slack: int = 0):
        return self.npu.new_cache(max_len, slack)

    def close(self) -> None:
        self.npu.close()

    def run(self, graph: Graph, step: Step, observer: OpObserver | None = None) -> np.ndarray:
        """Run the step with each op on its device; the step's timeline is appended to :attr:`steps`."""
        self.check_tokens(step)
        assignment = assign(graph, self.strategy, step.phase, self.first_n)
        route = StepRoute(self, graph, assignment)
        logits = self.run_ops(graph, step, route.kernel_for, observer)
        tasks = step_tasks(graph, assignment, lambda op, dev: route.timed[op.name], self.platform)
        if step.phase == "prefill":
            moves = kv_handoffs(graph, self.strategy, self.first_n)
            for op, _, dst, _ in moves:  # the host copy of each moved layer cache, measured
                for s in step.seqs:
                    layer = s.cache.layers[op.layer]
                    t0 = time.perf_counter()
                    layer.keys, layer.values = layer.keys.copy(), layer.values.copy()
                    route.copies[(f"kv_cache.{op.layer}", dst)] = time.perf_counter() - t0
            tasks += handoff_tasks(moves, tasks, self.platform)
        result = PhaseResult(self.strategy, step.phase, step.n_tokens, schedule(tasks), tasks, self.power)
        self.steps.append(PlacedStep(result, route.copies))
        return logits


class StepRoute:
    """One step's routing: where each tensor is, the host copies made, and each op's (seconds, how)."""

    def __init__(self, backend: PlacedBackend, graph: Graph, assignment: dict[str, str]):
        self.backend = backend
        self.graph = graph
        self.assignment = assignment
        self.where = {t: "cpu" for t in STEP_INPUTS}
        self.copies: dict[tuple[str, str], float] = {}
        self.timed: dict[str, tuple[float, str]] = {}

    def kernel_for(self, op: Op) -> Kernel | None:
        """The kernel of ``op`` on its placed device, for :meth:`Backend.run_ops`: it copies the inputs that
        are on another device, runs the op and returns its seconds there (None: no kernel for the kind)."""
        from ..backends.numpy_ref import KERNELS

        dev = self.assignment[op.name]
        npu = self.backend.npu
        prof = None if dev in ("npu", "cpu") else self.backend.platform.profile(dev)
        if dev == "npu":
            inner, how = npu.op_kernel(op), f"emulated (AIE cost model, {npu.array.key})"
        else:
            host = KERNELS.get(op.kind)
            inner = None if host is None else lambda _, o, env, step: host(npu.host, o, env, step)
            how = (
                "measured (numpy reference, this host)"
                if prof is None
                else f"projected (roofline, {prof.key}); values by numpy on this host"
            )
        if inner is None:
            return None

        def kernel(_: Backend, o: Op, env: dict, step: Step) -> float:
            self.move_inputs(o, dev, env)
            t0 = time.perf_counter()
            seconds = inner(npu, o, env, step)
            if dev == "cpu":
                seconds = time.perf_counter() - t0
            elif prof is not None:
                seconds = roofline_seconds(o, self.graph, step.positions, prof)
            for t in o.outputs:
                self.where[t] = dev
            self.timed[o.name] = (seconds, how)
            return seconds

        return kernel

    def move_inputs(self, op: Op, dev: str, env: dict) -> None:
        """Copy each input of ``op`` that is on another device than ``dev`` (a host copy, measured)."""
        for t in op.inputs:
            if self.where[t] != dev:
                t0 = time.perf_counter()
                env[t] = np.array(env[t], copy=True)
                self.copies[(t, dev)] = time.perf_counter() - t0
                self.where[t] = dev
