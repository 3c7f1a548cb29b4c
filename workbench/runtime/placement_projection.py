"""The projection of a placement: given a model's graph, a platform and a split, each op's device and
seconds, the transfers at device boundaries, the step's timeline, tokens/s and J/token. Nothing runs.

Every crossing is a transfer (step inputs start on the host CPU); where prefill and decode run attention
on different devices, each layer's KV cache moves once after prefill. Op and transfer times:
:mod:`workbench.runtime.placement_times`; the timeline: :mod:`workbench.runtime.timeline`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..models.architectures import build_graph
from ..models.config import ModelConfig
from ..ops.graph import STEP_INPUTS, Graph, Op, WeightSpec
from .placement_platforms import KV_BYTES, STRATEGIES, Platform, get_platform
from .placement_rules import DEVICES, assign
from .placement_times import kept_units, npu_launch_seconds, op_seconds, sparse_op_seconds, transfer_seconds
from .timeline import Task, Timeline, schedule


def step_tasks(
    graph: Graph,
    assignment: dict[str, str],
    op_time: Callable[[Op, str], tuple[float, str]],
    platform: Platform,
) -> list[Task]:
    """The step as tasks in program order: each op, preceded by a transfer for every input it reads from
    another device (step inputs start on the host CPU). Deps link each task to its producers."""
    tasks: list[Task] = []
    where: dict[str, tuple[str, int | None]] = {t: ("cpu", None) for t in STEP_INPUTS}
    for op in graph.ops:
        dev = assignment[op.name]
        deps = []
        for t in op.inputs:
            src, producer = where[t]
            pdeps = () if producer is None else (producer,)
            if src != dev:
                nbytes = graph.tensors[t].nbytes if t in graph.tensors else 4 * graph.n_tokens
                sec, how = transfer_seconds(nbytes, src, dev, platform)
                tasks.append(Task(f"xfer:{t}:{src}->{dev}", "link", sec, how, pdeps, "transfer", nbytes))
                where[t] = (dev, len(tasks) - 1)
                pdeps = (len(tasks) - 1,)
            deps.extend(pdeps)
        sec, how = op_time(op, dev)
        tasks.append(Task(op.name, dev, sec, how, tuple(deps)))
        for t in op.outputs:
            where[t] = (dev, len(tasks) - 1)
    return tasks


def kv_handoffs(graph: Graph, strategy: str, first_n: int | None) -> list[tuple[Op, str, str, int]]:
    """``(attention op, from, to, bytes)`` for each layer's KV cache that a prefill step writes on one device
    and decode reads on another (``npu-prefill-igpu-decode``); sliding-window layers move only their window."""
    here = assign(graph, strategy, "prefill", first_n)
    there = assign(graph, strategy, "decode", first_n)
    out = []
    for op in graph.ops:
        if op.kind == "attention" and here[op.name] != there[op.name]:
            a = op.attrs
            keys = min(graph.n_tokens, a.get("window", 0) or graph.n_tokens)
            out.append(
                (op, here[op.name], there[op.name], 2 * keys * a["n_kv_heads"] * a["head_dim"] * KV_BYTES)
            )
    return out


def handoff_tasks(
    handoffs: list[tuple[Op, str, str, int]], tasks: list[Task], platform: Platform
) -> list[Task]:
    """The KV-cache moves of :func:`kv_handoffs` as explicit transfers after the attention op that wrote them."""
    index = {t.name: i for i, t in enumerate(tasks)}
    out = []
    for op, src, dst, nbytes in handoffs:
        sec, how = transfer_seconds(nbytes, src, dst, platform)
        out.append(Task(f"xfer:kv_cache.{op.layer}:{src}->{dst}", "link", sec, how, (index[op.name],), "transfer",
                        nbytes))  # fmt: skip
    return out


def device_power(platform: Platform) -> dict[str, float | None]:
    """Active watts of each device of ``platform`` (None: its profile has no figure); the link counts 0:
    transfer energy is in the devices' busy time of their sync work, not counted twice."""
    power = {d: platform.profile(d).power_w for d in DEVICES}
    power["link"] = 0.0
    return power


@dataclass
class PhaseResult:
    """One placed step (or ``tokens`` of interleaved steps): its tasks, timeline and the devices' power."""

    strategy: str
    phase: str
    tokens: int
    timeline: Timeline
    tasks: list[Task]
    power_w: dict[str, float | None]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.timeline.makespan_s if self.timeline.makespan_s > 0 else float("nan")

    @property
    def j_per_token(self) -> float | None:
        e = self.timeline.energy_j(self.power_w)
        return None if e is None else e / self.tokens

    @property
    def energy_how(self) -> str:
        """How J/token is obtained: busy seconds x each busy device's active power (from its profile)."""
        watts = ", ".join(
            f"{d} {'no figure' if self.power_w.get(d) is None else f'{self.power_w[d]:g} W'}"
            for d, s in self.timeline.busy.items()
            if s > 0 and d != "link"
        )
        return f"projected (busy time x active power of the device profiles: {watts})"

    def summary(self) -> dict:
        by_dev: dict[str, int] = {}
        for t in self.tasks:
            if t.kind == "op":
                by_dev[t.device] = by_dev.get(t.device, 0) + 1
        xfers = [t for t in self.tasks if t.kind == "transfer"]
        how = sorted({f"{t.device}: {t.how}" for t in self.tasks})
        return {
            "strategy": self.strategy,
            "phase": self.phase,
            "tokens": self.tokens,
            "tokens_per_s": self.tokens_per_s,
            "j_per_token": self.j_per_token,
            "step_s": self.timeline.makespan_s,
            "busy_s": dict(self.timeline.busy),
            "ops_by_device": by_dev,
            "transfers": len(xfers),
            "transfer_bytes": sum(t.nbytes for t in xfers),
            "how": how,
            "energy_how": self.energy_how,
        }


