"""``workbench generate``: generate text, streamed to the terminal or as one JSON object."""

from __future__ import annotations

import argparse
import sys

from .common import add_backend_args, add_json_arg, add_model_args, non_negative_int, read_prompt


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text from a prompt",
        description="Generate text. Special tokens in the prompt (e.g. <start_of_turn>) are "
        "recognized; BOS is added as the model's metadata says.",
    )
    add_model_args(p)
    add_backend_args(p)
    p.add_argument("--prompt", "-p", help="prompt text")
    p.add_argument("--prompt-file", help="read the prompt from this file")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in a Gemma 3 user turn")
    p.add_argument("--max-tokens", "-n", type=non_negative_int, default=64)
    p.add_argument("--temperature", "-t", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=non_negative_int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--top-logits",
        type=non_negative_int,
        default=0,
        help="report the K highest raw logits of the next token after the prompt",
    )
    p.add_argument(
        "--profile", action="store_true", help="record per-op rows (in the run record) and print a summary"
    )
    p.add_argument("--trace", default=None, help="write a Chrome/Perfetto trace of the run to this path")
    p.add_argument("--no-record", action="store_true", help="do not write a run record under experiments/")
    add_json_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from .. import Engine, SamplingParams, load
    from ..experiments.records import write_record
    from ..instrument import environment
    from ..instrument.profiler import Profiler, by_kind, by_placement
    from . import emit_json

    prompt = read_prompt(args.prompt, args.prompt_file)
    sampling = SamplingParams(
        args.temperature, args.top_k, args.top_p, args.min_p, args.repetition_penalty, args.seed
    )
    model = load(args.model)
    profiler = Profiler() if (args.profile or args.trace) else None
    engine = Engine(
        model,
        args.backend,
        max_context=args.max_context,
        observer=profiler,
        threads=args.threads,
        tune=args.tune,
    )
    try:
        show = None
        if not args.json:

            def show(text: str) -> None:
                sys.stdout.write(text)
                sys.stdout.flush()

        result = engine.generate(
            prompt, args.max_tokens, sampling, chat=args.chat, on_text=show, top_logits=args.top_logits
        )
        out = {
            "model": model.name,
            "model_kind": model.kind,
            **result.to_dict(),
            "sampling": sampling.to_dict(),
        }
        if model.synthetic:
            out["timing"] += ", synthetic weights"
        tables = {}
        if profiler is not None:
            tables = {"ops": profiler.dataframe(), "steps": profiler.step_frame()}
            if args.trace:
                from ..instrument.trace import write_trace

                out["trace"] = str(write_trace(profiler, args.trace))
        if not args.no_record:
            record = {
                "kind": "generate",
                "how": f"measured on {result.device}",
                "command": " ".join(sys.argv),
                "model": model.describe(),
                "backend": result.backend,
                "device": result.device,
                "params": {
                    "prompt": prompt,
                    "max_tokens": args.max_tokens,
                    "chat": args.chat,
                    "sampling": sampling.to_dict(),
                },
                "environment": environment.capture(engine.backend),
                "results": out,
            }
            out["record"] = str(write_record(record, tables))
        if args.json:
            emit_json(out)
            return 0
        sys.stdout.write("\n")
        if result.top_logits:
            tok = model.tokenizer
            for i, lg in zip(result.top_logits["ids"], result.top_logits["logits"]):
                print(f"  {i:>7} {tok.piece(i)!r:<20} {lg:9.4f}", file=sys.stderr)
        if profiler is not None:
            ops = tables["ops"]
            view = (
                by_kind(ops) if ops["timing"].nunique() <= 1 else by_placement(ops)
            )  # say how each time was got
            print(view[["calls", "time_s", "share", "gbps", "gflops"]].to_string(), file=sys.stderr)
        print(
            f"[{result.backend} on {result.device}: prompt {len(result.input_ids)} tokens at "
            f"{result.prefill_tok_s:.1f} tok/s, {len(result.output_ids)} generated at {result.decode_tok_s:.1f} "
            f"tok/s ({out['timing']}); stop: {result.finish_reason}]",
            file=sys.stderr,
        )
        return 0
    finally:
        engine.close()
