"""``workbench limits``: the roofline bound on decode and prefill tokens/s for a model on a device."""

from __future__ import annotations

import argparse

from .common import add_json_arg


def add_parser(sub) -> None:
    p = sub.add_parser("limits", help="physical upper bounds (roofline) on tokens/s for a model and device")
    p.add_argument(
        "--model",
        "-m",
        default="gemma3-270m",
        help="a loadable model (real weight sizes) or a config name such as gemma3-27b (with --quant)",
    )
    p.add_argument(
        "--device", "-d", default="host", help="host, 780m, npu1, hawkpoint, 890m, npu2, h100, h200"
    )
    p.add_argument("--quant", default=None, help="quantization for config-only models (default q4_k_m)")
    p.add_argument("--context", type=int, default=512, help="tokens of history for the decode bound")
    p.add_argument("--prompt-tokens", type=int, default=512, help="prompt length for the prefill bound")
    p.add_argument(
        "--dtype", default=None, help="compute dtype for the FLOP/s peak (default: by device kind)"
    )
    p.add_argument(
        "--plot", default=None, help="write a roofline HTML (plotly) with measured bench points to PATH"
    )
    p.add_argument("--remeasure", action="store_true",
                   help="measure this host's bandwidth and FLOP/s again (cached per machine otherwise)")  # fmt: skip
    add_json_arg(p)
    p.set_defaults(handler=run)


def resolve_model(spec: str, quant: str | None):
    """(config, weight specs, precision label) for a loadable model or a preset name."""
    from ..instrument.roofline import weight_specs_for
    from ..models.config import PRESETS

    if spec.lower() in PRESETS and (quant or spec.lower() != "gemma3-270m"):
        q = quant or "q4_k_m"
        return PRESETS[spec.lower()], weight_specs_for(PRESETS[spec.lower()], q), q
    from .. import load

    model = load(spec)
    if quant:
        return model.config, weight_specs_for(model.config, quant), quant
    types = model.weights.type_table()
    return model.config, model.weight_specs(), "+".join(sorted(types))


def run(args: argparse.Namespace) -> int:
    from ..instrument.devices import get_profile, host_profile
    from ..instrument.roofline import limits
    from . import emit_json

    if args.remeasure:
        host_profile(refresh=True)
    config, specs, precision = resolve_model(args.model, args.quant)
    lim = limits(
        config,
        specs,
        args.device,
        precision=precision,
        context=args.context,
        prompt_tokens=args.prompt_tokens,
        compute_dtype=args.dtype,
    )
    out = lim.to_dict()
    if args.plot:
        out["plot"] = str(write_plot(lim, config, args.device, args.plot))
    if args.json:
        emit_json(out)
        return 0
    print(f"{lim.model} ({lim.precision}, {lim.weight_bytes / 2**20:.1f} MiB of weights) on {lim.device}")
    print(
        f"  decode:  {lim.decode_bytes_per_token / 1e6:.1f} MB and {lim.decode_flops_per_token / 1e9:.2f} GFLOP per "
        f"token at context {lim.context} -> at most {lim.decode_tok_s:,.1f} tok/s ({lim.decode_bound_by} bound)"
    )
    print(
        f"  prefill: {lim.prefill_flops_per_token / 1e9:.2f} GFLOP per token ({lim.prompt_tokens}-token prompt) "
        f"-> at most {lim.prefill_tok_s:,.0f} tok/s ({lim.prefill_bound_by} bound, {lim.compute_dtype} peak)"
    )
    print(f"  device: {lim.mem_bw / 1e9:.1f} GB/s, {lim.peak_flops / 1e12:.2f} TFLOP/s; {lim.how}")
    print(f"  device profile: {get_profile(args.device).how}")
    if args.plot:
        print(f"  plot: {out['plot']}")
    return 0


def measured_points(lim, device: str) -> list[dict]:
    """Bench records of this model on this device, as roofline points (decode and prefill medians)."""
    from ..experiments.records import load_runs
    from ..instrument.devices import get_profile

    runs = load_runs(kind="bench")
    key = get_profile(device).key
    points = []
    for r in runs.to_dict("records") if not runs.empty else []:
        if r.get("model.name") != lim.model:
            continue
        dev_kind = r.get("environment.device.profile") or (
            "host" if r.get("environment.device.kind") == "cpu" else ""
        )
        if dev_kind != key:
            continue
        label = f"{r.get('backend')} {r.get('run_id', '')[-8:]}"
        d = r.get("results.decode_tok_s")
        p = r.get("results.prefill_tok_s")
        if d:
            points.append(
                {
                    "label": f"decode {label}",
                    "intensity": lim.decode_flops_per_token / lim.decode_bytes_per_token,
                    "gflops": d * lim.decode_flops_per_token / 1e9,
                    "how": r.get("how", "measured"),
                }
            )
        if p:
            points.append(
                {
                    "label": f"prefill {label}",
                    "intensity": lim.prefill_flops_per_token / lim.prefill_bytes_per_token,
                    "gflops": p * lim.prefill_flops_per_token / 1e9,
                    "how": r.get("how", "measured"),
                }
            )
    return points


def write_plot(lim, config, device: str, path: str):
    from pathlib import Path

    from ..instrument.devices import get_profile
    from ..instrument.roofline import roofline_figure

    fig = roofline_figure(get_profile(device), measured_points(lim, device), lim.compute_dtype)
    fig.update_layout(
        title=f"{lim.model} on {lim.device}: decode <= {lim.decode_tok_s:,.0f} tok/s, "
        f"prefill <= {lim.prefill_tok_s:,.0f} tok/s (projected)"
    )
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(out, include_plotlyjs=True)
    return out
