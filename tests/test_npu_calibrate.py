"""The emulator's cost model against published NPU figures (workbench calibrate npu)."""

from __future__ import annotations

import json

from workbench.backends.npu.calibration import ALSO_FOUND, CALIBRATION, calibration_table
from workbench.cli import main


def test_every_calibration_row_within_25_percent():
    table = calibration_table()
    assert len(table["calibration"]) == len(CALIBRATION) >= 3
    for row in table["calibration"]:
        assert abs(row["rel_error"]) <= 0.25, row
        assert row["how"].startswith("emulated") and row["source"]
    assert table["all_within"]


def test_calibrate_cli_json(capsys):
    assert main(["calibrate", "npu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    names = [r["figure"] for r in out["calibration"]]
    assert any("single-core 512^3 i16" in n for n in names) and any("16-core" in n for n in names)
    assert any("launch" in n for n in names)
    for r in out["calibration"] + out["also_found"]:
        assert {"published", "estimate", "rel_error", "source", "unit"} <= set(r)
        assert r["rel_error"] == r["estimate"] / r["published"] - 1
    assert len(out["also_found"]) == len(ALSO_FOUND)  # reported even where the model misses them


def test_calibration_is_not_hard_coded():
    """The estimates come from the cost model: changing a model factor moves them."""
    from workbench.backends.npu import arch, calibration, cost

    before = calibration.CALIBRATION[0].estimate()[0]
    old = cost.BURST_S
    try:
        cost.BURST_S = old * 2
        assert calibration.CALIBRATION[0].estimate()[0] < before * 0.9
    finally:
        cost.BURST_S = old
    assert old == arch.BURST_S
