"""``workbench devices``: every backend, whether it works here, and the devices it found."""

from __future__ import annotations

import argparse

from .common import add_json_arg


def add_parser(sub) -> None:
    p = sub.add_parser("devices", help="list backends and the devices they detect")
    add_json_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..backends import probe_backends
    from . import emit_json

    rows = probe_backends()
    if args.json:
        emit_json({"backends": rows})
        return 0
    for r in rows:
        state = "available" if r["available"] else "unavailable"
        print(f"{r['backend']:<7} {state}" + (f"  ({r['reason']})" if r.get("reason") else ""))
        for d in r.get("devices", []):
            extra = ", ".join(f"{k}={v}" for k, v in d.items() if k not in ("name", "kind"))
            print(f"    - {d.get('name')} [{d.get('kind')}]" + (f": {extra}" if extra else ""))
    return 0
