"""``workbench synth``: write a GGUF with random weights of a real Gemma 3 configuration, or write the
bundled model's vocabulary to a small file so synthetic models can be written where the model is absent."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    from ..models.config import PRESETS
    from ..models.synth import GENERATED, QUANTS, VOCAB_ENV

    p = sub.add_parser(
        "synth",
        help="write a synthetic GGUF (random weights, real shapes and quant formats) or a vocabulary file",
    )
    p.add_argument("--config", choices=sorted(PRESETS), help="model configuration")
    p.add_argument("--quant", default="q4_k_m", choices=QUANTS)
    p.add_argument("--out", help="output .gguf path")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--vocab",
        metavar="PATH",
        help=f"tokenizer vocabulary: a file from --write-vocab, or {GENERATED!r} (byte tokens, labeled as such); "
        f"default ${VOCAB_ENV}, else the bundled model's",
    )
    p.add_argument(
        "--write-vocab",
        metavar="PATH",
        help="write the bundled model's vocabulary (tokens, scores, types; gzip JSON, ~2 MB) to PATH and exit",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..models.config import preset
    from ..models.synth import write_bundled_vocab, write_synthetic
    from . import emit_json

    if args.write_vocab:
        if args.config or args.out or args.vocab:
            raise ValueError(
                "--write-vocab writes only the vocabulary: give it without --config, --out, --vocab"
            )
        path = write_bundled_vocab(args.write_vocab)
        size = path.stat().st_size
        if args.json:
            emit_json({"path": str(path), "bytes": size, "vocab": True})
        else:
            print(f"wrote {path} ({size / 2**20:.1f} MiB): the bundled model's vocabulary")
        return 0
    if not args.config or not args.out:
        raise ValueError("give --config and --out (or --write-vocab PATH)")
    path = write_synthetic(preset(args.config), args.quant, args.out, seed=args.seed, vocab=args.vocab)
    size = path.stat().st_size
    if args.json:
        emit_json(
            {"path": str(path), "bytes": size, "config": args.config, "quant": args.quant, "synthetic": True}
        )
    else:
        print(f"wrote {path} ({size / 2**30:.2f} GiB): synthetic {args.config} {args.quant}")
    return 0