def project(
    config: ModelConfig,
    weights: dict[str, WeightSpec],
    strategy: str,
    phase: str = "decode",
    *,
    platform: str | Platform = "phoenix",
    context: int = 512,
    prompt_tokens: int = 512,
    sequences: int = 1,
    npu_dtype: str = "int8",
    first_n: int | None = None,
    npu_launch: str = "op",
    sparse_skip: bool = False,
) -> PhaseResult:
    """Tokens/s and J/token of one phase of ``strategy`` on ``platform``, from the cost models alone.

    Decode: one token per sequence at ``context`` tokens of history; prefill: a ``prompt_tokens`` prompt.
    ``sequences`` independent sequences are interleaved (their tokens add up; devices overlap).
    ``npu_launch``: ``op`` (one XRT launch per NPU op, as the npu backend runs) or ``segment`` (consecutive
    NPU ops share one launch, as a runlist of fused designs would). ``sparse_skip``: decode steps of a model
    with sparse layers (Gemma 3n) read only the up-projection rows and down-projection columns of the units
    the Gaussian top-k keeps (:func:`~workbench.runtime.placement_times.sparse_op_seconds`, projected on
    every device).
    """
    if npu_launch not in ("op", "segment"):
        raise ValueError(f"npu_launch must be op or segment, got {npu_launch!r}")
    plat = platform if isinstance(platform, Platform) else get_platform(platform)
    dt = {"int8": "i8", "bf16": "bf16", "i8": "i8"}[npu_dtype]
    if phase == "decode":
        t, positions = 1, np.array([max(0, min(context, config.context_length) - 1)])
    elif phase == "prefill":
        t = max(1, min(prompt_tokens, config.context_length))
        positions = np.arange(t)
    else:
        raise ValueError(f"phase must be prefill or decode, got {phase!r}")
    graph = build_graph(config, weights, t, 1)
    assignment = assign(graph, strategy, phase, first_n)
    prev = {b.name: a for a, b in zip(graph.ops, graph.ops[1:])}

    def op_time(op: Op, dev: str) -> tuple[float, str]:
        kept = kept_units(op, graph) if sparse_skip and phase == "decode" else None
        if kept is not None:
            sec, how = sparse_op_seconds(op, graph, positions, dev, plat, dt, kept)
        else:
            sec, how = op_seconds(op, graph, positions, dev, plat, dt)
        before = prev.get(op.name)
        if (
            dev == "npu"
            and npu_launch == "segment"
            and before is not None
            and assignment[before.name] == "npu"
        ):
            return sec - npu_launch_seconds(plat), how + "; launch shared with its NPU segment"
        return sec, how

    tasks = step_tasks(graph, assignment, op_time, plat)
    if phase == "prefill":
        tasks += handoff_tasks(kv_handoffs(graph, strategy, first_n), tasks, plat)
    return PhaseResult(strategy, phase, t * sequences, schedule(tasks, sequences), tasks, device_power(plat))


def sweep(
    models: tuple[str, ...] = ("gemma3-270m", "gemma3-27b"),
    strategies: tuple[str, ...] = tuple(s for s in STRATEGIES if s != "all-cpu"),
    *,
    platform: str = "phoenix",
    quant: str = "q4_k_m",
    context: int = 512,
    prompt_tokens: int = 512,
    sequences: int = 2,
    npu_dtype: str = "int8",
    first_n: int | None = None,
    npu_launch: str = "op",
    progress: bool = False,
    sparse_skip: bool = False,
) -> list[dict]:
    """One row per (model, strategy): decode and prefill tokens/s and J/token (config only, no weights)."""
    from tqdm import tqdm

    from ..instrument.roofline import weight_specs_for
    from ..models.config import preset

    rows = []
    jobs = [(m, s) for m in models for s in strategies]
    for model, strat in tqdm(jobs, desc="placement sweep", disable=not progress):
        cfg = preset(model)
        specs = weight_specs_for(cfg, quant)
        kw = dict(
            platform=platform,
            context=context,
            prompt_tokens=prompt_tokens,
            npu_dtype=npu_dtype,
            first_n=first_n,
            npu_launch=npu_launch,
        )
        dec = project(cfg, specs, strat, "decode", sparse_skip=sparse_skip, **kw)
        dec_n = project(cfg, specs, strat, "decode", sequences=sequences, sparse_skip=sparse_skip, **kw)
        pre = project(cfg, specs, strat, "prefill", **kw)
        rows.append(
            {
                "model": model,
                "strategy": strat,
                "platform": platform,
                "npu_dtype": npu_dtype,
                "npu_launch": npu_launch,
                "sparse_skip": sparse_skip,
                "decode_tok_s": dec.tokens_per_s,
                "decode_j_per_token": dec.j_per_token,
                f"decode_tok_s_{sequences}seq": dec_n.tokens_per_s,
                "prefill_tok_s": pre.tokens_per_s,
                "prefill_j_per_token": pre.j_per_token,
                "decode_ops_by_device": dec.summary()["ops_by_device"],
                "decode_transfers": dec.summary()["transfers"],
                "how": sorted(set(dec.summary()["how"]) | set(pre.summary()["how"])),
                "energy_how": dec.energy_how,
            }
        )
    return rows
