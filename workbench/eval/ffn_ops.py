"""The FFN block of one layer, dense vs variant, op handlers side by side (the kernel's own speed).

Whole decode steps mix in everything around the FFN (cold caches, the dense model's compiled step
program); this runs only the FFN-block ops of one layer of both one-token graphs on the ``cpu`` backend,
alternating, on the same random input, so the ratio isolates the kernels. Caches stay warm (one layer's
weights are re-read): it is an upper bound of what the kernel gains, measured here.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from ..backends.base import Step
from ..runtime.engine import Engine
from .op_names import FFN_OP


def _ffn_ops(engine: Engine, layer: int) -> tuple[list, dict[str, np.ndarray]]:
    graph = engine.backend.prepare_graph(engine.model.graph(1, 1))
    ops = [op for op in graph.ops if op.layer == layer and FFN_OP.match(op.name)]
    rng = np.random.default_rng(layer)
    env = {n: rng.standard_normal(graph.tensors[n].shape).astype(np.float32)
           for op in ops for n in op.inputs if n in graph.tensors}  # fmt: skip
    return ops, env


def ffn_layer_times(ref: Engine, var: Engine, layer: int, repeats: int) -> dict[str, float]:
    """Median seconds of the FFN-block ops of ``layer`` for the reference and the variant (cpu only)."""
    if ref.backend.name != "cpu" or var.backend.name != "cpu":
        raise ValueError("the FFN layer timing runs the cpu backend's op handlers: use --backend cpu")
    if not 0 <= layer < var.model.config.n_layers:
        raise ValueError(f"layer {layer} does not exist (the model has {var.model.config.n_layers})")
    from ..backends.numba_cpu import HANDLERS

    sides = {"ref": (ref, *_ffn_ops(ref, layer)), "var": (var, *_ffn_ops(var, layer))}
    times: dict[str, list[float]] = {"ref": [], "var": []}
    for i in range(repeats + 3):  # 3 warm-up rounds
        for key, (e, ops, env) in sides.items():
            step = Step.single(e.new_sequence(4).cache, [1], 0, "last", "decode")
            t0 = time.perf_counter()
            for op in ops:
                HANDLERS[op.kind](e.backend, op, env, step)
            if i >= 3:
                times[key].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"ffn_layer": layer, "ffn_layer_us": 1e6 * med["var"], "ffn_layer_us_ref": 1e6 * med["ref"],
            "ffn_layer_speedup": med["ref"] / med["var"], "ffn_layer_repeats": repeats}  # fmt: skip
