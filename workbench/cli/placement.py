"""``workbench placement``: NPU/iGPU placement strategies — a projected sweep, or one strategy run here."""

from __future__ import annotations

import argparse

from .common import add_json_arg, positive_int


def add_parser(sub) -> None:
    from ..runtime.placement_platforms import PLATFORMS, STRATEGIES

    p = sub.add_parser(
        "placement",
        help="tokens/s and J/token of op placements over NPU / iGPU / CPU (projected sweep or a run)",
        description="Without --run: a sweep over the named strategies for config-only models (no weights "
        "needed): NPU times emulated (AIE cost model), iGPU times projected (roofline), transfers modeled. "
        "With --run: generate with one strategy on this machine (emulator for npu, cpu backend measured, "
        "iGPU ops projected with values from numpy, or all-igpu measured on the vulkan backend with --igpu "
        "vulkan). Strategies: " + "; ".join(f"{k}: {v}" for k, v in STRATEGIES.items()),
    )
    p.add_argument("--model", "-m", action="append", default=None,
                   help="model config preset, repeatable (default: gemma3-270m and gemma3-27b); with --run a loadable model")  # fmt: skip
    p.add_argument("--strategy", "-s", action="append", type=_strategy, default=None,
                   help="strategy, repeatable (default: all iGPU/NPU strategies), or custom:RULES, e.g. "
                   "custom:all=cpu,attn=npu or custom:layers:0-5=npu,prefill/all=npu (see docs/usage.md)")  # fmt: skip
    p.add_argument(
        "--platform", default="phoenix", choices=list(PLATFORMS), help="devices behind cpu/vulkan/npu"
    )
    p.add_argument("--quant", default="q4_k_m", help="weight format of config-only models (iGPU bytes)")
    p.add_argument("--npu-dtype", default="int8", choices=["int8", "bf16"], help="NPU weight/compute dtype")
    p.add_argument("--npu-launch", default="op", choices=["op", "segment"],
                   help="one XRT launch per NPU op, or one per run of consecutive NPU ops")  # fmt: skip
    p.add_argument(
        "--first-n", type=int, default=None, help="N of npu-first-N-layers (default: half the layers)"
    )
    p.add_argument("--context", type=positive_int, default=512, help="tokens of history for decode")
    p.add_argument("--prompt-tokens", type=positive_int, default=512, help="prompt length for prefill")
    p.add_argument(
        "--sequences", type=positive_int, default=2, help="interleaved sequences for the overlap column"
    )
    p.add_argument("--run", action="store_true", help="run one strategy here instead of projecting")
    p.add_argument("--prompt", default="The capital of France is", help="prompt for --run")
    p.add_argument("--max-tokens", type=positive_int, default=4, help="decode tokens for --run")
    p.add_argument("--igpu", default="projected", choices=["projected", "vulkan"],
                   help="--run: iGPU ops projected for the platform (values by numpy), or run all-igpu on the "
                   "vulkan backend here (measured on this host's Vulkan device)")  # fmt: skip
    add_json_arg(p)
    p.set_defaults(handler=run)


def _strategy(text: str) -> str:
    from ..runtime.placement_platforms import STRATEGIES
    from ..runtime.placement_rules import is_custom, parse_rules

    if is_custom(text):
        try:
            parse_rules(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text
    if text not in STRATEGIES:
        raise argparse.ArgumentTypeError(
            f"unknown strategy {text!r} (known: {', '.join(STRATEGIES)}, custom:RULES)"
        )
    return text


def run(args: argparse.Namespace) -> int:
    from ..runtime.placement_platforms import STRATEGIES
    from ..runtime.placement_projection import sweep
    from ..runtime.placement_run import run_placed
    from . import emit_json

    if args.run:
        return _run_here(args, run_placed, emit_json)
    models = tuple(args.model or ("gemma3-270m", "gemma3-27b"))
    strategies = tuple(args.strategy or [s for s in STRATEGIES if s != "all-cpu"])
    rows = sweep(models, strategies, platform=args.platform, quant=args.quant, context=args.context,
                 prompt_tokens=args.prompt_tokens, sequences=args.sequences, npu_dtype=args.npu_dtype,
                 first_n=args.first_n, npu_launch=args.npu_launch, progress=not args.json)  # fmt: skip
    out = {
        "platform": args.platform,
        "context": args.context,
        "prompt_tokens": args.prompt_tokens,
        "sequences": args.sequences,
        "rows": rows,
        "how": "NPU ops emulated (AIE cost model); iGPU/CPU ops projected (roofline of the device profiles); "
        "transfers modeled; energy = busy time x device active power (projected; n/a where a busy device has no power figure)",
    }
    if args.json:
        emit_json(out)
        return 0
    seq = f"decode_tok_s_{args.sequences}seq"
    print(
        f"placement sweep on {args.platform} (NPU {args.npu_dtype}, launch per {args.npu_launch}; {out['how']})"
    )
    w = max(24, *(len(r["strategy"]) for r in rows))
    print(f"{'model':<12} {'strategy':<{w}} {'decode tok/s':>12} {'J/token':>8} {f'x{args.sequences} seq tok/s':>14} "
          f"{'prefill tok/s':>13} {'J/token':>8} {'transfers':>9}")  # fmt: skip
    for r in rows:
        dj, pj = r["decode_j_per_token"], r["prefill_j_per_token"]
        print(f"{r['model']:<12} {r['strategy']:<{w}} {r['decode_tok_s']:>12.2f} {'n/a' if dj is None else f'{dj:.3f}':>8} "
              f"{r[seq]:>14.2f} {r['prefill_tok_s']:>13.1f} {'n/a' if pj is None else f'{pj:.4f}':>8} "
              f"{r['decode_transfers']:>9}")  # fmt: skip
    return 0


def _run_here(args, run_placed, emit_json) -> int:
    from .. import load

    if (args.model and len(args.model) > 1) or (args.strategy and len(args.strategy) > 1):
        raise ValueError("--run takes one --model and one --strategy")
    model = load((args.model or ["gemma3-270m"])[0])
    strategy = (args.strategy or ["npu-attention"])[0]
    ids = model.tokenizer.encode(args.prompt)
    res = run_placed(model, strategy, ids, args.max_tokens, platform=args.platform,
                     npu_dtype=args.npu_dtype, first_n=args.first_n, igpu=args.igpu)  # fmt: skip
    res["text"] = model.tokenizer.decode(res["output_ids"])
    if args.json:
        emit_json(res)
        return 0
    print(f"{strategy} on this machine, timed for {res['platform']}: {args.prompt!r} -> {res['text']!r}")
    for s in res["steps"]:
        print(f"  {s['phase']:<8} {s['tokens']:>4} tokens  step {s['step_s'] * 1e3:8.2f} ms  "
              f"{s['tokens_per_s']:9.1f} tok/s  ops {s['ops_by_device']}  transfers {s['transfers']} "
              f"(host copies measured: {s['measured_host_copies']['seconds'] * 1e6:.0f} us)")  # fmt: skip
    print("  how: " + "; ".join(sorted({h for s in res["steps"] for h in s["how"]})))
    return 0
