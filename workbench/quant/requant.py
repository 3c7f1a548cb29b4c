"""Re-quantize any loaded model into the planar formats, per a mixed-precision spec.

The source of each weight is the best the model has: its stored values dequantized to float32 (exact for
every GGUF block format). When those are themselves quantized (the default model is Q4_K_M) the result
carries that error too, and the variant's notes say so: "fp32" of a Q4_K_M model is dequantized Q4_K_M.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from tqdm.auto import tqdm

from ..models.model import Model
from ..models.weights import Weights
from .planar import NM_KINDS, PlanarFormat, PlanarTensor, make_planar
from .spec import QuantSpec, parse_spec
from .variant import VariantModel, make_variant

EXACT_SOURCES = ("F32",)


def source_name(tensor) -> str:
    """What a weight's values are: its GGUF type name, or the planar format (and its own source)."""
    if isinstance(tensor, PlanarTensor):
        return f"{tensor.type.name} (from {tensor.source})" if tensor.source else tensor.type.name
    return tensor.type.name


def keeps_nm(src, fmt: PlanarFormat) -> PlanarFormat:
    """``fmt``, compressed N:M like ``src`` where ``src`` is N:M and ``fmt`` can hold it (else dense)."""
    nm = src.type.nm if isinstance(src, PlanarTensor) else None
    return replace(fmt, nm=nm) if nm and fmt.kind in NM_KINDS and not fmt.act8 else fmt


def requantize(model: Model, spec: str | QuantSpec, progress: bool = True) -> VariantModel:
    """A variant of ``model`` whose matmul weights are stored as ``spec`` says (others kept as they are)."""
    if isinstance(spec, str):
        spec = parse_spec(spec, model.config.n_layers)
    chosen = {name: spec.format_for(name) for name in model.weights}
    todo = [n for n, f in chosen.items() if f is not None]
    tensors = dict(model.weights.items())
    sources: Counter[str] = Counter()
    formats: Counter[str] = Counter()
    nm_dense = 0  # N:M sparse sources stored dense (their format has no N:M storage)
    for name in tqdm(todo, desc=f"requantize {spec.text}", unit="tensor", disable=not progress or not todo):
        src = model.weights[name]
        fmt = keeps_nm(src, chosen[name])
        if isinstance(src, PlanarTensor) and src.type.nm and not fmt.nm:
            nm_dense += 1
        sources[source_name(src)] += 1
        formats[fmt.name] += 1
        w = src.dequantize().reshape(src.rows, src.cols)
        tensors[name] = make_planar(name, w, fmt, source_name(src))
    inexact = sorted(s for s in sources if s not in EXACT_SOURCES)
    notes = {
        "quant": spec.text,
        "formats": dict(formats),
        "kept_native": len(chosen) - len(todo),
        "source_types": dict(sources),
        "source_note": (
            f"re-quantized from the model's own {'/'.join(inexact)} values dequantized to float32: the source "
            "is itself quantized, so every format here (fp32 included) carries that error"
            if inexact
            else "re-quantized from float32 weights"
        )
        if todo
        else "no weight re-quantized",
    }
    if nm_dense:
        notes["nm_stored_dense"] = (
            f"{nm_dense} N:M-pruned weights re-quantized to a format without N:M storage (int4, +a8): their "
            "zeros are stored and computed densely"
        )
    return make_variant(model, Weights(tensors, model.weights.source), notes=notes)
