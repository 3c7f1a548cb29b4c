"""The share of FFN units actually zeroed per layer on a text: what Gemma 3n's Gaussian top-k leaves a
sparse layer's up and down projections to skip.

A unit of layer *l* is zeroed for a token when the gate value entering ``gelu_mul`` is exactly 0 (the
Gaussian top-k's ``relu`` output; ``gelu_tanh(0) = 0``), so its up-projection row and down-projection
column contribute nothing. The numpy reference runs the model and counts those zeros per layer; dense
layers are counted the same way (exact zeros there are rare). The target is the layer's configured
sparsity (0.95 on E2B's layers 0-9): the top-k keeps values above mean + 1.645 std of each token's gate,
which zeroes about 95 % only if the gate values are Gaussian.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..backends.base import OpObserver, Step
from ..backends.numpy_ref import KERNELS, NumpyBackend
from ..models.model import Model
from ..ops.graph import Graph, Op
from ..runtime.engine import Engine


class ZeroCountingBackend(NumpyBackend):
    """The numpy reference, counting per layer the exact zeros of the gate each ``gelu_mul`` receives."""

    def __init__(self, model: Model, threads: int | None = None) -> None:
        super().__init__(model, threads)
        self.zeros: dict[int, int] = {}
        self.units: dict[int, int] = {}

    def _kernel(self, op: Op) -> Callable | None:
        kernel = KERNELS.get(op.kind)
        if op.kind != "gelu_mul" or kernel is None or op.layer is None:
            return kernel

        def counting(b: ZeroCountingBackend, o: Op, env: dict, step: Step) -> None:
            gate = env[o.inputs[0]]
            b.zeros[o.layer] = b.zeros.get(o.layer, 0) + int(np.count_nonzero(gate == 0))
            b.units[o.layer] = b.units.get(o.layer, 0) + gate.size
            kernel(b, o, env, step)

        return counting

    def run(self, graph: Graph, step: Step, observer: OpObserver | None = None) -> np.ndarray:
        self.check_tokens(step)
        return self.run_ops(graph, step, self._kernel, observer)


def ffn_zero_share(model: Model, token_ids: list[int], prefill_chunk: int = 64) -> list[dict]:
    """One row per layer: ``layer``, ``target`` (configured sparsity), ``zeroed`` (share of FFN units whose
    gate was exactly 0 over ``token_ids``, run as a prefill in chunks), ``tokens``, ``ffn``."""
    backend = ZeroCountingBackend(model)
    engine = Engine(model, backend, prefill_chunk=prefill_chunk)
    engine.forward(engine.new_sequence(len(token_ids)), token_ids)
    c = model.config
    target = c.activation_sparsity or (0.0,) * c.n_layers
    return [
        {
            "layer": layer,
            "target": float(target[layer]),
            "zeroed": backend.zeros.get(layer, 0) / max(1, backend.units.get(layer, 0)),
            "tokens": len(token_ids),
            "ffn": c.ffn,
        }
        for layer in range(c.n_layers)
    ]


__all__ = ["ZeroCountingBackend", "ffn_zero_share"]
