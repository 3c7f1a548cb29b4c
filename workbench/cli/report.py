"""``workbench report``: a self-contained HTML report of an experiment, or a comparison of several."""

from __future__ import annotations

import argparse

from .common import add_json_arg


def add_parser(sub) -> None:
    p = sub.add_parser(
        "report", help="write an HTML report of experiments/<name> (two or more: a comparison)"
    )
    p.add_argument("experiments", nargs="+", help="experiment folders (experiments/<name>)")
    p.add_argument("--out", default=None, help="HTML path (default: <experiment>/report.html)")
    p.add_argument("--no-points", action="store_true", help="skip exporting each point notebook to HTML")
    add_json_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..experiments.report import write_report
    from . import emit_json

    path = write_report(args.experiments, args.out, export_points=not args.no_points)
    if args.json:
        emit_json({"report": str(path)})
    else:
        print(path)
    return 0
