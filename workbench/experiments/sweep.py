"""Parameter sweeps: a grid of notebook parameters, each point executed with papermill, resumable.

An experiment lives in ``experiments/<name>/``::

    sweep.json               notebook, grid, fixed parameters, resources (written once, checked on resume)
    points/<id>/params.json  the point's parameters; <id> is a hash of them (a point is never duplicated)
    points/<id>/notebook.ipynb   the executed notebook
    points/<id>/status.json  done or failed (+ reason, error, seconds); written last, atomically
    results/<id>/run.json    what the notebook recorded with :func:`record_result` (+ op tables)

A point without ``status.json`` has not finished (killed mid-run): running the sweep again reruns it, and
points with a status are skipped, so an interrupted sweep loses and duplicates nothing.

A failed point says why (``reason``): ``error`` (the notebook raised), ``timeout`` (it ran past the point
time limit, ``point_timeout_s``: its kernel was killed), ``disk_full`` (no space left for its notebook,
results or status) or ``crashed`` (the worker process running it died; no status is kept). A full disk
stops the sweep (every further point would fail the same way); points that failed for it run again on the
next run, as unfinished ones do. Failed points of other reasons run again only with ``retry_failed``.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .records import experiments_dir, write_record
from .timed_notebook import DEFAULT_POINT_TIMEOUT_S, NotebookTimeout, execute_notebook

MAX_POINTS_WITHOUT_CONFIRM = 200
POINT_PARAM = "workbench_point"
RESOURCE_BACKENDS = {"vulkan": "vulkan", "npu": "npu"}
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
RERUN_REASONS = ("disk_full",)  # failures of the machine, not of the point: rerun without --retry-failed


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


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and one rename: readers see the old file
    or the new one, never a part; the temporary file does not outlive a failed write (a full disk)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, default=str))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def is_disk_full(e: BaseException) -> bool:
    """Whether ``e`` (or an exception it chains, or an error it reports from a kernel) is a full disk."""
    texts = tuple(os.strerror(n) for n in DISK_FULL_ERRNOS)
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in DISK_FULL_ERRNOS:
            return True
        if any(t in str(seen) for t in texts):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def error_line(e: BaseException) -> str:
    """What went wrong, in one line: for a notebook's error, the exception the notebook raised."""
    if hasattr(e, "ename") and hasattr(e, "evalue"):  # papermill's PapermillExecutionError
        return f"{e.ename}: {e.evalue}"[:2000]
    return f"{type(e).__name__}: {str(e).strip()[-2000:]}"


def _remove_leftovers(exp_dir: Path, pid: str) -> None:
    """Temporary files of an earlier run of the point that was killed mid-write (none are ever read)."""
    for stale in (exp_dir / "results").glob(f".tmp-{pid}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in (exp_dir / "points" / pid).glob(".*.tmp"):
        stale.unlink(missing_ok=True)


def run_point(
    notebook: str,
    exp_dir: str,
    pid: str,
    params: dict[str, Any],
    timeout_s: float | None,
    point_timeout_s: float | None = DEFAULT_POINT_TIMEOUT_S,
) -> dict:
    """Execute one point with papermill (its kernel killed after ``point_timeout_s``; ``timeout_s`` bounds
    each cell); write its status; never raise. A status that could not be written has ``recorded`` False."""
    pdir = Path(exp_dir) / "points" / pid
    t0 = time.time()
    status: dict[str, Any] = {"id": pid, "params": params, "started": t0}
    try:
        pdir.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(Path(exp_dir), pid)
        write_json_atomic(pdir / "params.json", params)
        point = {POINT_PARAM: {"experiment": str(exp_dir), "id": pid}}
        cwd = Path(notebook).resolve().parent
        execute_notebook(
            notebook, pdir / "notebook.ipynb", {**params, **point}, cwd, timeout_s, point_timeout_s
        )
        status["state"] = "done"
    except Exception as e:  # a failing notebook is a failed point, not a failed sweep
        reason = "timeout" if isinstance(e, NotebookTimeout) else "disk_full" if is_disk_full(e) else "error"
        error = error_line(e)
        status.update(state="failed", reason=reason, error=error, traceback=traceback.format_exc()[-4000:])
    status["seconds"] = time.time() - t0
    try:
        write_json_atomic(pdir / "status.json", status)
    except OSError as e:  # the point reruns next time (no status); the sweep learns why from the return
        error = f"its status could not be written: {type(e).__name__}: {e}"
        if "error" in status:
            error += f" (after: {status['error']})"
        status.update(state="failed", reason="disk_full" if is_disk_full(e) else "error", error=error,
                      recorded=False)  # fmt: skip
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
    write_json_atomic(path, definition)


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
    point_timeout_s: float | None = DEFAULT_POINT_TIMEOUT_S,
) -> dict[str, Any]:
    """Run every point of ``grid`` not yet done; returns counts and the experiment folder.

    ``timeout_s`` bounds each notebook cell, ``point_timeout_s`` each point's whole run (None: no bound).
    The counts: ``skipped`` (done before), ``done``, ``failed``, ``not_run`` (left when the sweep stopped
    early: ``aborted`` says why, e.g. a full disk)."""
    notebook = Path(notebook)
    if not notebook.is_file():
        raise GridError(f"notebook {notebook} not found")
    if workers < 1:
        raise GridError(f"--workers must be >= 1, got {workers}")
    if point_timeout_s is not None and point_timeout_s <= 0:
        raise GridError(f"the point timeout must be > 0 seconds, got {point_timeout_s}")
    points = validate(grid, notebook, yes)
    exp_dir = experiments_dir(root) / (name or notebook.stem)
    _check_or_write_definition(exp_dir, notebook, grid)
    todo, skipped = [], 0
    for params in points:
        pid = point_id(params)
        st = point_status(exp_dir, pid)
        if st and (st["state"] == "done" or not (retry_failed or st.get("reason") in RERUN_REASONS)):
            skipped += 1
            continue
        todo.append((pid, params))
    from tqdm.auto import tqdm

    counts, aborted = {"done": 0, "failed": 0}, None
    bar = tqdm(total=len(points), initial=skipped, desc=f"sweep {exp_dir.name}", unit="point")
    timeouts = (timeout_s, point_timeout_s)
    for status in _execute(str(notebook.resolve()), str(exp_dir), todo, workers, executor, grid, timeouts):
        counts[status["state"]] += 1
        bar.update(1)
        if status["state"] == "failed":
            first_line = status["error"].splitlines()[0][:200] if status["error"] else ""
            bar.write(f"point {status['id']} failed ({status['reason']}): {first_line}", file=sys.stderr)
        if progress:
            progress(status)
        if status.get("reason") == "disk_full":
            aborted = f"the disk is full ({status['error'].splitlines()[0][:200]}); free space and run again"
            bar.write(f"sweep stopped: {aborted}", file=sys.stderr)
            break
    bar.close()
    not_run = len(points) - skipped - counts["done"] - counts["failed"]
    summary = {"experiment": str(exp_dir), "points": len(points), "skipped": skipped, **counts}
    return {**summary, "not_run": not_run, "aborted": aborted}


