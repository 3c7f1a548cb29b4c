"""Re-quantize any loaded model into the planar formats, per a mixed-precision spec.

The source of each weight is the best the model has: its stored values dequantized to float32 (exact for
every GGUF block format). When those are themselves quantized (the default model is Q4_K_M) the result
carries that error too, and the variant's notes say so: "fp32" of a Q4_K_M model is dequantized Q4_K_M.
"""

from __future__ import annotations

from collections import Counter

from tqdm.auto import tqdm

from ..models.model import Model
from ..models.weights import Weights
from .planar import PlanarTensor, make_planar
from .spec import QuantSpec, parse_spec
from .variant import VariantModel, make_variant

EXACT_SOURCES = ("F32",)


def source_name(tensor) -> str:
    """What a weight's values are: its GGUF type name, or the planar format (and its own source)."""
    if isinstance(tensor, PlanarTensor):
        return f"{tensor.type.name} (from {tensor.source})" if tensor.source else tensor.type.name
    return tensor.type.name


def requantize(model: Model, spec: str | QuantSpec, progress: bool = True) -> VariantModel:
    """A variant of ``model`` whose matmul weights are stored as ``spec`` says (others kept as they are)."""
    if isinstance(spec, str):
        spec = parse_spec(spec, model.config.n_layers)
    chosen = {name: spec.format_for(name) for name in model.weights}
    todo = [n for n, f in chosen.items() if f is not None]
    tensors = dict(model.weights.items())
    sources: Counter[str] = Counter()
    formats: Counter[str] = Counter()
    for name in tqdm(todo, desc=f"requantize {spec.text}", unit="tensor", disable=not progress or not todo):
        src = model.weights[name]
        fmt = chosen[name]
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
    return make_variant(model, Weights(tensors, model.weights.source), notes=notes)
