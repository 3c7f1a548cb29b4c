"""DMA channel counts of the generated IRON designs against the AIE tiles' limits (static check)."""

from __future__ import annotations

import pytest

from workbench.backends.npu.arch import get_array
from workbench.backends.npu.channels import (
    CORE_CHANNELS,
    MEMTILE_CHANNELS,
    ChannelError,
    channel_usage,
    channel_violations,
    over_limits,
    trace_design,
)
from workbench.backends.npu.iron import design_name, design_source, golden_schedules, model_schedules
from workbench.backends.npu.schedule import ScheduleError, gemm_schedule
from workbench.models.config import preset

DESIGN = """
import numpy as np
from aie.iron import Kernel, ObjectFifo, Program, Runtime, Worker
from aie.iron.device import NPU1Col4, Tile
from aie.iron.placers import SequentialPlacer


def design():
    fifos = [ObjectFifo(np.ndarray[(16,), np.dtype[np.int16]], name=f"in{{i}}") for i in range({n_in})]
    out = ObjectFifo(np.ndarray[(16,), np.dtype[np.int16]], name="out")
    worker = Worker(lambda *a: None, [f.cons() for f in fifos] + [out.prod()], placement=Tile(0, 2))
    rt = Runtime()
    with rt.sequence(*[None] * ({n_in} + 1)) as tensors:
        rt.start(worker)
        for f, t in zip(fifos, tensors):
            rt.fill(f.prod(), t, placement={shim})
        rt.drain(out.cons(), tensors[-1], wait=True, placement=Tile(0, 0))
    return Program(NPU1Col4(), rt).resolve_program(SequentialPlacer())
"""


@pytest.mark.parametrize("model", ["gemma3-270m", "gemma3-27b"])
@pytest.mark.parametrize("device", ["npu1", "npu2"])
@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_every_generated_design_is_within_the_dma_channel_limits(model, device, dtype):
    """The designs ``mlir/build.py`` generates for the model (decode and prefill) on the device."""
    array = get_array(device)
    schedules = model_schedules(preset(model), device, dtype)
    assert {s.op for s in schedules} == {"gemm", "rmsnorm", "attention"} | (
        {"gemv"} if dtype == "bf16" else set()
    )
    bad = {design_name(s): v for s in schedules if (v := channel_violations(s, array))}
    assert not bad


def test_gemv_design_splits_w_broadcasts_x_and_joins_y_per_column():
    s = next(g for g in golden_schedules() if g.op == "gemv")
    usage = channel_usage(trace_design(design_source(s)))
    rows = s.rows
    for c in range(s.columns):
        assert usage[c, 0] == (1, 2)  # y in; W and x out
        assert usage[c, 1] == (2 + rows, rows + 2)  # W, x, y_r in; W_r, x (broadcast), y out
        for r in range(rows):
            assert usage[c, 2 + r] == (2, 1)
    assert set(usage) == {(c, r) for c in range(s.columns) for r in range(2 + rows)}


def test_the_check_reports_a_core_and_a_shim_over_their_limits():
    array = get_array("npu1")
    fine = channel_usage(trace_design(DESIGN.format(n_in=2, shim="Tile(0, 0)")))
    assert fine[0, 2] == (2, 1) and fine[0, 0] == (1, 2) and not over_limits(fine, array)
    three = channel_usage(trace_design(DESIGN.format(n_in=3, shim="Tile(0, 0)")))
    assert three[0, 2] == (3, 1) and three[0, 0] == (1, 3)
    assert over_limits(three, array) == [
        "tile (0, 0): 1 in / 3 out DMA channels, limit 2 / 2",
        "tile (0, 2): 3 in / 1 out DMA channels, limit 2 / 2",
    ]
    assert CORE_CHANNELS == (2, 2) and MEMTILE_CHANNELS == (6, 6)


def test_the_check_refuses_unplaced_endpoints():
    with pytest.raises(ChannelError, match="no explicit placement"):
        trace_design(DESIGN.format(n_in=1, shim="None"))


def test_gemm_rows_may_not_exceed_columns():
    """One A stream per core row on its own column: more rows than columns would overload a shim."""
    with pytest.raises(ScheduleError, match="rows may not exceed columns"):
        gemm_schedule(get_array("npu1"), 64, 640, 1024, "bf16", 16, 64, 32, 1, 4)
