"""Build the variant of a model that a quantization spec and a sparsity spec describe."""

from __future__ import annotations

from functools import partial

from ..models.model import Model
from ..quant.requant import requantize
from ..quant.spec import parse_spec
from ..quant.variant import VariantModel, make_variant
from .attention import block_sparse, local_window
from .ffn import sparsify_ffn
from .nm import prune_weights
from .spec import parse_sparsity


def build_variant(
    model: Model, quant: str = "native", sparsity: str = "none", progress: bool = True
) -> VariantModel:
    """N:M pruning first (from the best source), then re-quantization, then the graph rewrites."""
    n_layers = model.config.n_layers
    qspec = parse_spec(quant, n_layers)
    sspec = parse_sparsity(sparsity, n_layers)
    variant = make_variant(model, notes={"sparsity": sspec.text})
    if sspec.nm is not None:
        weights, count = prune_weights(model.weights, sspec.nm, n_layers)
        variant = make_variant(variant, weights, notes={"nm_pruned_tensors": count,
                                                        "nm_note": f"pruned weights stored compressed ({sspec.nm.n}:"
                                                        f"{sspec.nm.m}, fp32 values unless the quant spec re-quantizes "
                                                        "them): the cpu backend's N:M kernels read only kept values"})  # fmt: skip
    if not qspec.is_native:
        variant = requantize(variant, qspec, progress)
    else:
        variant.notes["quant"] = "native"
    rewrites = []
    if sspec.ffn is not None:
        rewrites.append(partial(sparsify_ffn, spec=sspec.ffn))
    if sspec.attn_window:
        rewrites.append(partial(local_window, window=sspec.attn_window))
    if sspec.attn_blocks is not None:
        rewrites.append(partial(block_sparse, spec=sspec.attn_blocks))
    return make_variant(variant, rewrites=tuple(rewrites)) if rewrites else variant
