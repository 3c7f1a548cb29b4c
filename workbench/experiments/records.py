"""Run records: one self-describing folder per run under ``experiments/`` (JSON + Parquet), and queries.

Commands write into ``experiments/runs/``; the records that answer a question are copied into a folder of
``experiments/`` of their own (``cpu-decode/``, ``vulkan-scale/``, ...: see :mod:`.summary`), as folders
or as their ``run.json`` alone (``<id>.json``); every reader here takes either.

A record is written into a hidden temporary folder and published with one ``rename``, so a crash never
leaves a half record and several writers never collide (each run has its own unique id); a write that
fails (a full disk) removes its temporary folder. Reading skips
a corrupted record with a warning and loads the others.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

SCHEMA = "workbench.run/1"
RUNS = "runs"
SWEEP_DIRS = ("points", "results", "report_points")  # a sweep's working folders, beside its records


def experiments_dir(root: str | Path | None = None) -> Path:
    """``root``, else ``$WORKBENCH_EXPERIMENTS``, else the ``experiments/`` folder of the workbench checkout
    containing the current directory, else ``./experiments``."""
    if root is not None:
        return Path(root)
    env = os.environ.get("WORKBENCH_EXPERIMENTS")
    if env:
        return Path(env)
    here = Path.cwd().resolve()
    for d in (here, *here.parents):
        if (d / "experiments").is_dir() and (d / "pyproject.toml").is_file() and (d / "workbench").is_dir():
            return d / "experiments"
    return here / "experiments"


def new_run_id(kind: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{kind}-{uuid.uuid4().hex[:8]}"


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def write_record(
    record: dict[str, Any],
    tables: dict[str, pd.DataFrame] | None = None,
    root: str | Path | None = None,
    group: str = RUNS,
) -> Path:
    """Publish ``record`` (plus tables such as op rows as Parquet) atomically; returns the record folder."""
    base = experiments_dir(root) / group
    base.mkdir(parents=True, exist_ok=True)
    run_id = record.setdefault("run_id", new_run_id(record.get("kind", "run")))
    record.setdefault("schema", SCHEMA)
    record.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    tmp = base / f".tmp-{run_id}-{os.getpid()}"
    tmp.mkdir()
    try:
        files = {}
        for name, df in (tables or {}).items():
            if df is not None and not df.empty:
                df.to_parquet(tmp / f"{name}.parquet", index=False)
                files[name] = f"{name}.parquet"
        record["files"] = files
        (tmp / "run.json").write_text(json.dumps(record, indent=1, default=_json_default))
        final = base / run_id
        os.rename(tmp, final)
    except BaseException:  # a full disk, say: no half record is left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def iter_records(root: str | Path | None = None, group: str = RUNS) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(folder, record) of every readable record of ``group`` (``runs``, or a question folder such as
    ``cpu-decode``): record folders (``<id>/run.json``) and records copied flat (``<id>.json``, whose tables
    were not kept). A corrupted record is skipped with a warning; JSON files that are not records (a
    command's ``--json`` output, a tuning database) and a sweep's working folders are passed over."""
    base = experiments_dir(root) / group
    if not base.is_dir():
        return
    for d in sorted(base.iterdir()):
        if d.name.startswith(".") or d.name in SWEEP_DIRS:
            continue
        if d.is_file():
            if d.suffix == ".json":
                try:
                    rec = json.loads(d.read_text())
                except (OSError, ValueError) as e:
                    warnings.warn(f"skipping unreadable JSON {d}: {e}", stacklevel=2)
                    continue
                if isinstance(rec, dict) and rec.get("schema") == SCHEMA:
                    yield d, rec
            continue
        try:
            rec = json.loads((d / "run.json").read_text())
            if not isinstance(rec, dict) or rec.get("schema") != SCHEMA:
                raise ValueError(
                    f"schema is {rec.get('schema') if isinstance(rec, dict) else type(rec).__name__}"
                )
        except (OSError, ValueError) as e:
            warnings.warn(f"skipping corrupted run record {d}: {e}", stacklevel=2)
            continue
        yield d, rec


def load_runs(root: str | Path | None = None, group: str = RUNS, **filters: Any) -> pd.DataFrame:
    """All run records as one flat DataFrame (nested keys joined with '.'), filtered by column == value."""
    rows = []
    for d, rec in iter_records(root, group):
        rec = dict(rec)
        rec["path"] = str(d)
        rows.append(rec)
    df = pd.json_normalize(rows) if rows else pd.DataFrame()
    for k, v in filters.items():
        col = k.replace("__", ".")
        if col not in df.columns:
            return df.iloc[0:0]
        df = df[df[col].astype(str) == str(v)]
    return df.reset_index(drop=True)


def load_table(
    name: str = "ops", root: str | Path | None = None, group: str = RUNS, run_ids: list[str] | None = None
) -> pd.DataFrame:
    """A table (``ops``, ``steps``, ...) of all records (or of ``run_ids``), with a ``run_id`` column."""
    frames = []
    for d, rec in iter_records(root, group):
        if run_ids is not None and rec.get("run_id") not in run_ids:
            continue
        files = rec.get("files")
        f = files.get(name) if isinstance(files, dict) else None
        if not f or d.is_file():  # a record copied flat keeps no tables
            continue
        try:
            df = pd.read_parquet(d / f)
        except (OSError, ValueError) as e:
            warnings.warn(f"skipping unreadable table {d / f}: {e}", stacklevel=2)
            continue
        df["run_id"] = rec["run_id"]
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def query(sql: str, root: str | Path | None = None, group: str = RUNS) -> pd.DataFrame:
    """Run SQL (DuckDB) over the records: tables ``runs`` (one row per record) and ``ops`` (op rows)."""
    import duckdb

    con = duckdb.connect()
    runs = load_runs(root, group)
    ops = load_table("ops", root, group)
    steps = load_table("steps", root, group)
    con.register("runs", runs if not runs.empty else pd.DataFrame({"run_id": pd.Series(dtype=str)}))
    con.register("ops", ops if not ops.empty else pd.DataFrame({"run_id": pd.Series(dtype=str)}))
    con.register("steps", steps if not steps.empty else pd.DataFrame({"run_id": pd.Series(dtype=str)}))
    return con.execute(sql).df()
