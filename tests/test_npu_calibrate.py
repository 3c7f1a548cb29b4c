"""The emulator's cost model against published NPU figures (workbench calibrate npu)."""

from __future__ import annotations

import json

import pytest

from workbench.backends.npu.arch import get_array
from workbench.backends.npu.calibration import CALIBRATION, CHECKS, TOLERANCE, calibration_table
from workbench.cli import main


@pytest.mark.parametrize("figure", CALIBRATION + CHECKS, ids=lambda f: f.name)
def test_every_published_figure_within_25_percent(figure):
    row = figure.row()
    assert TOLERANCE == 0.25
    assert abs(row["rel_error"]) <= TOLERANCE, row
    assert row["how"].startswith("emulated") and row["source"]


def test_table_reports_every_figure_and_the_verdict():
    table = calibration_table()
    rows = table["calibration"] + table["checks"]
    assert len(table["calibration"]) == len(CALIBRATION) >= 3 and len(table["checks"]) == len(CHECKS) >= 3
    assert table["all_within"] == all(abs(r["rel_error"]) <= TOLERANCE for r in rows)
    assert table["all_within"]


def test_calibrate_cli_json(capsys):
    assert main(["calibrate", "npu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    names = [r["figure"] for r in out["calibration"] + out["checks"]]
    assert any("single-core 512^3 i16" in n for n in names) and any("16-core" in n for n in names)
    assert any("gemv-288" in n for n in names) and any("launch" in n for n in names)
    for r in out["calibration"] + out["checks"]:
        assert {"published", "estimate", "rel_error", "source", "unit", "design"} <= set(r)
        assert r["rel_error"] == r["estimate"] / r["published"] - 1
        s = r["seconds"]
        assert s["total_s"] == pytest.approx(s["launch_s"] + s["array_s"] + s["host_buffers_s"])
        assert (s["host_buffers_s"] > 0) == r["design"]["fresh_buffers_each_run"]


def test_calibration_is_not_hard_coded():
    """The estimates come from the cost model: changing a model factor moves them."""
    from workbench.backends.npu import arch, cost

    before = [f.estimate()[0] for f in CALIBRATION]
    old = cost.BURST_CYCLES
    try:
        cost.BURST_CYCLES = old * 2
        after = [f.estimate()[0] for f in CALIBRATION]
    finally:
        cost.BURST_CYCLES = old
    assert all(a < b * 0.8 for a, b in zip(after, before))  # shim-DMA bound designs slow down
    assert old == arch.BURST_CYCLES
    fresh = next(f for f in CHECKS if f.fresh_buffers)
    base = fresh.estimate()[2]["host_buffers_s"]
    old = cost.BO_FIXED_S
    try:
        cost.BO_FIXED_S = old * 2
        slower = fresh.estimate()[2]["host_buffers_s"]
    finally:
        cost.BO_FIXED_S = old
    assert slower == pytest.approx(base + len(fresh.design(get_array(fresh.device)).host_buffers()) * old)
