"""``workbench eval``: accuracy (and speed) of a quantized / sparse variant against the unmodified model."""

from __future__ import annotations

import argparse

from .common import add_json_arg, add_model_args, non_negative_int, positive_int


def add_parser(sub) -> None:
    p = sub.add_parser(
        "eval",
        help="perplexity, KL, top-1 and greedy agreement (and decode speed) of a quantized / sparse variant",
        description="Evaluate a variant of a model (re-quantized weights, sparsity) against the unmodified "
        "model on a public-domain English text shipped with workbench. Quant specs: fp32, fp16, bf16, int8, "
        "int4-g32|64|128[-asym], +a8 for int8 activations, mixed per op kind / layer "
        "(e.g. 'int4-g32,ffn_down=int8,attn@0-2=fp16'). Sparsity specs: ffn-topk=0.9, ffn-stat=0.95@0-9, "
        "ffn-down=fp32|fp16|int8, nm=2:4[@ffn], attn-window=128, attn-blocks=64:1:4[:8][@5+11+17], comma-joined.",
    )
    add_model_args(p)
    p.add_argument(
        "--quant", "-q", default="native", help="weight formats (default: native, the model's own)"
    )
    p.add_argument("--sparsity", "-s", default="none", help="sparsity spec (default: none)")
    p.add_argument(
        "--backend", "-b", default="cpu", help="backend of the variant: numpy | cpu (default: cpu)"
    )
    p.add_argument(
        "--ref-backend", default=None, help="backend of the unmodified reference (default: --backend)"
    )
    p.add_argument("--text", default="kjv", help="kjv (default), declaration, or a UTF-8 text file")
    p.add_argument("--tokens", type=positive_int, default=1024, help="text tokens scored (default 1024)")
    p.add_argument("--window", type=positive_int, default=512, help="tokens per sequence (default 512)")
    p.add_argument("--chunk", type=positive_int, default=128, help="tokens per forward call (default 128)")
    p.add_argument(
        "--prompts", type=non_negative_int, default=4, help="greedy-continuation prompts (default 4)"
    )
    p.add_argument(
        "--continuation", type=non_negative_int, default=16, help="tokens per continuation (default 16)"
    )
    p.add_argument("--speed-tokens", type=non_negative_int, default=32,
                   help="decode tokens per timed run, 0 to skip speed (default 32)")  # fmt: skip
    p.add_argument("--speed-prompt", type=positive_int, default=16,
                   help="text tokens of the prompt before the timed decodes (default 16)")  # fmt: skip
    p.add_argument("--repeats", type=positive_int, default=3, help="timed runs of each side (default 3)")
    p.add_argument("--profile-repeats", type=positive_int, default=1,
                   help="profiled decodes of each side for the FFN op time, median (default 1)")  # fmt: skip
    p.add_argument("--ffn-layer-repeats", type=non_negative_int, default=0,
                   help="also time the middle layer's FFN ops of both side by side, N rounds (cpu; warm caches)")  # fmt: skip
    p.add_argument("--threads", type=positive_int, default=None, help="host threads (default: all cores)")
    p.add_argument("--tune", default=None, help="backend tunables name=value,...")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--debug", action="store_true", help="show full tracebacks")
    add_json_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..eval.run import EvalConfig, evaluate
    from . import emit_json

    cfg = EvalConfig(args.model, args.quant, args.sparsity, args.backend, args.ref_backend, args.text, args.tokens,
                     args.window, args.chunk, args.prompts, args.continuation, args.speed_tokens, args.repeats,
                     args.profile_repeats, args.ffn_layer_repeats, args.threads, args.tune,
                     speed_prompt=args.speed_prompt)  # fmt: skip
    res = evaluate(cfg, progress=not args.no_progress)
    res["record"] = str(_record(cfg, res))
    if args.json:
        emit_json(res)
        return 0
    a, s = res["accuracy"], res["speed"]
    print(
        f"{res['model']}: quant {res['quant']}, sparsity {res['sparsity']} on {res['device']} vs the unmodified model"
    )
    print(f"  {res['variant'].get('source_note', '')}")
    print(f"  perplexity {a['perplexity']:.4f} (reference {a['perplexity_ref']:.4f}, {100 * a['perplexity_rel']:+.2f}%) "
          f"over {a['tokens_scored']} tokens of {res['text']}")  # fmt: skip
    print(f"  KL mean {a['kl_mean']:.5f} (max {a['kl_max']:.4f}), top-1 agreement {a['top1_agreement']:.4f}")
    if "greedy_prefix" in a:
        print(
            f"  greedy continuations: {a['greedy_prefix']:.3f} matched prefix, {a['greedy_same']:.3f} same tokens"
        )
    print(
        f"  matmul weights {res['weight_bytes'] / 2**20:.1f} MiB (reference {res['weight_bytes_ref'] / 2**20:.1f} MiB)"
    )
    if s:
        print(f"  decode {s['decode_tok_s']:.1f} tok/s vs {s['decode_tok_s_ref']:.1f} (x{s['decode_ratio']:.3f}); "
              f"FFN block {s['ffn_ms_per_token']:.3f} ms/token vs {s['ffn_ms_per_token_ref']:.3f} "
              f"(ref/variant x{s['ffn_speedup']:.3f}); attention {s['attn_ms_per_token']:.3f} vs "
              f"{s['attn_ms_per_token_ref']:.3f} (x{s['attn_speedup']:.3f}) after {s['prompt_tokens']} prompt tokens")  # fmt: skip
    if "nm_ops_speedup" in s:
        print(f"  N:M kernels vs the same pruned weights stored dense: ops with N:M weights {s['nm_ops_ms_per_token']:.3f} "
              f"vs {s['nm_dense_twin_ops_ms_per_token']:.3f} ms/token (x{s['nm_ops_speedup']:.3f}); decode "
              f"{s['nm_decode_tok_s']:.1f} vs {s['nm_dense_twin_decode_tok_s']:.1f} tok/s (x{s['nm_decode_ratio']:.3f})")  # fmt: skip
    if "ffn_layer_us" in s:
        print(f"  FFN ops of layer {s['ffn_layer']} alone: {s['ffn_layer_us']:.1f} us vs {s['ffn_layer_us_ref']:.1f} "
              f"(ref/variant x{s['ffn_layer_speedup']:.3f}, warm caches)")  # fmt: skip
    print(f"  ({res['how']})")
    return 0


def _record(cfg, res: dict):
    """The run record of an evaluation (commit, packages, CPU: see ``instrument.environment``)."""
    import sys
    from dataclasses import asdict

    from ..experiments.records import write_record
    from ..instrument import environment

    record = {"kind": "eval", "how": res["how"], "command": " ".join(sys.argv), "config": asdict(cfg),
              "model": res["model"], "backend": res["backend"], "device": res["device"],
              "environment": environment.capture(threads=cfg.threads), "results": res}  # fmt: skip
    return write_record(record)
