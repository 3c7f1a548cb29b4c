"""The cpu backend's op handlers: one function per op kind (fused kinds included) that runs it on a step's
tensors, for steps that run op by op (one-token steps run the compiled program of :mod:`.program` instead).
``HANDLERS`` maps each kind to its handler, with those of :mod:`.sparse` and :mod:`.gemma3n`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ...ops.graph import Op
from ..base import Step
from . import gemma3n as g3
from . import kernels as k
from . import sparse as sp

if TYPE_CHECKING:
    from . import CpuBackend

Env = dict[str, np.ndarray]

Handler = Callable[["CpuBackend", Op, Env, Step], None]


def _out(env: Env, name: str, like: np.ndarray, cols: int | None = None) -> np.ndarray:
    arr = np.empty((like.shape[0], cols or like.shape[1]), np.float32)
    env[name] = arr
    return arr


def _embed(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    out = b.weights[op.weights[0]].gather(env[op.inputs[0]])
    k.scale_rows(out, op.attrs["scale"])
    env[op.outputs[0]] = out


def _rmsnorm(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    x = env[op.inputs[0]]
    w = b.norms[op.weights[0]]
    k.rmsnorm(x, w, op.attrs["eps"], op.attr("group") or x.shape[1], _out(env, op.outputs[0], x))


def _matmul(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    env[op.outputs[0]] = b.project(env[op.inputs[0]], op.weights)[0]


def _rope(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    x = env[op.inputs[0]]
    cos, sin = b.rope_tables(op, env[op.inputs[1]])
    k.rope(x, cos, sin, op.attrs["head_dim"], _out(env, op.outputs[0], x))


def _attention(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    a = op.attrs
    q, key, v, pos = (env[n] for n in op.inputs)
    out = _out(env, op.outputs[0], q)
    for s in step.seqs:
        layer = s.cache.layers[op.layer]
        sl = slice(s.start, s.stop)
        if s.stop - s.start == 1:  # decode: one numba call over the cache slots in place
            layer.write(pos[sl], key[sl], v[sl])
            p = int(pos[s.start])
            k.attend_one(q[s.start], layer.keys, layer.values, layer.pos, min(layer.capacity, p + 1), p,
                         a["n_heads"], a["head_dim"], a["scale"], a.get("window", 0), out[s.start])  # fmt: skip
        else:
            keys, vals, kpos = layer.append(pos[sl], key[sl], v[sl])
            k.attend_rows(q[sl], keys, vals, kpos, pos[sl].astype(np.int64), a["n_heads"], a["head_dim"],
                          a["scale"], a.get("window", 0), out[sl])  # fmt: skip


def _gelu_mul(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    _gelu(env[op.inputs[0]], env[op.inputs[1]], op.outputs[0], env)


def _add(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    x, y = env[op.inputs[0]], env[op.inputs[1]]
    k.add(x, y, _out(env, op.outputs[0], x))


def _gather_rows(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    x, rows = env[op.inputs[0]], env[op.inputs[1]]
    env[op.outputs[0]] = x if len(rows) == len(x) and (rows == np.arange(len(x))).all() else x[rows]


def _softcap(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    x = env[op.inputs[0]]
    k.softcap(x, op.attrs["cap"], _out(env, op.outputs[0], x))


def _norm_project(b: CpuBackend, norm: Op, mats: list[Op], env: Env) -> None:
    x = env[norm.inputs[0]]
    h = np.empty_like(x)
    k.rmsnorm(x, b.norms[norm.weights[0]], norm.attrs["eps"], x.shape[1], h)
    for m, y in zip(mats, b.project(h, tuple(m.weights[0] for m in mats)), strict=True):
        env[m.outputs[0]] = y


def _rmsnorm_matmul(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    norm, *mats = op.attrs["parts"]
    _norm_project(b, norm, mats, env)


def _rmsnorm_matmul_gelu(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    norm, *mats, act = op.attrs["parts"]
    local = {norm.inputs[0]: env[norm.inputs[0]]}
    _norm_project(b, norm, mats, local)
    _gelu(local[act.inputs[0]], local[act.inputs[1]], act.outputs[0], env)


def _gelu(g: np.ndarray, u: np.ndarray, name: str, env: Env) -> None:
    # the numba kernel at any row count: one thread (a parallel loop here would wake numba's thread pool
    # between BLAS calls, and the two pools then fight over the cores), faster than numpy's even for
    # prefill (figures: docs/backend-cpu.md#elementwise-kernels)
    k.gelu_mul(g, u, _out(env, name, g))


def _rmsnorm_rope(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    norm, rope = op.attrs["parts"]
    x = env[norm.inputs[0]]
    cos, sin = b.rope_tables(rope, env[rope.inputs[1]])
    k.rmsnorm_rope(x, b.norms[norm.weights[0]], norm.attrs["eps"], cos, sin, rope.attrs["head_dim"],
                   _out(env, op.outputs[0], x))  # fmt: skip


def _matmul_rmsnorm_add(b: CpuBackend, op: Op, env: Env, step: Step) -> None:
    mat, norm, addop = op.attrs["parts"]
    y = b.project(env[mat.inputs[0]], mat.weights)[0]
    residual = env[next(t for t in addop.inputs if t != norm.outputs[0])]
    k.rmsnorm_add(
        y, b.norms[norm.weights[0]], norm.attrs["eps"], residual, _out(env, op.outputs[0], residual)
    )


HANDLERS: dict[str, Handler] = {
    "embed": _embed,
    "rmsnorm": _rmsnorm,
    "matmul": _matmul,
    "rope": _rope,
    "attention": _attention,
    "gelu_mul": _gelu_mul,
    "add": _add,
    "gather_rows": _gather_rows,
    "softcap": _softcap,
    "rmsnorm_matmul": _rmsnorm_matmul,
    "rmsnorm_matmul_gelu": _rmsnorm_matmul_gelu,
    "rmsnorm_rope": _rmsnorm_rope,
    "matmul_rmsnorm_add": _matmul_rmsnorm_add,
    **sp.HANDLERS,
    **g3.HANDLERS,
}
