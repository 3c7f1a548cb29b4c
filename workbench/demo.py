"""``make demo``: the quickstart notebook and a small workgroup sweep on the best backend here, then a report.

Each step is the product's own command (``workbench sweep``, ``workbench report``); the report's path is
printed last. Each run starts afresh (the previous demo's experiment folders are replaced), so running it
again shows it again.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from .backends import make_backend
from .experiments.records import experiments_dir
from .experiments.report import write_report
from .experiments.sweep import Grid, load_grid, run_sweep

ROOT = Path(__file__).resolve().parents[1]


def best_backend() -> str:
    """The backend the workgroup sweep tunes: vulkan on a real GPU once built, else cpu."""
    from . import load

    model = load("gemma3-270m")
    built = None  # the decode_shards of a cpu backend auto built
    try:
        b = make_backend("auto", model)
    except Exception as e:  # any failure means: use cpu, and say so
        print(f"demo: auto backend unavailable ({e}); using cpu", file=sys.stderr)
        name = "cpu"
    else:
        name = b.name if b.name in ("cpu", "vulkan") else "cpu"
        built = getattr(b, "decode_shards", None) if b.name == "cpu" else None
        b.close()
    if name == "cpu":  # the sweep runs with and without decode shards: build both programs' kernels here,
        # with a progress bar, not silently inside a notebook point
        for shards in {1, 2} - {built}:
            make_backend("cpu", model, decode_shards=shards).close()
    return name


DEMO_EXPERIMENTS = ("demo-quickstart", "demo-workgroup")


def main() -> int:
    nb = ROOT / "notebooks"
    print("demo: 0/3 choosing the backend (the first run on a host compiles the cpu kernels)", flush=True)
    for name in DEMO_EXPERIMENTS:
        old = experiments_dir() / name
        if old.is_dir():
            print(f"demo: replacing the previous demo run in {old}", flush=True)
            shutil.rmtree(old)
    backend = best_backend()
    print(f"demo: 1/3 quickstart notebook on {backend}", flush=True)
    quick = run_sweep(
        nb / "00_quickstart.ipynb", Grid({}, {"backend": backend, "max_tokens": 24}), DEMO_EXPERIMENTS[0]
    )
    print(f"demo: 2/3 workgroup sweep on {backend}", flush=True)
    grid = load_grid(ROOT / "experiments" / "grids" / "demo_workgroup.yaml", [("backend", backend)])
    sweep = run_sweep(nb / "10_workgroup_sweep.ipynb", grid, DEMO_EXPERIMENTS[1])
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
