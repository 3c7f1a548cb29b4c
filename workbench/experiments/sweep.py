"""Parameter sweeps: a grid of notebook parameters, each point executed with papermill, resumable.

An experiment lives in ``experiments/<name>/``::

    sweep.json               notebook, grid, fixed parameters, resources (written once, checked on resume)
    points/<id>/params.json  the point's parameters; <id> is a hash of them (a point is never duplicated)
    points/<id>/notebook.ipynb   the executed notebook
    points/<id>/status.json  done or failed (+ error, seconds); written last, atomically
    results/<id>/run.json    what the notebook recorded with :func:`record_result` (+ op tables)

A point without ``status.json`` has not finished (killed mid-run): running the sweep again reruns it, and
points with a status are skipped, so an interrupted sweep loses and duplicates nothing.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .records import experiments_dir, write_record

MAX_POINTS_WITHOUT_CONFIRM = 200
POINT_PARAM = "workbench_point"
RESOURCE_BACKENDS = {"vulkan": "vulkan", "npu": "npu"}


class GridError(ValueError):
    """A grid that cannot run: unknown parameters, empty or malformed values, too many points."""


@dataclass
class Grid:
    """Swept parameters (name -> values), fixed parameters, and resource tags the points need."""

    sweep: dict[str, list[Any]]
    fixed: dict[str, Any] = field(default_factory=dict)
    resources: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        n = 1
        for values in self.sweep.values():
            n *= len(values)
        return n

    def points(self) -> list[dict[str, Any]]:
        names = list(self.sweep)
        return [
            {**self.fixed, **dict(zip(names, combo, strict=True))}
            for combo in itertools.product(*(self.sweep[n] for n in names))
        ]


def load_grid(path: str | Path, overrides: Iterable[tuple[str, str]] = ()) -> Grid:
    """Read a grid YAML: ``{name: [values...], ...}`` or ``{sweep: {...}, fixed: {...}, resources: [...]}``.

    ``overrides`` (from ``-p name value``) fix a parameter (a YAML-parsed value) for every point.
    """
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise GridError(f"cannot read grid {path}: {e}") from None
    if not isinstance(data, dict) or not data:
        raise GridError(f"grid {path} must be a mapping of parameter names to lists of values")
    if "sweep" in data:
        unknown = set(data) - {"sweep", "fixed", "resources"}
        if unknown:
            raise GridError(f"grid {path}: unknown sections {sorted(unknown)} (sweep, fixed, resources)")
        sweep, fixed, resources = data["sweep"] or {}, data.get("fixed") or {}, data.get("resources") or []
    else:
        sweep, fixed, resources = data, {}, []
    if not isinstance(sweep, dict) or not isinstance(fixed, dict) or not isinstance(resources, list):
        raise GridError(f"grid {path}: sweep and fixed must be mappings, resources a list")
    swept: dict[str, list[Any]] = {}
    for name, values in sweep.items():
        values = values if isinstance(values, list) else [values]
        if not values:
            raise GridError(f"grid {path}: parameter {name!r} has no values")
        if len({json.dumps(v, sort_keys=True, default=str) for v in values}) != len(values):
            raise GridError(f"grid {path}: parameter {name!r} repeats a value")
        swept[str(name)] = values
    fixed = dict(fixed)
    for name, text in overrides:
        swept.pop(name, None)
        fixed[name] = yaml.safe_load(text)
    return Grid(swept, fixed, [str(r) for r in resources])


def notebook_parameters(notebook: str | Path) -> dict[str, Any]:
    """The names (and inferred types/defaults) of the notebook's ``parameters`` cell."""
    import papermill

    params = papermill.inspect_notebook(str(notebook))
    if not params:
        raise GridError(f"{notebook} has no cell tagged 'parameters'")
    return params


def validate(grid: Grid, notebook: str | Path, yes: bool = False) -> list[dict[str, Any]]:
    """The points of ``grid``, after checking every name exists in the notebook and the size is sane."""
    known = notebook_parameters(notebook)
    names = set(grid.sweep) | set(grid.fixed)
    unknown = sorted(names - set(known) - {POINT_PARAM})
    if unknown:
        raise GridError(
            f"{Path(notebook).name} has no parameters {unknown}; its parameters are: {', '.join(sorted(known))}"
        )
    if grid.size > MAX_POINTS_WITHOUT_CONFIRM and not yes:
        raise GridError(
            f"the grid has {grid.size} points (more than {MAX_POINTS_WITHOUT_CONFIRM}); pass --yes to run them all"
        )
    return grid.points()


