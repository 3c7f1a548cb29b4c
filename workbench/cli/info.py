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


def tokenizer_summary(model) -> dict:
    """What the model's tokenizer is, read without building it (describing a model needs no tokenizer:
    a missing or invalid one is reported here, and fails only commands that generate text)."""
    from ..models.errors import UnsupportedModelError
    from ..models.tokenizer import hf_tokenizer_file
    from ..models.vocab import gguf_vocab

    if model.kind == "hf":
        found = hf_tokenizer_file(model.source)
        if found is None:
            return {"source": None, "error": "no tokenizer.model or tokenizer.json (generation needs one)"}
        return {"source": str(found)}
    try:
        v = gguf_vocab(model.metadata, model.source)
    except UnsupportedModelError as e:  # ModelFormatError included
        return {"source": None, "error": str(e)}
    return {
        "vocab": len(v.tokens),
        "bos": v.bos_id,
        "eos": v.eos_id,
        "add_bos": v.add_bos,
        "source": f"gguf:{model.source}",
    }


def run(args: argparse.Namespace) -> int:
    from .. import load
    from . import emit_json

    model = load(args.model)
    meta = {k: _short(v) for k, v in model.metadata.items()}
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
        "tokenizer": tokenizer_summary(model),
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
    tok = info["tokenizer"]
    print(f"  tokenizer: {tok['source']}" if tok["source"] else f"  tokenizer: none ({tok['error']})")
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
