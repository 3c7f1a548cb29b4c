"""``workbench synth``: write a GGUF with random weights of a real Gemma 3 configuration."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    from ..models.config import PRESETS
    from ..models.synth import QUANTS

    p = sub.add_parser("synth", help="write a synthetic GGUF (random weights, real shapes and quant formats)")
    p.add_argument("--config", required=True, choices=sorted(PRESETS), help="model configuration")
    p.add_argument("--quant", default="q4_k_m", choices=QUANTS)
    p.add_argument("--out", required=True, help="output .gguf path")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..models.config import preset
    from ..models.synth import write_synthetic
    from . import emit_json

    path = write_synthetic(preset(args.config), args.quant, args.out, seed=args.seed)
    size = path.stat().st_size
    if args.json:
        emit_json(
            {"path": str(path), "bytes": size, "config": args.config, "quant": args.quant, "synthetic": True}
        )
    else:
        print(f"wrote {path} ({size / 2**30:.2f} GiB): synthetic {args.config} {args.quant}")
    return 0
