"""``workbench speculate``: speculative decoding side by side with plain greedy decoding (speed, acceptance,
identical outputs)."""

from __future__ import annotations

import argparse
import sys

from .common import add_backend_args, add_json_arg, add_model_args, positive_int, read_prompt


def add_parser(sub) -> None:
    p = sub.add_parser(
        "speculate",
        help="speculative decoding vs plain greedy: effective tok/s, acceptance rate, identical outputs",
        description="Generate each prompt greedily with and without speculative decoding (alternating, "
        "repeats) and report decode tokens/s medians, the speedup, the acceptance rate and whether every "
        "output is identical. Without --prompt a built-in set of repetitive prompts is used.",
    )
    add_model_args(p)
    add_backend_args(p)
    p.add_argument("--prompt", default=None, help="one prompt (default: the built-in repetitive set)")
    p.add_argument("--prompt-file", default=None)
    p.add_argument("--draft", default="ngram:1-3",
                   help="draft source: ngram[:MIN-MAX] (prompt lookup), layers:N (first N layers), "
                        "quant:SPEC (re-quantized copy, e.g. quant:int4-g32); default ngram:1-3")  # fmt: skip
    p.add_argument("-k", "--draft-tokens", type=positive_int, default=7,
                   help="drafts verified per step (default 7: k+1 = 8 rows fill one row group of the cpu "
                        "backend's batched kernel)")  # fmt: skip
    p.add_argument("--max-tokens", "-n", type=positive_int, default=64)
    p.add_argument("--repeats", "-r", type=positive_int, default=3)
    p.add_argument("--no-record", action="store_true", help="do not write a run record")
    add_json_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from .. import Engine, load
    from ..bench.speculative import REPETITIVE_PROMPTS, speculative_compare
    from ..experiments.records import write_record
    from ..instrument import environment
    from ..runtime.speculative import make_drafter
    from . import emit_json

    one = args.prompt is not None or args.prompt_file is not None
    prompts = [read_prompt(args.prompt, args.prompt_file)] if one else list(REPETITIVE_PROMPTS)
    model = load(args.model)
    opts = {"threads": args.threads, "tune": args.tune}
    engine = Engine(model, args.backend, max_context=args.max_context, **opts)
    drafter = make_drafter(args.draft, model, engine.backend.name, max_context=args.max_context, **opts)
    dev = engine.backend.device.label()
    print(f"speculate: {model.name}{' (SYNTHETIC weights)' if model.synthetic else ''} on {engine.backend.name} "
          f"({dev}), draft {drafter.name}, k {args.draft_tokens}, {len(prompts)} prompts x {args.repeats}",
          file=sys.stderr, flush=True)  # fmt: skip
    try:
        out = speculative_compare(engine, drafter, prompts, args.max_tokens, args.draft_tokens, args.repeats,
                                  progress=lambda m: print(m, file=sys.stderr, flush=True))  # fmt: skip
        out = {"model": model.name, "synthetic": model.synthetic, "backend": engine.backend.name, "device": dev,
               **out}  # fmt: skip
        if not args.no_record:
            record = {"kind": "speculate", "how": out["how"], "command": " ".join(sys.argv),
                      "model": model.describe(), "backend": engine.backend.name, "device": dev,
                      "params": {"draft": args.draft, "k": args.draft_tokens, "max_tokens": args.max_tokens,
                                 "repeats": args.repeats, "prompts": prompts},
                      "environment": environment.capture(engine.backend), "results": out}  # fmt: skip
            out["record"] = str(write_record(record))
    finally:
        engine.close()
    if args.json:
        emit_json(out)
        return 0
    pl, sp, x = out["plain_decode_tok_s"], out["speculative_decode_tok_s"], out["decode_speedup"]
    print(f"{out['model']} on {out['backend']} ({dev}), {out['how']}")
    print(f"plain greedy      {pl['median']:8.1f} tok/s [{pl['lo']:.1f}, {pl['hi']:.1f}]")
    print(
        f"speculative ({out['drafter']}, k={out['k']}) {sp['median']:8.1f} tok/s [{sp['lo']:.1f}, {sp['hi']:.1f}]"
    )
    print(f"decode speedup    {x['ratio']:8.2f}x [{x['lo']:.2f}, {x['hi']:.2f}]; end to end "
          f"{out['end_to_end_speedup']['ratio']:.2f}x")  # fmt: skip
    print(
        f"acceptance rate   {out['acceptance_rate']:8.1%}; {out['tokens_per_verify_step']:.2f} tokens per verify step"
    )
    print(f"outputs identical to plain greedy: {out['identical']}")
    if "record" in out:
        print(f"record: {out['record']}")
    return 0 if out["identical"] else 1
