"""``workbench info MODEL``: metadata, configuration and a table of tensors by storage type."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from .common import add_json_arg


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="describe a model: metadata, config, tensors by type")
    p.add_argument("model", nargs="?", default="gemma3-270m", help="model spec (default: gemma3-270m)")
    p.add_argument("--tensors", action="store_true", help="list every tensor")
    add_json_arg(p)
    p.set_defaults(handler=run)


def _short(v):
    if isinstance(v, np.ndarray) or (hasattr(v, "__len__") and not isinstance(v, str) and len(v) > 8):
        return f"[{len(v)} values]"
    if isinstance(v, np.generic):
        return v.item()
    return v


def run(args: argparse.Namespace) -> int:
    from .. import load
    from ..models.gguf import GGUFFile
    from . import emit_json

    model = load(args.model)
    meta = {}
    if model.kind in ("gguf", "synthetic"):
        meta = {k: _short(v) for k, v in GGUFFile(model.source).metadata.items()}
    table = model.weights.type_table()
    tensors = [
        {"name": n, "type": t.type.name, "shape": list(t.shape), "bytes": t.nbytes}
        for n, t in model.weights.items()
    ]
    info = {
        "model": model.describe(),
        "config": model.config.to_dict(),
        "metadata": meta,
        "types": table,
        "tokenizer": {
            "vocab": model.tokenizer.vocab_size,
            "bos": model.tokenizer.bos_id,
            "eos": model.tokenizer.eos_id,
            "add_bos": model.tokenizer.add_bos,
            "source": model.tokenizer.source,
        },
    }
    if args.tensors:
        info["tensors"] = tensors
    if args.json:
        emit_json(info)
        return 0
    d = info["model"]
    print(f"{d['name']}  ({d['kind']}: {d['source']})")
    print(
        f"  {d['params'] / 1e6:.1f}M parameters, {d['weights_bytes'] / 2**20:.1f} MiB of weights, "
        f"{d['layers']} layers, hidden {d['hidden']}, ffn {d['ffn']}, heads {d['heads']}/{d['kv_heads']} "
        f"x {d['head_dim']}, vocab {d['vocab']}, context {d['context']}, window {d['sliding_window']}, "
        f"global layers {d['global_layers']}"
    )
    if model.synthetic:
        print("  SYNTHETIC: random weights of the real shapes and formats (for speed studies only)")
    if meta:
        print("metadata:")
        for k, v in meta.items():
            print(f"  {k:<45} {v}")
    print("tensors by type:")
    print(f"  {'type':<6} {'tensors':>8} {'values':>14} {'MiB':>10} {'bits/w':>7}")
    for t, row in table.items():
        bpw = 8 * row["bytes"] / max(row["values"], 1)
        print(f"  {t:<6} {row['tensors']:>8} {row['values']:>14,} {row['bytes'] / 2**20:>10.2f} {bpw:>7.2f}")
    if args.tensors:
        for t in tensors:
            print(f"  {t['name']:<40} {t['type']:<6} {t['shape']!s:<16} {t['bytes']:>12,}")
    sys.stdout.flush()
    return 0
