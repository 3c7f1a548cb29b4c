"""N:M weight sparsity by magnitude pruning: in every M consecutive inputs of a row, keep the N largest |w|.

Pruned weights are stored compressed (``fp32-nmN:M``, :mod:`workbench.quant.nm_store`): backends with an
N:M kernel read only the kept values; a quantization spec applied afterwards keeps the compression for
fp16/bf16/int8 values (:func:`workbench.quant.requant.requantize`)."""

from __future__ import annotations

import numpy as np

from ..models.model import Model
from ..models.weights import Weights
from ..quant.nm_store import expand
from ..quant.planar import FormatError, PlanarFormat, PlanarTensor, make_planar
from ..quant.requant import source_name
from ..quant.variant import VariantModel, make_variant
from .spec import NMSparsity


def prune_nm(w: np.ndarray, n: int, m: int, what: str = "tensor") -> np.ndarray:
    """``w`` (rows, cols) with all but the ``n`` largest magnitudes of each ``m`` inputs set to zero."""
    rows, cols = w.shape
    if cols % m:
        raise FormatError(
            f"{what}: N:M {n}:{m} does not divide the input dimension {cols} (not a multiple of {m})"
        )
    g = w.reshape(rows, cols // m, m)
    drop = np.argsort(np.abs(g), axis=2, kind="stable")[:, :, : m - n]
    out = g.copy()
    np.put_along_axis(out, drop, 0.0, axis=2)
    return out.reshape(rows, cols)


def prune_weights(weights: Weights, spec: NMSparsity, n_layers: int) -> tuple[Weights, int]:
    """The weights with the selected layer matmuls pruned (compressed N:M, fp32 values: exact); and how many
    were pruned."""
    tensors = dict(weights.items())
    count = 0
    for layer in range(n_layers):
        if spec.layers is not None and layer not in spec.layers:
            continue
        for kind in spec.kinds:
            name = f"blk.{layer}.{kind}.weight"
            src = weights[name]
            w = src.dequantize().reshape(src.rows, src.cols)
            note = f"{source_name(src)} pruned {spec.n}:{spec.m}"
            tensors[name] = make_planar(
                name, prune_nm(w, spec.n, spec.m, name), PlanarFormat("fp32", nm=(spec.n, spec.m)), note
            )
            count += 1
    return Weights(tensors, weights.source), count


def dense_twin(model: Model) -> VariantModel:
    """``model`` with every compressed N:M weight stored dense in its value format (the same values, zeros
    included): what the N:M kernels are measured against."""
    tensors = dict(model.weights.items())
    count = 0
    for name, t in tensors.items():
        if isinstance(t, PlanarTensor) and t.type.nm:
            planes = {k: v for k, v in t.planes.items() if k != "idx"}
            planes["q"] = expand(planes["q"], t.planes["idx"], *t.type.nm)
            tensors[name] = PlanarTensor(name, t.type.values, t.shape, planes, t.source, t.norm_offset)
            count += 1
    return make_variant(model, Weights(tensors, model.weights.source), notes={"nm_dense_twin": count})


def nm_weight_count(model: Model) -> int:
    """How many weights of ``model`` are stored compressed N:M."""
    return sum(1 for t in model.weights.values() if isinstance(t, PlanarTensor) and t.type.nm)