def _execute(notebook, exp_dir, todo, workers, executor, grid, timeouts) -> Iterator[dict]:
    """Statuses of the points of ``todo`` as they finish; closing it early cancels the points not started."""
    if not todo:
        return
    if executor.startswith("dask://") or executor == "dask":
        yield from _execute_dask(notebook, exp_dir, todo, executor, grid, timeouts)
        return
    if executor != "local":
        raise GridError(f"unknown executor {executor!r}: use local or dask://HOST:PORT")
    if workers == 1:
        for pid, params in todo:
            yield run_point(notebook, exp_dir, pid, params, *timeouts)
        return
    pool = ProcessPoolExecutor(max_workers=workers)
    try:
        futures = {}
        for pid, params in todo:
            futures[pool.submit(run_point, notebook, exp_dir, pid, params, *timeouts)] = (pid, params)
        for fut in as_completed(futures):
            yield _result(fut, *futures[fut])
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _result(future: Any, pid: str, params: dict[str, Any]) -> dict:
    """A point's status from its future; a worker that died (killed, out of memory) fails the point, which
    keeps no status and so runs again next time."""
    try:
        return future.result()
    except Exception as e:
        error = f"the worker running the point died: {type(e).__name__}: {e}"
        return {
            "id": pid,
            "params": params,
            "state": "failed",
            "reason": "crashed",
            "error": error,
            "recorded": False,
        }


def point_resources(grid: Grid, params: dict[str, Any]) -> dict[str, int]:
    """Dask resource tags: the grid's ``resources`` plus ``vulkan``/``npu`` when the point's backend needs one."""
    tags = set(grid.resources)
    backend = str(params.get("backend", ""))
    if backend in RESOURCE_BACKENDS:
        tags.add(RESOURCE_BACKENDS[backend])
    return {t: 1 for t in sorted(tags)}


def _execute_dask(notebook, exp_dir, todo, executor, grid, timeouts):
    try:
        from distributed import Client
        from distributed import as_completed as dask_completed
    except ImportError:
        raise GridError("the dask executor needs dask[distributed]: pip install -e '.[dask]'") from None
    address = executor.removeprefix("dask://")
    client = Client(f"tcp://{address}" if "://" not in address else address, timeout="20s")
    try:
        futures, points = [], {}
        for pid, params in todo:
            fut = client.submit(run_point, notebook, exp_dir, pid, params, *timeouts, key=f"point-{pid}",
                                resources=point_resources(grid, params) or None, pure=False)  # fmt: skip
            futures.append(fut)
            points[fut.key] = (pid, params)
        for fut in dask_completed(futures):
            yield _result(fut, *points[fut.key])
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
