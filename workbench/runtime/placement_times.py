"""Seconds of one op on a device of a placement platform, and of one transfer between two devices.

NPU ops are ``emulated`` (the AIE cost model of the design the npu backend runs); GPU/CPU ops ``projected``
(roofline of the device profile with the efficiency factors of
:mod:`workbench.runtime.placement_platforms`); transfers ``modeled``. Every function returns
``(seconds, how)``, except :func:`roofline_seconds`.
"""

from __future__ import annotations

import numpy as np

from ..instrument.devices import DeviceProfile
from ..ops.graph import Graph, Op
from ..ops.kinds import distinct_keys, op_cost
from .placement_platforms import (
    BW_EFFICIENCY,
    DISPATCH_S,
    FLOP_EFFICIENCY,
    PCIE_BW,
    PCIE_LATENCY_S,
    SPARSE_KINDS,
    SPARSE_ROUND,
    SYNC_S,
    Platform,
)


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


def npu_launch_seconds(platform: Platform) -> float:
    """Seconds of one XRT launch on the platform's NPU (what a launch shared by a segment saves)."""
    from ..backends.npu.arch import get_array

    return get_array(platform.profiles["npu"]).launch_s


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


def kept_units(op: Op, graph: Graph) -> int | None:
    """Units a decode step's skipping keeps in ``op`` (a sparse layer's up or down projection): the FFN
    width times 1 - the layer's sparsity, rounded up to ``SPARSE_ROUND``; None for any other op."""
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
