"""Roofline limits: bytes and FLOPs per token of a model, and the physical upper bounds they imply.

Costs come from the step graph itself (:func:`workbench.ops.kinds.step_cost`), so they count exactly
what the engine executes: weights in their stored format (the LM head in full, the embedding one row
per token), the KV cache visible at the given context, and activations.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..models.architectures import build_graph
from ..models.config import ModelConfig
from ..ops.graph import WeightSpec
from ..ops.kinds import step_cost
from .devices import DeviceProfile, get_profile

DEFAULT_COMPUTE_DTYPE = {"cpu": "fp32", "gpu": "fp16", "npu": "bf16"}


@dataclass(frozen=True)
class Limits:
    """Upper bounds for one model, precision and device. Every figure here is ``projected``."""

    model: str
    precision: str
    device: str
    device_key: str
    context: int
    prompt_tokens: int
    weight_bytes: int
    decode_bytes_per_token: float
    decode_flops_per_token: float
    prefill_flops_per_token: float
    prefill_bytes_per_token: float
    mem_bw: float
    peak_flops: float
    compute_dtype: str
    decode_tok_s: float
    prefill_tok_s: float
    decode_bound_by: str
    prefill_bound_by: str
    how: str = "projected (roofline: bandwidth and peak FLOP/s of the device profile)"

    def to_dict(self) -> dict:
        return asdict(self)


def weight_specs_for(config: ModelConfig, quant: str) -> dict[str, WeightSpec]:
    """Weight specs of a model that is not loaded: shapes of ``config`` and llama.cpp's quant plan."""
    from ..models.synth import file_weights, quant_plan
    from ..quant.formats import FORMATS

    plan, shapes = quant_plan(config, quant), file_weights(config)
    return {
        n: WeightSpec(t.name, shapes[n], FORMATS[t].nbytes(int(np.prod(shapes[n])))) for n, t in plan.items()
    }


def limits(
    config: ModelConfig,
    weights: dict[str, WeightSpec],
    device: str | DeviceProfile,
    *,
    precision: str = "",
    context: int = 512,
    prompt_tokens: int = 512,
    compute_dtype: str | None = None,
) -> Limits:
    """Decode bound at ``context`` tokens of history, prefill bound for a ``prompt_tokens`` prompt."""
    prof = device if isinstance(device, DeviceProfile) else get_profile(device)
    dtype = compute_dtype or DEFAULT_COMPUTE_DTYPE.get(prof.kind, "fp32")
    context = max(1, min(context, config.context_length))
    decode = step_cost(build_graph(config, weights, 1, 1), np.array([context - 1]))
    p = max(1, min(prompt_tokens, config.context_length))
    prefill = step_cost(build_graph(config, weights, p, 1), np.arange(p))
    peak, bw = prof.peak(dtype), prof.mem_bw
    d_bw, d_fl = bw / decode.bytes, peak / decode.flops
    p_bw, p_fl = bw / (prefill.bytes / p), peak / (prefill.flops / p)
    return Limits(
        config.name,
        precision,
        prof.name,
        prof.key,
        context,
        p,
        sum(w.nbytes for w in weights.values()),
        decode.bytes,
        decode.flops,
        prefill.flops / p,
        prefill.bytes / p,
        bw,
        peak,
        dtype,
        min(d_bw, d_fl),
        min(p_bw, p_fl),
        "memory bandwidth" if d_bw <= d_fl else "compute",
        "memory bandwidth" if p_bw < p_fl else "compute",
    )


def roofline_figure(profile: DeviceProfile, points: list[dict] | None = None, dtype: str = "fp32"):
    """A plotly roofline: attainable GFLOP/s vs arithmetic intensity, with measured points.

    ``points``: dicts with ``label``, ``intensity`` (FLOP/byte) and ``gflops`` (measured), optional ``how``.
    """
    import plotly.graph_objects as go

    peak, bw = profile.peak(dtype) / 1e9, profile.mem_bw / 1e9
    ridge = peak / bw
    xs = np.logspace(-2, max(3, np.log10(ridge) + 1.5), 200)
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=np.minimum(peak, bw * xs),
            mode="lines",
            name=f"{profile.name} roof ({dtype}: {peak:,.0f} GFLOP/s, {bw:,.1f} GB/s; {profile.how})",
        )
    )
    for p in points or []:
        fig.add_trace(
            go.Scatter(
                x=[p["intensity"]],
                y=[p["gflops"]],
                mode="markers+text",
                text=[p["label"]],
                textposition="top center",
                name=f"{p['label']} ({p.get('how', 'measured')})",
                marker={"size": 10},
            )
        )
    fig.update_layout(
        xaxis={"type": "log", "title": "arithmetic intensity (FLOP/byte)"},
        yaxis={"type": "log", "title": "GFLOP/s"},
        title=f"Roofline: {profile.name}",
        legend={"orientation": "h", "y": -0.25},
    )
    return fig