def point_id(params: dict[str, Any]) -> str:
    text = json.dumps(params, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def run_point(notebook: str, exp_dir: str, pid: str, params: dict[str, Any], timeout_s: float | None) -> dict:
    """Execute one point with papermill (in this process); write its status; never raise."""
    import papermill

    pdir = Path(exp_dir) / "points" / pid
    pdir.mkdir(parents=True, exist_ok=True)
    _write_json_atomic(pdir / "params.json", params)
    t0 = time.time()
    status: dict[str, Any] = {"id": pid, "params": params, "started": t0}
    try:
        papermill.execute_notebook(
            notebook,
            str(pdir / "notebook.ipynb"),
            parameters={**params, POINT_PARAM: {"experiment": str(exp_dir), "id": pid}},
            progress_bar=False,
            cwd=str(Path(notebook).resolve().parent),
            execution_timeout=timeout_s,
            kernel_name="python3",
        )
        status["state"] = "done"
    except Exception as e:  # a failing notebook is a failed point, not a failed sweep
        status["state"] = "failed"
        status["error"] = f"{type(e).__name__}: {str(e).strip()[-2000:]}"
        status["traceback"] = traceback.format_exc()[-4000:]
    status["seconds"] = time.time() - t0
    _write_json_atomic(pdir / "status.json", status)
    return status


def point_status(exp_dir: Path, pid: str) -> dict[str, Any] | None:
    try:
        return json.loads((exp_dir / "points" / pid / "status.json").read_text())
    except (OSError, ValueError):
        return None


def _check_or_write_definition(exp_dir: Path, notebook: Path, grid: Grid) -> None:
    definition = {"notebook": str(notebook.resolve()), "grid": grid.sweep, "fixed": grid.fixed,
                  "resources": grid.resources}  # fmt: skip
    path = exp_dir / "sweep.json"
    if path.exists():
        old = json.loads(path.read_text())
        if Path(old.get("notebook", "")).name != notebook.name:
            raise GridError(
                f"experiment {exp_dir.name} was a sweep of {Path(old['notebook']).name}; choose another --name"
            )
        old_grid = {k: list(v) for k, v in old.get("grid", {}).items()}
        for k, v in grid.sweep.items():  # a resumed sweep may extend values; the union is recorded
            old_grid[k] = old_grid.get(k, []) + [x for x in v if x not in old_grid.get(k, [])]
        definition["grid"] = old_grid
    exp_dir.mkdir(parents=True, exist_ok=True)
    definition["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    _write_json_atomic(path, definition)


def run_sweep(
    notebook: str | Path,
    grid: Grid,
    name: str | None = None,
    workers: int = 1,
    executor: str = "local",
    yes: bool = False,
    retry_failed: bool = False,
    timeout_s: float | None = None,
    root: str | Path | None = None,
    progress: Callable[[dict], None] | None = None,
) -> dict[str, Any]:
    """Run every point of ``grid`` not yet done; returns counts and the experiment folder."""
    notebook = Path(notebook)
    if not notebook.is_file():
        raise GridError(f"notebook {notebook} not found")
    if workers < 1:
        raise GridError(f"--workers must be >= 1, got {workers}")
    points = validate(grid, notebook, yes)
    exp_dir = experiments_dir(root) / (name or notebook.stem)
    _check_or_write_definition(exp_dir, notebook, grid)
    todo, skipped = [], 0
    for params in points:
        pid = point_id(params)
        st = point_status(exp_dir, pid)
        if st and (st["state"] == "done" or not retry_failed):
            skipped += 1
            continue
        todo.append((pid, params))
    from tqdm.auto import tqdm

    counts = {"done": 0, "failed": 0}
    bar = tqdm(total=len(points), initial=skipped, desc=f"sweep {exp_dir.name}", unit="point")
    for status in _execute(str(notebook.resolve()), str(exp_dir), todo, workers, executor, grid, timeout_s):
        counts[status["state"]] += 1
        bar.update(1)
        if status["state"] == "failed":
            bar.write(f"point {status['id']} failed: {status['error'].splitlines()[0][:200]}")
        if progress:
            progress(status)
    bar.close()
    return {"experiment": str(exp_dir), "points": len(points), "skipped": skipped, **counts}


def _execute(notebook, exp_dir, todo, workers, executor, grid, timeout_s):
    if not todo:
        return
    if executor.startswith("dask://") or executor == "dask":
        yield from _execute_dask(notebook, exp_dir, todo, executor, grid, timeout_s)
        return
    if executor != "local":
        raise GridError(f"unknown executor {executor!r}: use local or dask://HOST:PORT")
    if workers == 1:
        for pid, params in todo:
            yield run_point(notebook, exp_dir, pid, params, timeout_s)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_point, notebook, exp_dir, pid, params, timeout_s) for pid, params in todo]
        for fut in as_completed(futures):
            yield fut.result()


def point_resources(grid: Grid, params: dict[str, Any]) -> dict[str, int]:
    """Dask resource tags: the grid's ``resources`` plus ``vulkan``/``npu`` when the point's backend needs one."""
    tags = set(grid.resources)
    backend = str(params.get("backend", ""))
    if backend in RESOURCE_BACKENDS:
        tags.add(RESOURCE_BACKENDS[backend])
    return {t: 1 for t in sorted(tags)}


def _execute_dask(notebook, exp_dir, todo, executor, grid, timeout_s):
    try:
        from distributed import Client, as_completed as dask_completed
    except ImportError:
        raise GridError("the dask executor needs dask[distributed]: pip install -e '.[dask]'") from None
    address = executor.removeprefix("dask://")
    client = Client(f"tcp://{address}" if "://" not in address else address, timeout="20s")
    try:
        futures = [
            client.submit(run_point, notebook, exp_dir, pid, params, timeout_s, key=f"point-{pid}",
                          resources=point_resources(grid, params) or None, pure=False)  # fmt: skip
            for pid, params in todo
        ]
        for fut in dask_completed(futures):
            yield fut.result()
    finally:
        client.close()


def record_result(
    point: dict[str, Any] | None,
    metrics: dict[str, Any],
    params: dict[str, Any] | None = None,
    tables: dict[str, Any] | None = None,
    **info: Any,
) -> Path:
    """Record a notebook's results: into its sweep point when run by a sweep, else as a run record.

    ``metrics`` are the numbers (each a plain value; say how it was obtained in ``info['how']``),
    ``tables`` DataFrames such as profiler op rows, ``info`` anything else (backend, device, environment).
    """
    record = {"kind": "notebook", "params": params or {}, "metrics": metrics, **info}
    if not point:
        return write_record(record, tables)
    exp_dir = Path(point["experiment"])
    record["run_id"] = point["id"]
    final = exp_dir / "results" / point["id"]
    if final.exists():  # a rerun of a point that was killed after recording
        shutil.rmtree(final)
    return write_record(record, tables, root=exp_dir.parent, group=f"{exp_dir.name}/results")
