"""``workbench bench-batch``: aggregate decode tokens/s and latency vs batch size, beside the bandwidth bound."""

from __future__ import annotations

import argparse
import sys

from .common import add_backend_args, add_json_arg, add_model_args, positive_int


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be >= 1, got {text!r}")
    return sizes


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench-batch",
        help="batched decode: aggregate tok/s and latency vs batch size (medians, ratio to batch 1, bound)",
        description="Decode B sequences in one step for each batch size B (sizes interleaved, repeats), "
        "report aggregate tokens/s medians with intervals, the ratio to batch 1 from the same run, "
        "per-token latency, and the bandwidth bound of the batched step; --prompt-lengths adds an "
        "end-to-end sweep through the continuous-batching scheduler. Writes a run record.",
    )
    add_model_args(p)
    add_backend_args(p)
    p.add_argument(
        "--batch-sizes", type=_sizes, default=[1, 2, 4, 8], help="comma-separated (default 1,2,4,8)"
    )
    p.add_argument("--prompt-tokens", "-p", type=positive_int, default=64)
    p.add_argument("--gen-tokens", "-g", type=positive_int, default=32)
    p.add_argument("--repeats", "-r", type=positive_int, default=5)
    p.add_argument("--warmups", type=int, default=1, help="short warm-up runs per batch size (0: none)")
    p.add_argument("--warmup-seconds", type=float, default=2.0,
                   help="warm each batch size up for at least this long (new GPU pipelines start slow)")  # fmt: skip
    p.add_argument("--prompt-lengths", type=_sizes, default=None,
                   help="also run requests end to end through the scheduler at these prompt lengths")  # fmt: skip
    p.add_argument("--no-record", action="store_true", help="do not write a run record")
    add_json_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from .. import Engine, load
    from ..bench.batching import decode_sweep, request_sweep
    from ..experiments.records import write_record
    from ..instrument import environment
    from . import emit_json

    model = load(args.model)
    longest = max([args.prompt_tokens, *(args.prompt_lengths or [])]) + args.gen_tokens + 1
    engine = Engine(model, args.backend, max_context=args.max_context or longest, threads=args.threads,
                    tune=args.tune)  # fmt: skip

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    dev = engine.backend.device.label()
    log(f"bench-batch: {model.name}{' (SYNTHETIC weights)' if model.synthetic else ''} on {engine.backend.name} "
        f"({dev}), batch sizes {args.batch_sizes}, prompt {args.prompt_tokens}, gen {args.gen_tokens}, "
        f"{args.repeats} repeats")  # fmt: skip
    try:
        rows = decode_sweep(engine, args.batch_sizes, args.prompt_tokens, args.gen_tokens, args.repeats,
                            args.warmups, progress=log, warmup_s=args.warmup_seconds)  # fmt: skip
        requests = (
            request_sweep(engine, args.batch_sizes, args.prompt_lengths, args.gen_tokens, progress=log)
            if args.prompt_lengths
            else []
        )
        out = {
            "model": model.name,
            "synthetic": model.synthetic,
            "backend": engine.backend.name,
            "device": dev,
            "how": f"measured on {dev} (host wall clock); bounds projected",
            "decode": rows,
            "requests": requests,
        }
        if not args.no_record:
            record = {"kind": "bench-batch", "how": out["how"], "command": " ".join(sys.argv),
                      "model": model.describe(), "backend": engine.backend.name, "device": dev,
                      "params": {k: getattr(args, k) for k in ("batch_sizes", "prompt_tokens", "gen_tokens",
                                                              "repeats", "prompt_lengths")},
                      "environment": environment.capture(engine.backend), "results": out}  # fmt: skip
            out["record"] = str(write_record(record))
    finally:
        engine.close()
    if args.json:
        emit_json(out)
        return 0
    print(f"{out['model']} on {out['backend']} ({dev}): batched decode, {out['how']}")
    print(
        f"{'batch':>5} {'tok/s (median [95% CI])':>28} {'x batch 1':>10} {'step p50 ms':>12} {'bound tok/s':>12}"
    )
    for r in rows:
        d, ratio = r["decode_tok_s"], r.get("vs_batch1", {}).get("ratio", float("nan"))
        bound = r.get("bound_tok_s", float("nan"))
        print(f"{r['batch']:>5} {d['median']:>10.1f} [{d['lo']:7.1f}, {d['hi']:7.1f}] {ratio:>10.2f} "
              f"{r['step_latency_s']['p50'] * 1e3:>12.1f} {bound:>12.0f}")  # fmt: skip
    if rows and "bound_how" in rows[0]:
        print(f"bound: {rows[0]['bound_how']}")
    for r in requests:
        print(f"requests: prompt {r['prompt_tokens']:>5}, batch {r['batch']:>3}: {r['aggregate_tok_s']:8.1f} tok/s, "
              f"ttft {r['ttft_s']:.3f} s, latency {r['request_latency_s']:.2f} s")  # fmt: skip
    if "record" in out:
        print(f"record: {out['record']}")
    return 0
