"""The ``npu`` backend: the ops the NPU schedules cover run on the AIE emulator, the rest on the host.

Covered kinds (:data:`NPU_KINDS`): ``matmul`` (GEMV for one row, GEMM for more; bf16 or int8 weights),
``rmsnorm`` (rows and per-head groups) and ``attention`` (over the KV cache). Every other op runs on the
numpy reference backend, and each op says where it ran: ``op.attrs["device"]`` / ``["timing"]`` in the
graph this backend runs (the profiler's ``device`` and ``timing`` columns), and ``device.details``.
NPU op times are ``emulated`` (cost model); host op times are measured host wall time.

No NPU is needed: the emulator is the default ``npu`` device. Running whole graphs through XRT needs one
compiled design per op shape (``mlir/build.py``); :mod:`workbench.backends.npu.xrt` runs single designs
where pyxrt and an NPU exist, and ``--tune mode=xrt`` says exactly what is missing.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ...models.model import Model
from ...ops.graph import Graph, Op
from ...runtime.kv_cache import KVCache
from ..base import Backend, BackendUnavailableError, DeviceInfo, OpObserver, Step
from ..numpy_ref import KERNELS as HOST_KERNELS
from ..numpy_ref import NumpyBackend
from . import xrt
from .arch import NPU_DEVICES, get_array
from .cost import estimate
from .emulator import kernels as emu
from .emulator.numerics import F32, quantize_rows_i8, srs_shift, to_bf16
from .schedule import Schedule, matmul_schedule, plan_attention, plan_rowwise

NPU_KINDS = ("matmul", "rmsnorm", "attention")
DTYPES = {"bf16": "bf16", "int8": "i8"}


class NpuBackend(Backend):
    """NPU ops on the AIE emulator (npu1, hawkpoint or npu2), other ops on the host numpy reference."""

    name = "npu"
    tunable_names = ("device", "dtype", "mode")
    auto_acceptable = False  # the emulator is a research tool, never a fast default

    def __init__(
        self,
        model: Model,
        threads: int | None = None,
        tune: str | None = None,
        device: str = "npu1",
        dtype: str = "bf16",
        mode: str = "emulator",
    ):
        super().__init__(model, threads, tune)
        device, dtype, mode = (
            self.tunable("device", device),
            self.tunable("dtype", dtype),
            self.tunable("mode", mode),
        )
        if dtype not in DTYPES:
            raise ValueError(f"npu backend: dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        if device not in NPU_DEVICES:
            raise ValueError(f"npu backend: device must be one of {', '.join(NPU_DEVICES)}, got {device!r}")
        if mode not in ("emulator", "xrt"):
            raise ValueError(f"npu backend: mode must be emulator or xrt, got {mode!r}")
        self.detection = xrt.detect()
        if mode == "xrt":
            why = self.detection.reason() or (
                "an NPU and pyxrt are present, but graph execution through XRT needs a compiled design per op "
                "shape, which this build does not run yet: build designs with mlir/build.py and run them with "
                "workbench.backends.npu.xrt.XrtKernel"
            )
            raise BackendUnavailableError(f"npu backend (mode=xrt): {why}")
        self.array = get_array(device)
        self.dtype = DTYPES[dtype]
        self.dtype_name = dtype
        self.host = NumpyBackend(model, threads)
        self._w: dict[str, Any] = {}
        self._norm_w: dict[str, np.ndarray] = {}
        self._graphs: dict[tuple, Graph] = {}
        self.emulated_s = 0.0
        self.npu_launches = 0
        host_kinds = sorted(set(model.graph(1).kinds()) - set(NPU_KINDS))
        print(
            f"workbench: npu backend -> AIE emulator of {self.array.name} ({dtype}); no NPU execution"
            + (f" ({self.detection.reason()})" if self.detection.reason() else "")
            + f". On the emulator: {', '.join(NPU_KINDS)}; on the host (numpy reference): {', '.join(host_kinds)}",
            file=sys.stderr,
        )

    @property
    def device(self) -> DeviceInfo:
        return DeviceInfo(
            "npu",
            f"AIE emulator of {self.array.name}",
            "emulator",
            {
                "profile": self.array.key,
                "mode": "emulator",
                "dtype": self.dtype_name,
                "npu_ops": list(NPU_KINDS),
                "host_ops": "every other kind, on the numpy reference backend (float32)",
                "timing": "NPU ops emulated (AIE cost model); host ops measured (host wall time)",
                "emulated_npu_s": self.emulated_s,
                "npu_launches": self.npu_launches,
                "xrt": self.detection.to_dict(),
            },
        )

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
                "device": f"npu:emulator({self.array.key})",
                "timing": "emulated",
                "dtype": self.dtype_name,
            }
            host = {"device": "numpy:host", "timing": "measured (host)", "dtype": "fp32"}
            ops = [
                Op(o.name, o.kind, o.inputs, o.outputs, o.weights, {**o.attrs, **(npu if self.supports(o) else host)}, o.layer)
                for o in graph.ops
            ]  # fmt: skip
            g = Graph(graph.config, graph.n_tokens, graph.n_logits, ops, graph.tensors, graph.weights, graph.outputs,
                      (*graph.rewrites, "npu-placement"))  # fmt: skip
            self._graphs[key] = g
        return g

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

    # -- op kernels --------------------------------------------------------------------------------------------
    def _charge(self, schedule: Schedule) -> float:
        s = estimate(schedule, self.array).seconds
        self.emulated_s += s
        self.npu_launches += 1
        return s

    def _matmul(self, op: Op, env: dict, step: Step) -> float:
        x = env[op.inputs[0]]
        w = self._matmul_weight(op.weights[0])
        n_out = (w if self.dtype == "bf16" else w[0]).shape[0]
        sched = matmul_schedule(self.array, x.shape[0], n_out, x.shape[1], self.dtype)
        if self.dtype == "bf16":
            env[op.outputs[0]] = emu.matmul_bf16(sched, self.array, x, w)
        else:
            env[op.outputs[0]] = emu.matmul_i8(sched, self.array, x, *w)
        return self._charge(sched)

    def _rmsnorm(self, op: Op, env: dict, step: Step) -> float:
        x = env[op.inputs[0]]
        group = op.attr("group")
        length = group or x.shape[-1]
        sched = plan_rowwise(self.array, "rmsnorm", x.size // length, length)
        env[op.outputs[0]] = emu.rmsnorm(
            sched, self.array, x, self._norm_weight(op.weights[0]), op.attrs["eps"], group
        )
        return self._charge(sched)

    def _attention(self, op: Op, env: dict, step: Step) -> float:
        a = op.attrs
        q, k, v, pos = (env[n] for n in op.inputs)
        out = np.empty_like(q)
        seconds = 0.0
        for s in step.seqs:
            sl = slice(s.start, s.stop)
            keys, vals, kpos = s.cache.layers[op.layer].append(pos[sl], k[sl], v[sl])
            sched = plan_attention(
                self.array, s.stop - s.start, len(kpos), a["n_heads"], a["n_kv_heads"], a["head_dim"],
                window=a.get("window", 0),
            )  # fmt: skip
            out[sl] = emu.attention(sched, self.array, q[sl], keys, vals, pos[sl], kpos, a["scale"])
            seconds += self._charge(sched)
        env[op.outputs[0]] = out
        return seconds

    def _kernel_for(self, op: Op):
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
        return self.run_ops(self.prepare_graph(graph), step, self._kernel_for, observer)


__all__ = ["NPU_KINDS", "NpuBackend", "matmul_schedule"]
