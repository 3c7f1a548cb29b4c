"""``workbench runs``: list and filter the run records under experiments/."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("runs", help="list run records (filter with key=value, e.g. backend=cpu kind=bench)")
    p.add_argument(
        "filters", nargs="*", help="column=value (nested keys with '.', e.g. model.name=gemma3-270m)"
    )
    p.add_argument("--dir", default=None, help="experiments folder (default: the checkout's experiments/)")
    p.add_argument("--last", type=int, default=20, help="show the N most recent")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..experiments.records import load_runs
    from . import emit_json

    filters = {}
    for f in args.filters:
        if "=" not in f:
            raise ValueError(f"filter {f!r} is not column=value")
        k, v = f.split("=", 1)
        filters[k.replace(".", "__")] = v
    df = load_runs(args.dir, **filters)
    if not df.empty:
        df = df.sort_values("created").tail(args.last)
    if args.json:
        emit_json({"runs": df.to_dict("records") if not df.empty else []})
        return 0
    if df.empty:
        print("no run records")
        return 0
    cols = [
        c
        for c in (
            "created",
            "run_id",
            "kind",
            "model.name",
            "backend",
            "device",
            "results.prefill_tok_s",
            "results.decode_tok_s",
            "how",
        )
        if c in df.columns
    ]
    print(df[cols].to_string(index=False))
    return 0
