"""``workbench sweep``: run a notebook over a parameter grid with papermill (resumable, parallel, dask)."""

from __future__ import annotations

import argparse
import sys

from ..experiments.timed_notebook import DEFAULT_POINT_TIMEOUT_S
from .common import add_json_arg, positive_int


def non_negative_float(text: str) -> float:
    v = float(text)
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="execute a notebook over a grid of parameters (resumes when rerun)")
    p.add_argument("notebook", help="a notebook with a cell tagged 'parameters'")
    p.add_argument(
        "--grid", required=True, help="YAML: {name: [values]} or {sweep: ..., fixed: ..., resources: [...]}"
    )
    p.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="fix a parameter for every point (YAML value)")  # fmt: skip
    p.add_argument(
        "--name", default=None, help="experiment name (folder under experiments/; default: notebook name)"
    )
    p.add_argument("--workers", type=positive_int, default=1, help="points run in parallel (local executor)")
    p.add_argument("--executor", default="local", help="local (default) or dask://HOST:PORT")
    p.add_argument("--yes", action="store_true", help=f"allow grids of more than {200} points")
    p.add_argument("--retry-failed", action="store_true", help="rerun points that failed before")
    p.add_argument("--timeout", type=float, default=None, help="seconds per notebook cell (default: none)")
    p.add_argument("--point-timeout", type=non_negative_float, default=DEFAULT_POINT_TIMEOUT_S, metavar="SECONDS",
                   help="seconds per point, all cells and kernel start (default %(default)g; 0: none); a point "
                   "past it has its kernel killed and fails with reason 'timeout'")  # fmt: skip
    add_json_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..experiments.sweep import load_grid, run_sweep
    from . import emit_json

    grid = load_grid(args.grid, args.param)
    res = run_sweep(args.notebook, grid, args.name, args.workers, args.executor, args.yes, args.retry_failed,
                    args.timeout, point_timeout_s=args.point_timeout or None)  # fmt: skip
    if args.json:
        emit_json(res)
    else:
        print(f"{res['experiment']}: {res['points']} points, {res['skipped']} already done, "
              f"{res['done']} ran, {res['failed']} failed, {res['not_run']} not run")  # fmt: skip
        if res["aborted"]:
            print(f"workbench sweep: stopped early: {res['aborted']}", file=sys.stderr)
    return 1 if res["failed"] or res["aborted"] else 0
