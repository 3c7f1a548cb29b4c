"""Placement: each op of a step assigned to a device (``cpu``, ``vulkan`` = the iGPU, ``npu``), with explicit
transfers where a tensor crosses devices, and the step's timeline, tokens/s and J/token.

Named strategies (:data:`STRATEGIES`) come from the design notes this project grew from. The NPU takes
only the op kinds its schedules cover (:data:`workbench.backends.npu.NPU_KINDS`); other ops of an NPU
segment go to the iGPU, and every crossing is a transfer: zero-copy (a cache flush and a queue sync) on
unified-memory laptops, a copy over PCIe where the devices have separate memory. Where prefill and decode
run attention on different devices, each layer's KV cache moves once after prefill (also a transfer).

How each time is obtained, and said in every result: NPU ops ``emulated`` (AIE cost model); iGPU ops
``projected`` (roofline of the device profile with the efficiency factors below) unless a real backend ran
them; ``cpu`` ops ``measured`` when run here, else ``projected``; transfers ``modeled`` (and ``measured``
host copies in :func:`run_placed`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..instrument.devices import DeviceProfile, get_profile
from ..models.architectures import build_graph
from ..models.config import ModelConfig
from ..ops.graph import STEP_INPUTS, Graph, Op, WeightSpec
from ..ops.kinds import distinct_keys, op_cost
from .placement_rules import DEVICES, assign_rules, block_of, is_custom
from .timeline import Task, Timeline, schedule

# roofline efficiency of projected GPU/CPU ops: the share of peak bandwidth and FLOP/s a projection assumes,
# and the cost of one dispatch of a recorded command buffer (sources and figures: docs/architecture.md#projections)
BW_EFFICIENCY = 0.85
FLOP_EFFICIENCY = 0.5
DISPATCH_S = 5e-6
# transfers: zero-copy on unified memory costs a cache flush at memory bandwidth plus a queue sync;
# separate memory copies over PCIe 4.0 x16 (~25 GB/s achieved) with ~10 us latency
SYNC_S = 10e-6
PCIE_BW, PCIE_LATENCY_S = 25e9, 10e-6
# bytes per cached K or V value when the cache moves between devices (fp16/bf16 caches)
KV_BYTES = 2

STRATEGIES = {
    "all-igpu": "every op on the iGPU",
    "npu-attention": "attention blocks on the NPU (the kinds it covers), FFN blocks and the rest on the iGPU",
    "npu-ffn": "FFN blocks on the NPU (the kinds it covers), attention blocks and the rest on the iGPU",
    "npu-first-N-layers": "layers 0..N-1 on the NPU (the kinds it covers), the rest on the iGPU (N: first_n)",
    "npu-prefill-igpu-decode": "prefill steps on the NPU (the kinds it covers), decode steps on the iGPU "
    "(AMD's hybrid flow)",
    "all-cpu": "every op on the host CPU (the baseline this machine can measure)",
}


@dataclass(frozen=True)
class Platform:
    """The machine a placement is projected for: the device profile behind each device name."""

    name: str
    profiles: dict[str, str]

    def profile(self, device: str) -> DeviceProfile:
        return get_profile(self.profiles[device])

    def unified(self, a: str, b: str) -> bool:
        return self.profile(a).unified_memory and self.profile(b).unified_memory


PLATFORMS = {
    "phoenix": Platform("phoenix", {"cpu": "host", "vulkan": "780m", "npu": "npu1"}),
    "hawkpoint": Platform("hawkpoint", {"cpu": "host", "vulkan": "780m", "npu": "hawkpoint"}),
    "strix": Platform("strix", {"cpu": "host", "vulkan": "890m", "npu": "npu2"}),
    "h100+npu1": Platform("h100+npu1", {"cpu": "host", "vulkan": "h100", "npu": "npu1"}),
}


def get_platform(name: str) -> Platform:
    try:
        return PLATFORMS[name]
    except KeyError:
        raise ValueError(f"unknown platform {name!r} (known: {', '.join(PLATFORMS)})") from None


def assign(graph: Graph, strategy: str, phase: str = "decode", first_n: int | None = None) -> dict[str, str]:
    """Op name -> device for ``strategy``: a name of :data:`STRATEGIES` or ``custom:`` rules
    (:mod:`workbench.runtime.placement_rules`); ``phase`` is prefill or decode."""
    from ..backends.npu import NPU_KINDS

    if is_custom(strategy):
        return assign_rules(graph, strategy, phase, NPU_KINDS)
    if strategy not in STRATEGIES:
        raise ValueError(
            f"unknown placement strategy {strategy!r} (known: {', '.join(STRATEGIES)}, or custom:RULES)"
        )
    n = graph.config.n_layers // 2 if first_n is None else first_n
    if not 0 <= n <= graph.config.n_layers:
        raise ValueError(f"first_n must be in 0..{graph.config.n_layers}, got {first_n}")
    wants_npu: Callable[[Op], bool] = {
        "all-igpu": lambda op: False,
        "all-cpu": lambda op: False,
        "npu-attention": lambda op: block_of(op) == "attn",
        "npu-ffn": lambda op: block_of(op) == "ffn",
        "npu-first-N-layers": lambda op: op.layer is not None and op.layer < n,
        "npu-prefill-igpu-decode": lambda op: phase == "prefill",
    }[strategy]
    other = "cpu" if strategy == "all-cpu" else "vulkan"
    return {op.name: "npu" if wants_npu(op) and op.kind in NPU_KINDS else other for op in graph.ops}


# -- time of one op or transfer on a device --------------------------------------------------------------
def npu_schedule(op: Op, graph: Graph, positions: np.ndarray, array, dtype: str):
    """The NPU schedule of ``op`` in ``graph``: the design the npu backend runs for it (shapes padded to the
    built designs, :mod:`workbench.backends.npu.designs`)."""
    from ..backends.npu import designs

    x = graph.tensors[op.inputs[0]].shape
    if op.kind == "matmul":
        n_out = sum(graph.weights[w].shape[0] for w in op.weights)
        return designs.matmul_design(array, x[0], n_out, x[1], dtype)
    if op.kind == "rmsnorm":
        length = op.attr("group") or x[-1]
        return designs.rmsnorm_design(array, x[0], int(np.prod(x)) // x[0] // length, length)
    if op.kind == "attention":
        a = op.attrs
        window = a.get("window", 0)
        keys = distinct_keys(positions, window)
        return designs.attention_design(array, len(positions), keys, a["n_heads"], a["n_kv_heads"],
                                        a["head_dim"], window)  # fmt: skip
    raise ValueError(f"op kind {op.kind!r} has no NPU schedule")


def roofline_seconds(op: Op, graph: Graph, positions: np.ndarray, profile: DeviceProfile) -> float:
    """Projected seconds of ``op`` on a GPU/CPU profile: the slower of memory and compute, plus a dispatch."""
    c = op_cost(op, graph, positions)
    dtype = "fp16" if profile.kind == "gpu" else "fp32"
    return (
        max(c.bytes / (profile.mem_bw * BW_EFFICIENCY), c.flops / (profile.peak(dtype) * FLOP_EFFICIENCY))
        + DISPATCH_S
    )


def op_seconds(
    op: Op, graph: Graph, positions: np.ndarray, device: str, platform: Platform, npu_dtype: str = "i8"
) -> tuple[float, str]:
    """(seconds, how) of ``op`` on ``device`` of ``platform``: emulated for the NPU, projected otherwise."""
    if device == "npu":
        from ..backends.npu.arch import get_array
        from ..backends.npu.cost import estimate

        array = get_array(platform.profiles["npu"])
        est = estimate(npu_schedule(op, graph, positions, array, npu_dtype), array)
        return est.seconds, est.how
    prof = platform.profile(device)
    return roofline_seconds(op, graph, positions, prof), f"projected (roofline, {prof.key})"


SPARSE_KINDS = ("ffn_up", "ffn_down")  # the projections a sparse layer's skipping reads only in part
SPARSE_ROUND = 64  # kept units rounded up to this, a shape NPU designs take


def kept_units(op: Op, graph: Graph) -> int | None:
    """Units a decode step's skipping keeps in ``op`` (a sparse layer's up or down projection): the FFN
    width times 1 - the layer's sparsity, rounded up to :data:`SPARSE_ROUND`; None for any other op."""
    c = graph.config
    if op.layer is None or op.name.rsplit(".", 1)[-1] not in SPARSE_KINDS or not c.activation_sparsity:
        return None
    s = c.activation_sparsity[op.layer]
    if s <= 0:
        return None
    return min(c.ffn, -(-int(np.ceil(c.ffn * (1 - s))) // SPARSE_ROUND) * SPARSE_ROUND)


def sparse_op_seconds(
    op: Op, graph: Graph, positions: np.ndarray, device: str, platform: Platform, npu_dtype: str, kept: int
) -> tuple[float, str]:
    """(seconds, how) of a sparse layer's up/down projection reading only the ``kept`` units (decode):
    on the NPU the design of the kept rows (up) or columns (down), on a GPU/CPU the dense time scaled by
    the share kept. Projections of a kernel that gathers the kept units; no such design or kernel was run."""
    ffn = graph.config.ffn
    note = f"; sparse skip projected: {kept} of {ffn} units"
    if device == "npu":
        from ..backends.npu import designs
        from ..backends.npu.arch import get_array
        from ..backends.npu.cost import estimate

        array = get_array(platform.profiles["npu"])
        x = graph.tensors[op.inputs[0]].shape
        n_out = sum(graph.weights[w].shape[0] for w in op.weights)
        up = op.name.endswith("ffn_up")
        sched = designs.matmul_design(array, x[0], kept if up else n_out, x[1] if up else kept, npu_dtype)
        est = estimate(sched, array)
        return est.seconds, est.how + note
    sec, how = op_seconds(op, graph, positions, device, platform, npu_dtype)
    return DISPATCH_S + (sec - DISPATCH_S) * kept / ffn, how + note


def transfer_seconds(nbytes: int, src: str, dst: str, platform: Platform) -> tuple[float, str]:
    """Modeled seconds of moving a tensor from ``src`` to ``dst``: zero-copy sync or a PCIe copy."""
    if platform.unified(src, dst):
        bw = min(platform.profile(src).mem_bw, platform.profile(dst).mem_bw)
        return SYNC_S + nbytes / bw, "modeled (zero-copy: cache flush + queue sync)"
    return PCIE_LATENCY_S + nbytes / PCIE_BW, "modeled (copy over PCIe)"


# -- placed steps ----------------------------------------------------------------------------------------
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


@dataclass
class PhaseResult:
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
    the Gaussian top-k keeps (:func:`sparse_op_seconds`, projected on every device).
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
            from ..backends.npu.arch import get_array

            return sec - get_array(
                plat.profiles["npu"]
            ).launch_s, how + "; launch shared with its NPU segment"
        return sec, how

    tasks = step_tasks(graph, assignment, op_time, plat)
    if phase == "prefill":
        tasks += handoff_tasks(kv_handoffs(graph, strategy, first_n), tasks, plat)
    power = {d: plat.profile(d).power_w for d in DEVICES}
    power["link"] = 0.0  # transfer energy is in the devices' busy time of their sync work: not counted twice
    return PhaseResult(strategy, phase, t * sequences, schedule(tasks, sequences), tasks, power)


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


# -- running a placement with real backends --------------------------------------------------------------
IGPU_MODES = ("projected", "vulkan")


def run_placed(
    model,
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
        from ..backends import make_backend

        backend = make_backend("cpu" if strategy == "all-cpu" else "vulkan", model)
        return _run_on_backend(model, backend, strategy, prompt_ids, decode_tokens, platform)
    return _run_mixed(model, strategy, prompt_ids, decode_tokens, plat, npu_dtype, first_n)


def _run_mixed(model, strategy, prompt_ids, decode_tokens, plat: Platform, npu_dtype, first_n) -> dict:
    """:func:`run_placed` op by op: NPU ops on the emulator, other ops by numpy with projected times."""
    from ..backends import Step
    from ..backends.npu import NpuBackend

    npu = NpuBackend(model, tune=f"dtype={npu_dtype}")
    cache = npu.new_cache(len(prompt_ids) + decode_tokens + 1)
    ids, out_ids, phases = list(prompt_ids), [], []
    tokens = ids
    power = {d: plat.profile(d).power_w for d in DEVICES} | {"link": 0.0}
    for step_i in range(decode_tokens + 1):
        phase = "prefill" if step_i == 0 else "decode"
        graph = model.graph(len(tokens), 1)
        step = Step.single(cache, tokens, cache.length, "last", phase, step_i)
        assignment = assign(graph, strategy, phase, first_n)
        env = {"tokens": step.tokens, "positions": step.positions, "logit_rows": step.logit_rows}
        timed: dict[str, tuple[float, str]] = {}
        copies: dict[tuple[str, str], float] = {}
        where = {t: "cpu" for t in STEP_INPUTS}
        for op in graph.ops:
            dev = assignment[op.name]
            for t in op.inputs:
                if where[t] != dev:
                    t0 = time.perf_counter()
                    env[t] = np.array(env[t], copy=True)
                    copies[(t, dev)] = time.perf_counter() - t0
                    where[t] = dev
            if dev == "npu":
                timed[op.name] = (
                    npu._kernel_for(op)(npu, op, env, step),
                    f"emulated (AIE cost model, {npu.array.key})",
                )
            elif dev == "cpu":
                t0 = time.perf_counter()
                _host_kernel(npu, op, env, step)
                timed[op.name] = (time.perf_counter() - t0, "measured (numpy reference, this host)")
            else:
                _host_kernel(npu, op, env, step)
                prof = plat.profile(dev)
                timed[op.name] = (roofline_seconds(op, graph, step.positions, prof),
                                  f"projected (roofline, {prof.key}); values by numpy on this host")  # fmt: skip
            for t in op.outputs:
                where[t] = dev
        for s in step.seqs:
            s.cache.length = int(step.positions[s.stop - 1]) + 1
        tasks = step_tasks(graph, assignment, lambda op, dev, timed=timed: timed[op.name], plat)
        if phase == "prefill":
            moves = kv_handoffs(graph, strategy, first_n)
            for op, _, dst, _ in moves:  # the host copy of each moved layer cache, measured
                layer = cache.layers[op.layer]
                t0 = time.perf_counter()
                layer.keys, layer.values = layer.keys.copy(), layer.values.copy()
                copies[(f"kv_cache.{op.layer}", dst)] = time.perf_counter() - t0
            tasks += handoff_tasks(moves, tasks, plat)
        res = PhaseResult(strategy, phase, len(tokens), schedule(tasks), tasks, power).summary()
        res["measured_host_copies"] = {"count": len(copies), "seconds": sum(copies.values())}
        phases.append(res)
        nxt = int(np.argmax(env[graph.outputs[0]][-1]))
        out_ids.append(nxt)
        tokens = [nxt]
    return {
        "strategy": strategy,
        "platform": plat.name,
        "input_ids": ids,
        "output_ids": out_ids,
        "steps": phases,
    }


class _OpTimes:
    """Observer keeping each op's seconds: the device's own clock where the backend has one, else host time."""

    def __init__(self):
        self.rows: list[tuple[Op, float, bool]] = []

    def on_op(self, op: Op, step, start_s: float, host_s: float, device_s: float | None = None) -> None:
        self.rows.append((op, host_s if device_s is None else device_s, device_s is not None))

    def on_step(self, step, graph, backend, start_s: float, wall_s: float) -> None:
        pass


def _run_on_backend(model, backend, strategy, prompt_ids, decode_tokens, platform) -> dict:
    """:func:`run_placed` for a single-device placement that a real backend here runs whole (measured)."""
    from ..backends import Step

    info = backend.device
    device = "cpu" if strategy == "all-cpu" else "vulkan"
    prof = info.details.get("profile", "host" if backend.name == "cpu" else "unknown")
    try:
        power = {device: get_profile(prof).power_w}  # None where the profile has no power figure (host)
    except ValueError:
        power = {device: None}
    cache = backend.new_cache(len(prompt_ids) + decode_tokens + 1)
    ids, out_ids, phases = list(prompt_ids), [], []
    tokens = ids
    for step_i in range(decode_tokens + 1):
        phase = "prefill" if step_i == 0 else "decode"
        step = Step.single(cache, tokens, cache.length, "last", phase, step_i)
        graph = backend.prepare_graph(model.graph(len(tokens), 1))
        times = _OpTimes()
        logits = backend.run(graph, step, times)
        tasks = [
            Task(op.name, device, sec,
                 f"measured ({backend.name} backend on {info.name}, this host; "
                 + ("device timestamps)" if clocked else "host wall time)"),
                 (i - 1,) if i else ())
            for i, (op, sec, clocked) in enumerate(times.rows)
        ]  # fmt: skip
        res = PhaseResult(strategy, phase, len(tokens), schedule(tasks), tasks, power).summary()
        res["measured_host_copies"] = {"count": 0, "seconds": 0.0}
        phases.append(res)
        nxt = int(np.argmax(logits[-1]))
        out_ids.append(nxt)
        tokens = [nxt]
    return {
        "strategy": strategy,
        "platform": f"this host ({info.name}), not {platform}",
        "input_ids": ids,
        "output_ids": out_ids,
        "steps": phases,
    }


def _host_kernel(npu, op: Op, env: dict, step) -> None:
    """Run ``op`` with the numpy reference (values for ops placed on a device that cannot run here)."""
    from ..backends.numpy_ref import KERNELS

    KERNELS[op.kind](npu.host, op, env, step)
