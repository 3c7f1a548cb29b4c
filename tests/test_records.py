"""Run records: atomic, concurrent writers, corrupted records skipped, queries in one call."""

from __future__ import annotations

import json
import multiprocessing as mp

import pandas as pd
import pytest

from workbench.experiments.records import iter_records, load_runs, load_table, query, write_record


def _writer(root, i):
    write_record({"kind": "test", "results": {"i": i}}, {"ops": pd.DataFrame({"x": [i, i]})}, root=root)


def test_concurrent_writers(tmp_path):
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(tmp_path, i)) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    runs = load_runs(tmp_path)
    assert sorted(runs["results.i"]) == list(range(8))
    assert not list((tmp_path / "runs").glob(".tmp-*"))
    ops = load_table("ops", tmp_path)
    assert len(ops) == 16 and ops["run_id"].nunique() == 8


def test_corrupted_record_is_skipped_with_warning(tmp_path):
    good = write_record({"kind": "test", "results": {"v": 1}}, root=tmp_path)
    bad = write_record({"kind": "test", "results": {"v": 2}}, root=tmp_path)
    (bad / "run.json").write_text("{ truncated")
    (tmp_path / "runs" / "empty-dir").mkdir()
    with pytest.warns(UserWarning, match="skipping corrupted run record"):
        runs = load_runs(tmp_path)
    assert list(runs["path"]) == [str(good)]


def test_filters_and_sql(tmp_path):
    for b, tok in (("numpy", 10.0), ("cpu", 100.0), ("cpu", 120.0)):
        write_record(
            {"kind": "bench", "backend": b, "results": {"decode_tok_s": tok}},
            {"ops": pd.DataFrame({"kind": ["matmul"], "time_s": [tok]})},
            root=tmp_path,
        )
    assert len(load_runs(tmp_path, backend="cpu")) == 2
    assert len(load_runs(tmp_path, nope="x")) == 0
    df = query(
        'SELECT backend, max("results.decode_tok_s") AS best FROM runs GROUP BY backend ORDER BY backend',
        root=tmp_path,
    )
    assert df.to_dict("records") == [{"backend": "cpu", "best": 120.0}, {"backend": "numpy", "best": 10.0}]
    assert query("SELECT count(*) AS n FROM ops", root=tmp_path)["n"][0] == 3


def test_record_is_self_describing(tmp_path):
    path = write_record({"kind": "bench", "results": {}}, root=tmp_path)
    rec = json.loads((path / "run.json").read_text())
    assert rec["schema"] == "workbench.run/1" and rec["run_id"] == path.name and "created" in rec
    assert [p for p, _ in iter_records(tmp_path)] == [path]
