"""The ``npu`` backend: the ops the NPU schedules cover run on the AIE emulator or on an NPU through XRT,
the rest on the host.

Covered kinds (:data:`NPU_KINDS`): ``matmul`` (GEMV for one row, GEMM for more; bf16 or int8 weights),
``rmsnorm`` (rows and per-head groups) and ``attention`` (over the KV cache). Each op's schedule comes from
:mod:`workbench.backends.npu.designs` (shapes padded to the designs that are built) in both modes. Every
other op runs on the numpy reference backend, and so does an NPU kind whose shape no design covers (the
planners raise :class:`~workbench.backends.npu.schedule.ScheduleError`, e.g. a row shorter than the
kernel's lanes in a tiny model): ``device.details["host_fallbacks"]`` names each such op shape and why.
Each op says where it ran: ``op.attrs["device"]`` /
``["timing"]`` in the graph this backend runs (the profiler's ``device`` and ``timing`` columns), and
``device.details``.

- ``mode=emulator`` (default; no NPU needed): the AIE emulator runs each schedule; times ``emulated``.
- ``mode=xrt``: each schedule's design, built by ``mlir/build.py`` (``--tune designs=DIR``, default
  ``mlir/build``), runs on the NPU through pyxrt (:mod:`workbench.backends.npu.xrt_ops`); times
  ``measured (npu, XRT)``. It needs an NPU, pyxrt and the built designs, and says which are missing (the
  designs with the exact build command) before running a step. It has not run on an NPU yet: none was
  available where it was written; its host side is tested against a stand-in for pyxrt.

Host op times are measured host wall time. Designs, the cost model and its published figures:
docs/backend-npu.md.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ...models.model import Model
from ...ops import reference as ref
from ...ops.graph import Graph, Op
from ...runtime.kv_cache import KVCache
from ..base import Backend, BackendUnavailableError, DeviceInfo, OpObserver, Step
from ..numpy_ref import KERNELS as HOST_KERNELS
from ..numpy_ref import NumpyBackend
from . import designs, xrt
from .arch import NPU_DEVICES, get_array
from .cost import estimate
from .emulator import kernels as emu
from .emulator.numerics import F32, quantize_rows_i8, srs_shift, to_bf16
from .schedule import Schedule, ScheduleError, matmul_schedule
from .xrt_ops import TIMING as XRT_TIMING
from .xrt_ops import XrtOps

NPU_KINDS = ("matmul", "rmsnorm", "attention")
DTYPES = {"bf16": "bf16", "int8": "i8"}


class NpuBackend(Backend):
    """NPU ops on the AIE emulator (npu1, hawkpoint or npu2) or through XRT, other ops on the host numpy
    reference."""

    name = "npu"
    tunable_names = ("device", "dtype", "mode", "designs")

    @classmethod
    def auto_rejection(cls, **options: Any) -> str | None:
        """The emulator is a research tool, never a fast default (and `auto` does not list it)."""
        return "an NPU emulator is never a fast default"

    def __init__(
        self,
        model: Model,
        threads: int | None = None,
        tune: str | None = None,
        device: str = "npu1",
        dtype: str = "bf16",
        mode: str = "emulator",
        designs_root: str | None = None,
    ):
        super().__init__(model, threads, tune)
        device, dtype, mode = (
            self.tunable("device", device),
            self.tunable("dtype", dtype),
            self.tunable("mode", mode),
        )
        root = self.tunable("designs", designs_root or str(designs.DEFAULT_ROOT))
        if dtype not in DTYPES:
            raise ValueError(f"npu backend: dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        if device not in NPU_DEVICES:
            raise ValueError(f"npu backend: device must be one of {', '.join(NPU_DEVICES)}, got {device!r}")
        if mode not in ("emulator", "xrt"):
            raise ValueError(f"npu backend: mode must be emulator or xrt, got {mode!r}")
        self.detection = xrt.detect()
        if mode == "xrt" and not self.detection.can_run:
            raise BackendUnavailableError(f"npu backend (mode=xrt): {self.detection.reason()}")
        self.mode = mode
        self.xrt_ops = XrtOps(root, self._build_command) if mode == "xrt" else None
        self._step_shape: tuple[list[int], int] = ([], 0)  # prefill rows and most keys of the checked step
        self.array = get_array(device)
        self.dtype = DTYPES[dtype]
        self.dtype_name = dtype
        self.host = NumpyBackend(model, threads)
        self._w: dict[str, Any] = {}
        self._norm_w: dict[str, np.ndarray] = {}
        self._graphs: dict[tuple, Graph] = {}
        self.emulated_s = 0.0
        self.npu_launches = 0
        self.host_fallbacks: dict[str, str] = {}  # "kind shape" -> why no design covers it
        host_kinds = sorted(set(model.graph(1).kinds()) - set(NPU_KINDS))
        where = (
            f"NPU through XRT ({self.array.name} designs from {root})"
            if self.xrt_ops
            else f"AIE emulator of {self.array.name}; no NPU execution"
            + (f" ({self.detection.reason()})" if self.detection.reason() else "")
        )
        print(
            f"workbench: npu backend -> {where} ({dtype}). On the {'NPU' if self.xrt_ops else 'emulator'}: "
            f"{', '.join(NPU_KINDS)}; on the host (numpy reference): {', '.join(host_kinds)}",
            file=sys.stderr,
        )

    @property
    def device(self) -> DeviceInfo:
        details = {
            "profile": self.array.key,
            "mode": self.mode,
            "dtype": self.dtype_name,
            "npu_ops": list(NPU_KINDS),
            "host_ops": "every other kind, on the numpy reference backend (float32)",
            "npu_launches": self.npu_launches,
            "host_fallbacks": dict(self.host_fallbacks),
            "xrt": self.detection.to_dict(),
        }
        if self.xrt_ops:
            details.update(timing=f"NPU ops {XRT_TIMING}; host ops measured (host wall time)",
                           measured_npu_s=self.xrt_ops.measured_s, designs=str(self.xrt_ops.root),
                           designs_loaded=sorted(self.xrt_ops.kernels))  # fmt: skip
            return DeviceInfo("npu", f"NPU ({self.array.name} designs) through XRT", "npu", details)
        details.update(timing="NPU ops emulated (AIE cost model); host ops measured (host wall time)",
                       emulated_npu_s=self.emulated_s)  # fmt: skip
        return DeviceInfo("npu", f"AIE emulator of {self.array.name}", "emulator", details)

    @classmethod
    def probe(cls) -> dict[str, Any]:
        det = xrt.detect()
        devices = [
            {"name": f"AIE emulator of {get_array(k).name}", "kind": "emulator", "timing": "emulated"}
            for k in NPU_DEVICES
        ]
        if det.npu_present:
            devices.insert(0, {"name": "NPU", "kind": "npu", **det.to_dict()})
        reason = "" if det.can_run else f"emulator only: {det.reason()}"
        return {"available": True, "devices": devices, "reason": reason}

    def supports(self, op: Op) -> bool:
        return op.kind in NPU_KINDS

    def new_cache(self, max_len: int, slack: int = 0) -> KVCache:
        return KVCache(self.model.config, max_len, slack)

    def prepare_graph(self, graph: Graph) -> Graph:
        """The graph with each op labeled with where it runs and how its time is obtained."""
        if "npu-placement" in graph.rewrites:
            return graph
        key = (graph.n_tokens, graph.n_logits, graph.rewrites)
        g = self._graphs.get(key)
        if g is None:
            npu = {
                "device": f"npu:{self.mode}({self.array.key})",
                "timing": XRT_TIMING if self.xrt_ops else "emulated",
                "dtype": self.dtype_name,
            }
            host = {"device": "numpy:host", "timing": "measured (host)", "dtype": "fp32"}
            ops = []
            for o in graph.ops:
                why = self._no_design(o, graph) if self.supports(o) else None
                where = npu if self.supports(o) and why is None else host
                if why is not None:
                    where = {**host, "npu_fallback": why}
                ops.append(Op(o.name, o.kind, o.inputs, o.outputs, o.weights, {**o.attrs, **where}, o.layer))
            g = Graph(graph.config, graph.n_tokens, graph.n_logits, ops, graph.tensors, graph.weights, graph.outputs,
                      (*graph.rewrites, "npu-placement"))  # fmt: skip
            self._graphs[key] = g
        return g

    def _no_design(self, op: Op, graph: Graph) -> str | None:
        """Why no design covers this NPU op at the graph's shapes (None: one does). Attention is checked at
        the step's own key count; longer histories are checked again when they come."""
        try:
            if op.kind == "matmul":
                shape = graph.tensors[op.inputs[0]].shape
                self._matmul_schedule(op, shape[0], shape[1])
            elif op.kind == "rmsnorm":
                self._rmsnorm_schedule(op, graph.tensors[op.inputs[0]].shape)
            elif op.kind == "attention":
                self._attention_schedule(op, graph.n_tokens, graph.n_tokens)
        except ScheduleError as e:
            return self._fallback(op, graph.tensors[op.inputs[0]].shape, e)
        return None

    def _fallback(self, op: Op, shape: tuple[int, ...], error: ScheduleError) -> str:
        weight = f" ({op.weights[0].split('.')[-2]})" if op.weights else ""  # per weight kind, not per layer
        key = f"{op.kind} {'x'.join(map(str, shape))}{weight}"
        self.host_fallbacks.setdefault(key, f"no NPU design: {error}; ran on the host (numpy reference)")
        return self.host_fallbacks[key]

    # -- weights in NPU formats ------------------------------------------------------------------------------
    def _matmul_weight(self, name: str):
        w = self._w.get(name)
        if w is None:
            full = (
                self.model.weights[name].dequantize().astype(F32).reshape(self.model.weights[name].rows, -1)
            )
            if self.dtype == "bf16":
                w = to_bf16(full)
            else:
                q, scale = quantize_rows_i8(full)
                w = (q.astype(F32), scale, srs_shift(q))
            self._w[name] = w
        return w

    def _norm_weight(self, name: str) -> np.ndarray:
        w = self._norm_w.get(name)
        if w is None:
            w = self._norm_w[name] = to_bf16(self.model.weights[name].dequantize().astype(F32).reshape(-1))
        return w

    # -- schedules: the same in both modes (designs.py pads shapes to the built designs) -----------------------
    def _matmul_schedule(self, op: Op, rows: int, k_in: int) -> Schedule:
        return designs.matmul_design(
            self.array, rows, self.model.weights[op.weights[0]].rows, k_in, self.dtype
        )

    def _rmsnorm_schedule(self, op: Op, shape: tuple[int, ...]) -> Schedule:
        length = op.attr("group") or shape[-1]
        size = int(np.prod(shape))
        return designs.rmsnorm_design(self.array, shape[0], size // shape[0] // length, length)

    def _attention_schedule(self, op: Op, tokens: int, keys: int) -> Schedule:
        a = op.attrs
        return designs.attention_design(
            self.array, tokens, keys, a["n_heads"], a["n_kv_heads"], a["head_dim"], a.get("window", 0)
        )

    def step_schedules(self, graph: Graph, step: Step) -> list[Schedule]:
        """The schedules of every NPU op of ``graph`` run on ``step`` (attention's keys from each sequence's
        start position and the layer's window, as the KV cache will hand them over)."""
        out = []
        for op in self.prepare_graph(graph).ops:
            if "npu_fallback" in op.attrs:
                continue
            if op.kind == "matmul":
                shape = graph.tensors[op.inputs[0]].shape
                out.append(self._matmul_schedule(op, shape[0], shape[1]))
            elif op.kind == "rmsnorm":
                out.append(self._rmsnorm_schedule(op, graph.tensors[op.inputs[0]].shape))
            elif op.kind == "attention":
                window = op.attrs.get("window", 0)
                for s in step.seqs:
                    first, tokens = int(step.positions[s.start]), s.stop - s.start
                    held = min(first, window - 1) if window else first
                    try:
                        out.append(self._attention_schedule(op, tokens, held + tokens))
                    except ScheduleError:
                        continue  # runs on the host (see _attention)
        return out

    def _build_command(self) -> str:
        prompt_rows, keys = self._step_shape
        return designs.build_command(
            self.model.source, self.array.key, self.dtype_name, prompt_rows, keys, self.xrt_ops.root
        )

    def _check_designs(self, graph: Graph, step: Step) -> None:
        """Raise :class:`~workbench.backends.npu.designs.MissingDesignsError` (every missing design of this
        step, and the build command for every design a run to the caches' capacity needs) before running."""
        tokens = [s.stop - s.start for s in step.seqs]
        self._step_shape = ([t for t in tokens if t > 1], max(s.cache.max_len for s in step.seqs))
        missing = self.xrt_ops.missing(self.step_schedules(graph, step))
        if missing:
            raise designs.MissingDesignsError(missing, self._build_command())

    # -- op kernels: the emulator or the design through XRT ---------------------------------------------------
    def _charge(self, schedule: Schedule) -> float:
        s = estimate(schedule, self.array).seconds
        self.emulated_s += s
        self.npu_launches += 1
        return s

    def _matmul(self, op: Op, env: dict, step: Step) -> float:
        x = env[op.inputs[0]]
        w = self._matmul_weight(op.weights[0])
        sched = self._matmul_schedule(op, x.shape[0], x.shape[1])
        if self.xrt_ops:
            env[op.outputs[0]], seconds = self.xrt_ops.matmul(sched, x, op.weights[0], w)
            self.npu_launches += 1
            return seconds
        if self.dtype == "bf16":
            env[op.outputs[0]] = emu.matmul_bf16(sched, self.array, x, w)
        else:
            env[op.outputs[0]] = emu.matmul_i8(sched, self.array, x, *w)
        return self._charge(sched)

    def _rmsnorm(self, op: Op, env: dict, step: Step) -> float:
        x = env[op.inputs[0]]
        sched = self._rmsnorm_schedule(op, x.shape)
        w = self._norm_weight(op.weights[0])
        if self.xrt_ops:
            env[op.outputs[0]], seconds = self.xrt_ops.rmsnorm(sched, x, w)
            self.npu_launches += 1
            return seconds
        env[op.outputs[0]] = emu.rmsnorm(sched, self.array, x, w, op.attrs["eps"], op.attr("group"))
        return self._charge(sched)

    def _attention(self, op: Op, env: dict, step: Step) -> float:
        a = op.attrs
        q, k, v, pos = (env[n] for n in op.inputs)
        out = np.empty_like(q)
        seconds = 0.0
        for s in step.seqs:
            sl = slice(s.start, s.stop)
            keys, vals, kpos = s.cache.layers[op.layer].append(pos[sl], k[sl], v[sl])
            try:
                sched = self._attention_schedule(op, s.stop - s.start, len(kpos))
            except ScheduleError as e:
                self._fallback(op, (s.stop - s.start, len(kpos)), e)
                out[sl] = ref.attention(q[sl], keys, vals, pos[sl], kpos, a["n_heads"], a["n_kv_heads"],
                                        a["head_dim"], a["scale"], a.get("window", 0))  # fmt: skip
                continue
            if self.xrt_ops:
                out[sl], took = self.xrt_ops.attention(sched, q[sl], keys, vals, pos[sl], kpos)
                self.npu_launches += 1
                seconds += took
            else:
                out[sl] = emu.attention(sched, self.array, q[sl], keys, vals, pos[sl], kpos, a["scale"])
                seconds += self._charge(sched)
        env[op.outputs[0]] = out
        return seconds

    def op_kernel(self, op: Op):
        """The kernel ``kernel(backend, op, env, step)`` that runs ``op`` on this backend: its NPU kernel, or
        the host's (numpy reference) for other kinds and NPU ops no design covers; None for an unknown kind."""
        if "npu_fallback" in op.attrs:
            host = HOST_KERNELS[op.kind]
            return lambda b, o, env, step: host(b.host, o, env, step)
        npu = {
            "matmul": NpuBackend._matmul,
            "rmsnorm": NpuBackend._rmsnorm,
            "attention": NpuBackend._attention,
        }
        if op.kind in npu:
            return npu[op.kind]
        host = HOST_KERNELS.get(op.kind)
        if host is None:
            return None
        return lambda b, o, env, step: host(b.host, o, env, step)

    def run(self, graph: Graph, step: Step, observer: OpObserver | None = None) -> np.ndarray:
        self.check_tokens(step)
        if self.xrt_ops:
            self._check_designs(graph, step)
        return self.run_ops(self.prepare_graph(graph), step, self.op_kernel, observer)


__all__ = ["NPU_KINDS", "NpuBackend", "matmul_schedule"]
