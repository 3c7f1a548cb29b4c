"""The ``vulkan`` backend: Gemma 3 resident on a Vulkan device, each step shape recorded once and replayed.

Weights are uploaded once (planar native blocks, :mod:`.weights`); norm weights and RoPE frequency tables
live in one small buffer; activations in a per-program arena; the KV cache in pooled per-layer buffers.
A decode step is one submit and one fence wait: greedy decoding samples on the device (``run_greedy``
reads back 4 bytes), other sampling reads the logits back. How kernels are chosen, the tunables and what was
measured: docs/backend-vulkan.md.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections import OrderedDict
from typing import Any

import numpy as np
from tqdm import tqdm

from ...models.model import Model
from ...models.weights import QTensor
from ...ops.fusion import fuse
from ...ops.graph import Graph, Op
from ...ops.reference import rope_inv_freq
from ...quant.formats import GGMLType
from ..base import (
    Backend,
    BackendUnavailableError,
    DeviceInfo,
    OpObserver,
    Step,
    UnsupportedOpError,
    parse_tune,
)
from . import gemma3n
from .device import VulkanDevice, list_devices, select_device
from .kernels import TUNABLE_NAMES, Pipelines, Tuning
from .kv_cache import KVPool, VulkanKVCache
from .memory import Buffer, Transfers
from .placement import TUNABLES as PLACEMENT_TUNABLES
from .placement import WeightsPlan, check_tunables, plan_weights, report
from .program import MAX_STEP_TOKENS, Builder
from .recorded import Recorded
from .tuned import AppliedTuning, TuningDB
from .weights import DeviceWeight, device_bytes, upload_weight

MAX_PROGRAMS = 32  # recorded step programs kept (shapes x batch compositions)
# every op kind the program builder emits (program.Builder.emit; fused kinds run as their parts otherwise)
KINDS = (
    "embed",
    "rmsnorm",
    "matmul",
    "rope",
    "attention",
    "gelu_mul",
    "add",
    "softcap",
    "gather_rows",
    "rmsnorm_matmul",
    "rmsnorm_matmul_gelu",
    "rmsnorm_rope",
    "matmul_rmsnorm_add",
    *gemma3n.KINDS,
)
# Gemma 3n's per-layer embedding table: gathered by row, never streamed
PLE_TABLE = "per_layer_token_embd.weight"
# Gemma 3n's small matrices read whole by their kernels (gemma3n.comp): float32 in the small-tensor buffer
SMALL_MATRICES = (".altup_router.weight", ".altup_predict_coef.weight", ".altup_correct_coef.weight")


def profile_key(name: str) -> str:
    """The device profile key (workbench.instrument.devices) of a Vulkan device by its name; ``unknown`` for a
    device the table lacks."""
    n = name.lower()
    if "h100" in n:
        return "h100"
    if "h200" in n:
        return "h200"
    if "780m" in n or "phoenix" in n:
        return "780m"
    if "890m" in n:
        return "890m"
    return "host" if "llvmpipe" in n or "lavapipe" in n else "unknown"


class VulkanBackend(Backend):
    """Runs step graphs on a Vulkan device (``device_id``: index or name; validation: Khronos layer)."""

    name = "vulkan"
    tunable_names = (
        *TUNABLE_NAMES, *PLACEMENT_TUNABLES, "fused", "timestamps", "device", "tuned", "subgroup_size"
    )  # fmt: skip

    def __init__(self, model: Model, threads: int | None = None, tune: str | None = None,
                 device_id: str | int | None = None, validation: bool | None = None):  # fmt: skip
        super().__init__(model, threads, tune)
        missing = sorted({op.kind for op in model.graph(1).ops} - set(KINDS))
        if missing:  # refused before any device work, so that `auto` passes over this backend
            raise UnsupportedOpError(f"vulkan backend: no kernel for op kinds {', '.join(missing)}")
        self.dev = VulkanDevice(
            device_id if device_id is not None else self._tune.get("device"),
            validation,
            self.tunable("subgroup_size", 0),  # 0: the driver's; else required of every pipeline
        )
        self.programs: OrderedDict[tuple, Recorded] = OrderedDict()
        # per-shape parameters that win over the tuning database (the autotuner's step objective)
        self.trial_params: dict[str, dict[str, int]] = {}
        self._graphs: dict[tuple, Graph] = {}
        self._weights: dict[str, DeviceWeight] = {}
        self.smalls: Buffer | None = None
        self.transfers: Transfers | None = None
        self.pipes: Pipelines | None = None
        self.kv_pool: KVPool | None = None
        self.weights_plan: WeightsPlan | None = None
        try:
            self.tuning = Tuning(
                self.dev.features,
                {k: v for k, v in self._tune.items() if k in TUNABLE_NAMES},
                model.config.hidden,
            )
            if self.dev.required_subgroup_size:  # a required size caps the subgroups of a workgroup
                f = self.dev.features
                cap = f.max_workgroup_subgroups * f.subgroup_size
                big = [
                    f"{k}={v}" for k, v in self.tuning.values.items() if k.endswith(".wg") and cap and v > cap
                ]
                if big:
                    raise ValueError(f"vulkan backend: {', '.join(big)} exceed {cap} invocations at subgroup_size="
                                     f"{f.subgroup_size} ({f.max_workgroup_subgroups} subgroups a workgroup)")  # fmt: skip
            # per-shape parameters from `workbench tune` on this device and driver (tuned=0: defaults only)
            self.tuned = (
                TuningDB.load().for_device(self.dev.features)
                if self.tunable("tuned", True)
                else AppliedTuning(None, {})
            )
            if self.tuned.other_kernel:  # tuned for kernels this version no longer has: say so, once
                print(f"vulkan backend: {self.tuned.other_kernel} entries of {self.tuned.path} were tuned for another "
                      "version of their kernel and are not applied; run `workbench tune` again", file=sys.stderr)  # fmt: skip
            self.fused = self.tunable("fused", True)
            self.gemm_kernel, self.gemm_note = self.choose_gemm()
            self.timestamps = self.tunable("timestamps", True) and self.dev.features.timestamps
            self.pipes = Pipelines(self.dev)
            self.transfers = Transfers(self.dev)
            self.params = Buffer(self.dev, (4 + 5 * MAX_STEP_TOKENS) * 4, host=True, name="step params")
            self.dummy = Buffer(self.dev, 16, name="unused binding")
            t0 = time.perf_counter()
            self._upload_model()
            self.upload_s = time.perf_counter() - t0
            self.kv_pool = KVPool(self.dev, model.config, fp16=bool(self.tuning["kv.fp16"]))
        except BaseException:
            self.close()
            raise

    # -- identity --------------------------------------------------------------------------------
    @property
    def device(self) -> DeviceInfo:
        f = self.dev.features
        return DeviceInfo(
            "vulkan",
            f.name,
            "cpu" if f.is_cpu else "gpu",
            {
                "profile": profile_key(f.name),
                "api": f.api_version,
                "driver": f.driver(),
                "subgroup_size": f.subgroup_size,
                "subgroup_size_required": bool(self.dev.required_subgroup_size),
                "fp16": f.fp16,
                "cooperative_matrix": f.coopmat_f16,
                "prefill_gemm": f"{self.gemm_kernel}: {self.gemm_note}",
                "timestamps": self.timestamps,
                "validation": self.dev.validation,
                "weights_bytes": sum(w.nbytes for w in self._weights.values()),
                "memory": report(self.weights_plan, self._weights.values(), self.dev),
                "upload_s": round(getattr(self, "upload_s", 0.0), 3),
                "tunables": dict(self.tuning.values),
                "integer_matvec": bool(self.tuning["matvec.q8"]),
                "kv_cache": "float16" if self.tuning["kv.fp16"] else "float32",
                "tuned_shapes": self.tuned.describe(),
            },
        )

    def choose_gemm(self) -> tuple[str, str]:
        """The prefill GEMM kernel and why (the fallback is named in the device details and on stderr)."""
        if not self.tuning["matmul.coop"]:
            return "matmul", "fp32 tiled GEMM (matmul.coop=0)"
        if self.dev.features.coopmat_f16:
            return "matmul_coop", "cooperative-matrix GEMM (fp16 inputs, fp32 accumulation)"
        note = "fp32 tiled GEMM: the device has no 16x16x16 fp16 cooperative matrices"
        if not self.dev.features.is_cpu:  # on lavapipe the fp32 kernel is the expected path; elsewhere say so
            print(f"vulkan backend: prefill uses the {note}", file=sys.stderr)
        return "matmul", note

    @classmethod
    def auto_rejection(cls, **options: Any) -> str | None:
        """A CPU driver (lavapipe) as the device these options select: skipped before any upload."""
        selector = options.get("device_id")
        if selector is None:
            selector = parse_tune(options.get("tune")).get("device")
        try:
            feats = select_device(list_devices(), selector)
        except (BackendUnavailableError, ValueError):
            return None  # building it reports the same error in full
        return f"{feats.name} is a CPU driver, slower than the cpu backend" if feats.is_cpu else None

    @classmethod
    def probe(cls) -> dict:
        devs = list_devices()
        return {
            "available": bool(devs),
            "reason": "" if devs else "no Vulkan device",
            "devices": [d.to_dict() for d in devs],
        }

    # -- model data ------------------------------------------------------------------------------
    def _upload_model(self) -> None:
        m, limit = self.model, self.dev.features.max_storage_buffer_range
        small = {n for n, t in m.weights.items() if len(t.shape) == 2 and self._is_small_matrix(n, t.shape)}
        # 3-D weights (Gemma 3n's stacked AltUp projections, (3, H, H)) go up as (3H, H) matrices
        mats = [n for n, t in m.weights.items() if len(t.shape) in (2, 3) and n not in small]
        vecs = [n for n, t in m.weights.items() if len(t.shape) == 1 or n in small]
        self._small_mats = {n: tuple(m.weights[n].shape) for n in small}
        total = sum(m.weights[n].nbytes for n in mats)
        # device-local or host-visible memory for each weight, decided before the first upload (placement.py)
        mode = self.tunable("weights.heap", "auto")
        budget = check_tunables(mode, self._tune.get("weights.device_budget_mb"))
        sizes = {n: device_bytes(m.weights[n], limit) for n in mats}
        # Gemma 3n's sparse down projections also get a float16 transposed copy (ffn.down_t), planned here
        transposed = self._sparse_down_weights()
        sizes |= {
            f"{n}^T": 2 * self.tuning["ffn.down_t"] * m.weights[n].rows * m.weights[n].cols
            for n in transposed
        }
        # the per-layer embedding table is read one row per token: host-visible memory costs a decode step
        # ~L*P*2 bytes over the bus and leaves the device-local heap to the streamed weights (ple.host)
        ple = PLE_TABLE in sizes and mode != "device" and self.tuning["ple.host"]
        self.weights_plan = plan_weights(
            self.dev, {n: b for n, b in sizes.items() if not (ple and n == PLE_TABLE)}, mode, budget
        )
        if ple:
            self.weights_plan.roles[PLE_TABLE] = "host"
        bar = tqdm(total=total, unit="B", unit_scale=True, desc="vulkan: uploading weights", file=sys.stderr,
                   disable=total < 64 << 20, leave=False)  # fmt: skip
        for n in mats:
            self._weights[n] = upload_weight(m.weights[n], self.transfers, limit, self.weights_plan.roles[n])
            bar.update(m.weights[n].nbytes)
        bar.close()
        for n in transposed:
            self._upload_transposed(n, self.weights_plan.roles[f"{n}^T"])
        self._small_off: dict[str, int] = {}
        chunks, off = [], 0
        for n in vecs:
            v = m.weights[n].dequantize().astype(np.float32).reshape(-1)
            self._small_off[n] = off
            chunks.append(v)
            off += len(v) + (-len(v)) % 4
            chunks.append(np.zeros((-len(v)) % 4, np.float32))
        self._rope_off: dict[tuple, int] = {}
        c = m.config
        for i in range(c.n_layers):
            key = (c.head_dim, float(c.rope_base(i)), float(c.rope_scale(i)))
            if key in self._rope_off:
                continue
            inv = rope_inv_freq(*key)
            self._rope_off[key] = off
            chunks.append(inv)
            off += len(inv) + (-len(inv)) % 4
            chunks.append(np.zeros((-len(inv)) % 4, np.float32))
        data = np.concatenate(chunks) if chunks else np.zeros(4, np.float32)
        self.smalls = Buffer(self.dev, data.nbytes, name="norm weights and rope tables", spill=True)
        self.transfers.upload(self.smalls, data)

    def _is_small_matrix(self, name: str, shape: tuple[int, ...]) -> bool:
        """Gemma 3n's router and coefficient matrices, and its matrices too narrow for the matvec and GEMM
        (a number of columns not a multiple of 32: the tiny test checkpoints' LAuReL and PLE projections)."""
        if not self.model.config.altup_inputs or name in (PLE_TABLE, "token_embd.weight"):  # tables: gathered
            return False
        return name.endswith(SMALL_MATRICES) or (shape[-1] % 32 != 0 and shape[0] * shape[1] <= 1 << 16)

    def small_matrix(self, name: str) -> tuple[int, int] | None:
        """(rows, cols) of a matrix kept as float32 in the small-tensor buffer, else None."""
        return self._small_mats.get(name)

    def weight(self, name: str) -> DeviceWeight:
        return self._weights[name]

    def _sparse_down_weights(self) -> list[str]:
        """The down weights of Gemma 3n's sparse layers when they are read by unit (``ffn.sparse_skip`` and
        ``ffn.down_t``), whose transposed copies are placed and uploaded with the other weights."""
        c, t = self.model.config, self.tuning
        if not (c.altup_inputs and t["ffn.sparse_skip"] and t["ffn.down_t"]):
            return []
        names = [f"blk.{i}.ffn_down.weight" for i, s in enumerate(c.activation_sparsity) if s > 0]
        return [n for n in names if n in self.model.weights]

    def _upload_transposed(self, name: str, role: str) -> None:
        """Upload a copy of matrix ``name`` transposed, as weight ``name^T``: float16 (``ffn.down_t=1``: within
        fp16 rounding of the dequantized weight) or float32 (``=2``: exact, twice the bytes)."""
        w = self.model.weights[name].dequantize().astype(np.float32)
        exact = self.tuning["ffn.down_t"] == 2
        wt = np.ascontiguousarray(w.T).astype(np.float32 if exact else np.float16)
        q = QTensor(
            f"{name}^T", GGMLType.F32 if exact else GGMLType.F16, wt.shape, loader=lambda: wt.view(np.uint8)
        )
        limit = self.dev.features.max_storage_buffer_range
        self._weights[q.name] = upload_weight(q, self.transfers, limit, role)

    def weight_transposed(self, name: str) -> str:
        """The name of the float16 transposed copy of matrix ``name`` (Gemma 3n's sparse down projections read
        it by unit, ``ffn.down_t``); uploaded on first use where the plan did not place it."""
        key = f"{name}^T"
        if key not in self._weights:
            self._upload_transposed(name, self._weights[name].role)
        return key

    def weight_slice(self, name: str, index: int) -> str:
        """The name of matrix ``index`` of a 3-D weight (uploaded on first use as a weight of its own):
        ``altup_unembed`` applies each stacked projection to a different stream."""
        key = f"{name}[{index}]"
        if key not in self._weights:
            t = self.model.weights[name]
            if len(t.shape) != 3 or not hasattr(t, "raw"):
                raise UnsupportedOpError(
                    f"vulkan backend: {name!r} is not a stacked (3-D) block-format weight"
                )
            n = t.shape[1]
            raw = t.raw
            part = dataclasses.replace(
                t,
                name=key,
                shape=tuple(t.shape[1:]),
                loader=lambda: raw[index * n : (index + 1) * n],
                _raw=None,
            )
            role = self._weights[name].role
            limit = self.dev.features.max_storage_buffer_range
            self._weights[key] = upload_weight(part, self.transfers, limit, role)
        return key

    def small_offset(self, name: str) -> int:
        return self._small_off[name]

    def rope_offset(self, op: Op) -> int:
        a = op.attrs
        return self._rope_off[(a["head_dim"], float(a["base"]), float(a.get("scale", 1.0)))]

    # -- steps -----------------------------------------------------------------------------------
    def new_cache(self, max_len: int, slack: int = 0) -> VulkanKVCache:
        return self.kv_pool.new_cache(max_len, slack)

    def prepare_graph(self, graph: Graph) -> Graph:
        key = (graph.n_tokens, graph.n_logits, id(graph))
        g = self._graphs.get(key)
        if g is None:
            g = self._graphs[key] = fuse(graph) if self.fused else graph
        return g

    def _caches_of(self, step: Step) -> list[VulkanKVCache]:
        """The step's per-sequence caches (a batched step has several sequences, each with its own cache)."""
        caches = [sl.cache for sl in step.seqs]
        if len(caches) == 1 and isinstance(caches[0], VulkanKVCache) and step.n_tokens <= MAX_STEP_TOKENS:
            return caches
        if not all(isinstance(c, VulkanKVCache) for c in caches):
            raise TypeError(
                "vulkan backend: the step's KV cache was not made by this backend (use new_cache)"
            )
        if len({id(c) for c in caches}) != len(caches):
            raise ValueError("vulkan backend: a sequence may appear only once in a step")
        if step.n_tokens > MAX_STEP_TOKENS:
            raise ValueError(f"vulkan backend: steps of more than {MAX_STEP_TOKENS} tokens are not supported")
        return caches

    def _program(self, graph: Graph, step: Step, greedy: bool) -> Recorded:
        seqs = [(sl.cache.device_kv, sl.start, sl.stop - sl.start) for sl in step.seqs]
        key = (id(graph), tuple((kv.id, t0, n) for kv, t0, n in seqs), greedy)
        prog = self.programs.get(key)
        if prog is not None:
            self.programs.move_to_end(key)
            return prog
        builder = Builder(self, graph, seqs, greedy, forced=dict(self.trial_params))
        dispatches, offsets, total = builder.build()
        logits = graph.outputs[0]
        region = None if greedy else (offsets[logits], int(np.prod(graph.tensors[logits].shape)))
        prog = Recorded(self.dev, self.pipes, dispatches, total, self.params, self.smalls, self.dummy, region,
                        self.timestamps, builder.seq_index())  # fmt: skip
        for t in builder.pinned:  # atomic counters start at zero (their kernels reset them after use)
            self.transfers.upload(prog.arena, np.zeros(builder.sizes[t], np.uint32), 4 * offsets[t])
        self.programs[key] = prog
        while len(self.programs) > MAX_PROGRAMS:
            _, old = self.programs.popitem(last=False)
            old.destroy()
        return prog

    def _execute(self, graph: Graph, step: Step, observer: OpObserver | None, greedy: bool) -> Recorded:
        self.check_tokens(step)
        caches = self._caches_of(step)
        prog = self._program(graph, step, greedy)
        timed = observer is not None and self.timestamps
        t0 = time.perf_counter()
        prog.run(step.tokens, step.positions, step.logit_rows, timed=timed)
        wall = time.perf_counter() - t0
        self._last_untimed = None if timed else prog
        if observer is not None:
            self._report(graph, step, prog, observer, t0, wall, timed)
        positions = step.positions.tolist()
        for sl, cache in zip(step.seqs, caches):
            cache.length = positions[sl.stop - 1] + 1
        if self.dev.validation:
            self.dev.check_validation()
        return prog

    def _report(self, graph, step, prog, observer, t0, wall, timed) -> None:
        """One observer row per graph op: device time from timestamps (summed over the op's dispatches)."""
        per_op: dict[str, float] = {}
        if timed:
            for d, s in zip(prog.dispatches, prog.dispatch_times()):
                per_op[d.op] = per_op.get(d.op, 0.0) + float(s)
        ops = graph.ops
        share = wall / max(len(ops), 1)
        start = t0
        for op in ops:
            # an op folded into another's dispatch (Gemma 3n: gemma3n.fold) ran in that op's device time
            dev_s = per_op.get(op.name, 0.0) if timed else None
            observer.on_op(op, step, start, dev_s if dev_s is not None else share, dev_s)
            start += dev_s if dev_s is not None else share

    def device_step_seconds(self) -> float | None:
        """GPU time of the last step (one timestamp pair around its command buffer), if it was measured."""
        prog = getattr(self, "_last_untimed", None)
        return prog.step_seconds() if prog is not None else None

    def run(self, graph: Graph, step: Step, observer: OpObserver | None = None) -> np.ndarray:
        prog = self._execute(graph, step, observer, greedy=False)
        return prog.logits(graph.n_logits)

    def run_greedy(self, graph: Graph, step: Step, observer: OpObserver | None = None) -> int:
        return self._execute(graph, step, observer, greedy=True).last_token(graph.n_logits)

    def run_argmax(self, graph: Graph, step: Step, observer: OpObserver | None = None) -> np.ndarray:
        """Argmax of every logits row on the device: only the token ids come back."""
        return self._execute(graph, step, observer, greedy=True).tokens(graph.n_logits)

    def try_params(self, params: dict[str, dict[str, int]]) -> None:
        """Per-shape parameters that win over the tuning database in the programs built from now on (the
        autotuner's candidates, timed in whole steps); the recorded programs are dropped when they change."""
        if params != self.trial_params:
            self.trial_params = {k: dict(v) for k, v in params.items()}
            self.drop_programs()

    def drop_programs(self) -> None:
        """Destroy every recorded step program (the next step records its own)."""
        for p in self.programs.values():
            p.destroy()
        self.programs.clear()
        self._last_untimed = None

    def close(self) -> None:
        self.drop_programs()
        for w in self._weights.values():
            for part in w.parts:
                part.buffer.destroy()
        self._weights.clear()
        for b in (self.smalls, getattr(self, "params", None), getattr(self, "dummy", None)):
            if b is not None:
                b.destroy()
        if self.kv_pool is not None:
            self.kv_pool.destroy()
        if self.transfers is not None:
            self.transfers.destroy()
        if self.pipes is not None:
            self.pipes.destroy()
        self.dev.close()
