"""Running a placement here: the engine generates greedily on the backend that runs it, and each step's
timeline says how each time was obtained.

A mixed placement runs on :class:`~workbench.runtime.placement_backend.PlacedBackend` (NPU ops emulated,
iGPU ops projected with numpy values, CPU ops measured, transfers modeled and host copies measured). A
single-device placement that a real backend here runs whole (``all-cpu`` on the cpu backend, ``all-igpu``
on the vulkan backend) is measured op by op through an observer (:class:`MeasuredSteps`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..backends import Backend, Step, make_backend
from ..instrument.devices import get_profile
from ..models.model import Model
from ..ops.graph import Graph, Op
from .engine import Engine
from .placement_backend import PlacedBackend, PlacedStep
from .placement_platforms import get_platform
from .placement_projection import PhaseResult
from .timeline import Task, schedule

IGPU_MODES = ("projected", "vulkan")


def run_placed(
    model: Model,
    strategy: str,
    prompt_ids: list[int],
    decode_tokens: int = 4,
    *,
    platform: str = "phoenix",
    npu_dtype: str = "bf16",
    first_n: int | None = None,
    igpu: str = "projected",
) -> dict:
    """Generate greedily with each op on its placed device, using what runs here, and time each op.

    - ``npu`` ops: the AIE emulator (values with NPU numerics, ``emulated`` times)
    - ``vulkan`` ops with ``igpu="projected"``: values by the numpy reference, times ``projected`` for the
      platform's iGPU (roofline). ``igpu="vulkan"`` runs an ``all-igpu`` placement on the vulkan backend
      here instead (``measured`` on whatever Vulkan device this host has); the backend runs whole step
      programs, so mixed placements cannot hand it single ops and are refused with that reason
    - ``all-cpu``: the cpu backend runs every step (``measured`` on this host)

    Transfers at device boundaries are real host copies (``measured``) and ``modeled`` for ``platform``.
    Returns tokens and per-step timelines, each time labeled with how it was obtained."""
    if igpu not in IGPU_MODES:
        raise ValueError(f"igpu must be one of {', '.join(IGPU_MODES)}, got {igpu!r}")
    if igpu == "vulkan" and strategy != "all-igpu":
        raise ValueError(
            f"igpu='vulkan' runs only the all-igpu placement here (the vulkan backend runs whole step "
            f"programs, so {strategy!r} cannot hand it single ops); use igpu='projected'"
        )
    plat = get_platform(platform)
    if strategy == "all-cpu" or igpu == "vulkan":
        backend = make_backend("cpu" if strategy == "all-cpu" else "vulkan", model)
        measured = MeasuredSteps(backend, strategy)
        out_ids = generate_greedy(model, backend, prompt_ids, decode_tokens, measured)
        steps, where = measured.steps, f"this host ({measured.info.name}), not {platform}"
    else:
        placed = PlacedBackend(model, strategy, plat, npu_dtype, first_n)
        out_ids = generate_greedy(model, placed, prompt_ids, decode_tokens)
        steps, where = placed.steps, plat.name
    return {
        "strategy": strategy,
        "platform": where,
        "input_ids": list(prompt_ids),
        "output_ids": out_ids,
        "steps": [s.summary() for s in steps],
    }


def generate_greedy(
    model: Model, backend: Backend, prompt_ids: Sequence[int], decode_tokens: int, observer=None
) -> list[int]:
    """The engine's greedy tokens after ``prompt_ids``: one prefill step of the whole prompt, then
    ``decode_tokens`` decode steps (no stop tokens); the backend is closed after."""
    n = len(prompt_ids)
    engine = Engine(
        model, backend, max_context=n + decode_tokens + 1, prefill_chunk=max(1, n), observer=observer
    )
    try:
        return engine.generate(list(prompt_ids), decode_tokens + 1, stop_ids=()).output_ids
    finally:
        engine.close()


class MeasuredSteps:
    """Observer of a real backend running a single-device placement whole: each step as a
    :class:`~workbench.runtime.placement_backend.PlacedStep` of measured op times (the device's own clock
    where the backend has one, else host time), kept in :attr:`steps`."""

    def __init__(self, backend: Backend, strategy: str):
        self.strategy = strategy
        self.backend_name = backend.name
        self.info = backend.device
        self.device = "cpu" if strategy == "all-cpu" else "vulkan"
        prof = self.info.details.get("profile", "host" if backend.name == "cpu" else "unknown")
        try:
            self.power = {
                self.device: get_profile(prof).power_w
            }  # None where the profile has no figure (host)
        except ValueError:
            self.power = {self.device: None}
        self.rows: list[tuple[Op, float, bool]] = []
        self.steps: list[PlacedStep] = []

    def on_op(self, op: Op, step: Step, start_s: float, host_s: float, device_s: float | None = None) -> None:
        self.rows.append((op, host_s if device_s is None else device_s, device_s is not None))

    def on_step(self, step: Step, graph: Graph, backend: Backend, start_s: float, wall_s: float) -> None:
        where = f"measured ({self.backend_name} backend on {self.info.name}, this host; "
        tasks = [
            Task(op.name, self.device, sec, where + ("device timestamps)" if clocked else "host wall time)"),
                 (i - 1,) if i else ())
            for i, (op, sec, clocked) in enumerate(self.rows)
        ]  # fmt: skip
        result = PhaseResult(self.strategy, step.phase, step.n_tokens, schedule(tasks), tasks, self.power)
        self.steps.append(PlacedStep(result))
        self.rows = []
