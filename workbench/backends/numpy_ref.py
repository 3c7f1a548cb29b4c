"""The numpy reference backend: runs each op with :mod:`workbench.ops.reference` in float32.

Weights are dequantized to float32 on first use and kept (the oracle favours clarity over memory).
See docs/backend-numpy.md; every kind's reference and what runs it elsewhere: docs/ops.md.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from threadpoolctl import ThreadpoolController

from ..hostinfo import host_cpu_name
from ..models.model import Model
from ..ops import reference as ref
from ..ops import reference_gemma3n as ref3n
from ..ops.graph import Graph, Op
from ..quant.planar import matmul_input
from ..runtime.kv_cache import KVCache
from ..sparsity.attention import block_mask
from ..sparsity.ffn import down_values, sparse_ffn
from .base import Backend, DeviceInfo, OpObserver, Step

Env = dict[str, np.ndarray]
Kernel = Callable[["NumpyBackend", Op, Env, Step], None]


def _embed(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    rows = b.model.weights[op.weights[0]].dequantize_rows(env[op.inputs[0]])
    env[op.outputs[0]] = ref.embed(rows, op.attrs["scale"])


def _rmsnorm(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    env[op.outputs[0]] = ref.rmsnorm(
        env[op.inputs[0]], b.weight(op.weights[0]), op.attrs["eps"], op.attr("group")
    )


def _matmul(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    w = op.weights[0]
    env[op.outputs[0]] = ref.matmul(matmul_input(b.model.weights[w], env[op.inputs[0]]), b.weight(w))


def _rope(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    a = op.attrs
    env[op.outputs[0]] = ref.rope(
        env[op.inputs[0]], env[op.inputs[1]], a["n_heads"], a["head_dim"], a["base"], a.get("scale", 1.0)
    )


def _attention(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    a = op.attrs
    q, k, v, pos = (env[n] for n in op.inputs)
    out = np.empty_like(q)
    for s in step.seqs:
        sl = slice(s.start, s.stop)
        keys, vals, kpos = s.cache.layers[op.layer].append(pos[sl], k[sl], v[sl])
        out[sl] = ref.attention(
            q[sl],
            keys,
            vals,
            pos[sl],
            kpos,
            a["n_heads"],
            a["n_kv_heads"],
            a["head_dim"],
            a["scale"],
            a.get("window", 0),
            block_mask(pos[sl], kpos, a["blocks"]) if "blocks" in a else None,
        )
    env[op.outputs[0]] = out


def _shared_kv_attention(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    """Attention over the cache of layer ``kv_layer``, which an earlier op of this step extended."""
    a = op.attrs
    q, pos = (env[n] for n in op.inputs)
    out = np.empty_like(q)
    for s in step.seqs:
        sl = slice(s.start, s.stop)
        keys, vals, kpos = s.cache.layers[a["kv_layer"]].visible(pos[sl])
        out[sl] = ref.attention(
            q[sl], keys, vals, pos[sl], kpos, a["n_heads"], a["n_kv_heads"], a["head_dim"], a["scale"],
            a.get("window", 0),
        )  # fmt: skip
    env[op.outputs[0]] = out


def _rmsnorm_plain(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    env[op.outputs[0]] = ref3n.rmsnorm_plain(env[op.inputs[0]], op.attrs["eps"], op.attr("group"))


def _altup_expand(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    env[op.outputs[0]] = ref3n.altup_expand(env[op.inputs[0]], b.weight(op.weights[0]))


def _altup_unembed(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    env[op.outputs[0]] = ref3n.altup_unembed(env[op.inputs[0]], b.weight(op.weights[0]))


def _altup_predict(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    w = [b.weight(n) for n in op.weights]
    env[op.outputs[0]], env[op.outputs[1]] = ref3n.altup_predict(env[op.inputs[0]], *w, op.attrs["eps"])


def _altup_correct(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    p, z = (env[n] for n in op.inputs)
    w = [b.weight(n) for n in op.weights]
    env[op.outputs[0]], env[op.outputs[1]] = ref3n.altup_correct(p, z, *w, op.attrs["eps"])


def _laurel_residual(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    env[op.outputs[0]] = ref3n.laurel_residual(*(env[n] for n in op.inputs))


def _gaussian_topk(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    env[op.outputs[0]] = ref3n.gaussian_topk(env[op.inputs[0]], op.attrs["std_multiplier"])


def _ple_project(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    a = op.attrs
    proj, rows = (env[n] for n in op.inputs)
    env[op.outputs[0]] = ref3n.ple_project(
        proj, rows, b.weight(op.weights[0]), a["scale"], a["group"], a["eps"]
    )


def _ple_gate(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    env[op.outputs[0]] = ref3n.ple_gate(env[op.inputs[0]], env[op.inputs[1]], op.layer)


def _ple_inject(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    env[op.outputs[0]] = ref3n.ple_inject(env[op.inputs[0]], env[op.inputs[1]])


def _gelu_mul(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    env[op.outputs[0]] = ref.gelu_mul(env[op.inputs[0]], env[op.inputs[1]])


def _add(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    env[op.outputs[0]] = env[op.inputs[0]] + env[op.inputs[1]]


def _gather_rows(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    env[op.outputs[0]] = env[op.inputs[0]][env[op.inputs[1]]]


def _softcap(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    env[op.outputs[0]] = ref.softcap(env[op.inputs[0]], op.attrs["cap"])


def _sparse_ffn(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    tensors = [b.model.weights[w] for w in op.weights]
    gate, up, down = op.weights
    fmt = op.attrs.get("down", "fp32")
    key = f"{down}#sparse-columns={fmt}"  # the values a sparse FFN multiplies by (stored transposed as fmt)
    if key not in b._f32:
        b._f32[key] = down_values(b.weight(down), fmt)
    env[op.outputs[0]] = sparse_ffn(env[op.inputs[0]], b.weight(gate), b.weight(up), b._f32[key], tensors,
                                    op.attrs["method"], op.attrs["target"])  # fmt: skip


def _fused(b: NumpyBackend, op: Op, env: Env, step: Step) -> None:
    """A fused op (see :mod:`workbench.ops.fusion`) runs as its parts: that is its reference semantics."""
    for part in op.attrs["parts"]:
        KERNELS[part.kind](b, part, env, step)


def _kernel_for(op: Op) -> Kernel | None:
    return KERNELS.get(op.kind) or (_fused if "parts" in op.attrs else None)


KERNELS: dict[str, Kernel] = {
    "embed": _embed,
    "rmsnorm": _rmsnorm,
    "matmul": _matmul,
    "rope": _rope,
    "attention": _attention,
    "block_sparse_attention": _attention,
    "gelu_mul": _gelu_mul,
    "add": _add,
    "gather_rows": _gather_rows,
    "softcap": _softcap,
    "sparse_ffn": _sparse_ffn,
    # Gemma 3n
    "rmsnorm_plain": _rmsnorm_plain,
    "shared_kv_attention": _shared_kv_attention,
    "altup_expand": _altup_expand,
    "altup_unembed": _altup_unembed,
    "altup_predict": _altup_predict,
    "altup_correct": _altup_correct,
    "laurel_residual": _laurel_residual,
    "gaussian_topk": _gaussian_topk,
    "ple_project": _ple_project,
    "ple_gate": _ple_gate,
    "ple_inject": _ple_inject,
}


class NumpyBackend(Backend):
    """Reference execution in numpy float32."""

    name = "numpy"

    def __init__(self, model: Model, threads: int | None = None, tune: str | None = None):
        super().__init__(model, threads, tune)
        self._f32: dict[str, np.ndarray] = {}
        if self.threads:
            ThreadpoolController().limit(limits=self.threads, user_api="blas")

    @property
    def device(self) -> DeviceInfo:
        return DeviceInfo(
            "numpy",
            host_cpu_name(),
            "cpu",
            {"dtype": "float32", "threads": self.threads or "BLAS default", "profile": "host"},
        )

    @classmethod
    def probe(cls) -> dict:
        return {
            "available": True,
            "reason": "",
            "devices": [{"name": host_cpu_name(), "kind": "cpu", "numpy": np.__version__}],
        }

    def supports(self, op: Op) -> bool:
        return op.kind in KERNELS or all(self.supports(p) for p in op.attr("parts", ()))

    def weight(self, name: str) -> np.ndarray:
        w = self._f32.get(name)
        if w is None:
            w = self._f32[name] = self.model.weights[name].dequantize()
        return w

    def new_cache(self, max_len: int, slack: int = 0) -> KVCache:
        return KVCache(self.model.config, max_len, slack)

    def run(self, graph: Graph, step: Step, observer: OpObserver | None = None) -> np.ndarray:
        self.check_tokens(step)
        return self.run_ops(graph, step, _kernel_for, observer)
