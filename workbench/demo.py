"""``make demo``: the quickstart notebook and a small workgroup sweep on the best backend here, then a report.

Each step is the product's own command (``workbench sweep``, ``workbench report``); the report's path is
printed last. Rerunning resumes: finished points are kept.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .backends import make_backend
from .experiments.report import write_report
from .experiments.sweep import Grid, load_grid, run_sweep

ROOT = Path(__file__).resolve().parents[1]


def best_backend() -> str:
    """The backend the workgroup sweep tunes: vulkan on a real GPU once built, else cpu."""
    from . import load

    try:
        b = make_backend("auto", load("gemma3-270m"))
    except Exception as e:  # any failure means: use cpu, and say so
        print(f"demo: auto backend unavailable ({e}); using cpu", file=sys.stderr)
        return "cpu"
    name = b.name if b.name in ("cpu", "vulkan") else "cpu"
    b.close()
    return name


def main() -> int:
    nb = ROOT / "notebooks"
    backend = best_backend()
    print(f"demo: 1/3 quickstart notebook on {backend}", flush=True)
    quick = run_sweep(
        nb / "00_quickstart.ipynb", Grid({}, {"backend": backend, "max_tokens": 24}), "demo-quickstart"
    )
    print(f"demo: 2/3 workgroup sweep on {backend}", flush=True)
    grid = load_grid(ROOT / "experiments" / "grids" / "demo_workgroup.yaml", [("backend", backend)])
    sweep = run_sweep(nb / "10_workgroup_sweep.ipynb", grid, "demo-workgroup")
    print("demo: 3/3 report", flush=True)
    report = write_report([sweep["experiment"]])
    write_report([quick["experiment"]])
    failed = quick["failed"] + sweep["failed"]
    if failed:
        print(f"demo: {failed} point(s) failed; see the report", file=sys.stderr)
    print(report)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
