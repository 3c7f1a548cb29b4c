"""NPU schedules: tiles fit the cores' and memory tiles' memories, planners pick fitting schedules, and
the AIE array geometry agrees with the published peak figures of the device profiles."""

from __future__ import annotations

import pytest

from workbench.backends.npu.arch import get_array
from workbench.backends.npu.cost import estimate
from workbench.backends.npu.iron import model_schedules
from workbench.backends.npu.schedule import (
    MM_EXPAND,
    SHIFT_BYTES,
    ScheduleError,
    attention_schedule,
    gemm_schedule,
    gemv_schedule,
    mm_multiples,
    plan_attention,
    plan_gemm,
    plan_gemv,
    plan_rowwise,
)
from workbench.instrument.devices import get_profile
from workbench.models.config import preset


@pytest.mark.parametrize("key", ["npu1", "hawkpoint", "npu2"])
def test_array_peak_matches_published_tops(key):
    a, prof = get_array(key), get_profile(key)
    assert a.peak_ops("i8") == pytest.approx(prof.peak_flops["int8"], rel=0.05)
    assert a.macs_per_cycle("bf16") * 2 == a.macs_per_cycle("i8")  # bf16 at half the int8 MAC rate


@pytest.mark.parametrize("device", ["npu1", "npu2"])
@pytest.mark.parametrize(
    "plan",
    [
        lambda a: plan_gemv(a, 1024, 640),
        lambda a: plan_gemv(a, 262144, 640),
        lambda a: plan_gemv(a, 640, 2048),
        lambda a: plan_gemv(a, 5376, 21504),  # gemma3-27b ffn_down at decode: k must split K 32 ways
        lambda a: plan_gemm(a, 7, 640, 2048),
        lambda a: plan_gemm(a, 512, 2048, 640, "i8"),
        lambda a: plan_gemm(a, 1, 5376, 21504, "i8"),
        lambda a: plan_rowwise(a, "rmsnorm", 4, 256),
        lambda a: plan_rowwise(a, "rmsnorm", 64, 5376),  # gemma3-27b rows
        lambda a: plan_attention(a, 1, 4096, 32, 16, 128),
        lambda a: plan_attention(a, 64, 512, 4, 1, 256),
    ],
)
def test_planned_schedules_fit_their_array(device, plan):
    a = get_array(device)
    s = plan(a)
    s.check(a)
    assert s.core_bytes() <= a.usable_core_bytes()
    assert s.memtile_bytes() <= a.memtile_bytes
    assert s.columns <= a.columns and s.rows <= a.rows
    assert s.calls_per_core >= 1 and estimate(s, a).seconds > a.launch_s


def test_oversized_tiles_are_rejected_with_the_numbers():
    a = get_array("npu1")
    s = gemm_schedule(a, 512, 512, 512, "bf16", 128, 128, 128, 4, 4)
    with pytest.raises(ScheduleError, match=r"core buffers need \d+ bytes"):
        s.check(a)
    with pytest.raises(ScheduleError, match="exceeds the array"):
        gemm_schedule(a, 512, 512, 512, "bf16", 64, 64, 32, 8, 4).check(a)
    big = attention_schedule(a, 64, 512, 4, 1, 256, 64, 64, 1)
    with pytest.raises(ScheduleError):
        big.check(a)


def test_tiles_respect_the_mac_tile_and_shapes():
    a = get_array("npu1")
    with pytest.raises(ScheduleError, match="MAC tile"):
        gemm_schedule(a, 64, 64, 64, "bf16", 6, 64, 32, 1, 1)
    with pytest.raises(ScheduleError, match="not a multiple"):
        gemm_schedule(a, 64, 100, 64, "bf16", 64, 64, 32, 1, 1)
    g = plan_gemm(a, 7, 640, 1024)
    r, s_, t = a.mac_tile("bf16")
    assert g.tile["m"] % r == 0 and g.tile["k"] % s_ == 0 and g.tile["n"] % t == 0
    assert g.tile["M_pad"] >= 7 and g.tile["N_pad"] >= 1024


def test_attention_schedules_carry_the_window_the_kernel_masks_with():
    a = get_array("npu1")
    assert plan_attention(a, 64, 512, 4, 1, 256, window=512).problem["window"] == 512
    assert plan_attention(a, 64, 512, 4, 1, 256).problem["window"] == 0
    with pytest.raises(ScheduleError, match="window must be >= 0"):
        attention_schedule(a, 1, 512, 4, 1, 256, 1, 64, 1, window=-1)
    with pytest.raises(ScheduleError, match="score buffer"):
        attention_schedule(a, 1, 512, 4, 1, 256, 1, 128, 1)
    windows = {s.problem["window"] for s in model_schedules(preset("gemma3-270m")) if s.op == "attention"}
    assert windows == {0, 512}  # global and sliding layers


def test_gemv_kernels_per_dtype():
    """bf16 GEMV runs our gemv.cc (mv.cc's bf16 combo is commented out); i16 keeps mv.cc."""
    a = get_array("npu1")
    assert plan_gemv(a, 1024, 640).kernels[0] == "gemv_bf16_f32"
    assert plan_gemv(a, 1024, 640).kernels[2].startswith("gemv_")
    assert gemv_schedule(a, 288, 288, "i16", 32, 32, 1, 1).kernels[0] == "matvec_vectorized_i16_i32"
    with pytest.raises(ScheduleError, match="no scalar bf16 GEMV kernel"):
        gemv_schedule(a, 288, 288, "bf16", 32, 32, 1, 1, vectorized=False)


def test_ddr_transfers_cover_the_problem():
    a = get_array("npu1")
    s = plan_gemv(a, 1024, 640)
    w = next(t for t in s.transfers if t.tensor == "W")
    assert w.nbytes == s.tile["N_pad"] * 640 * 2  # every bf16 weight read once
    # pre-tiled: one run per column object (the m x k tiles of the column's cores, split by its memory tile)
    assert w.run_bytes == s.tile["m"] * s.rows * s.tile["k"] * 2
    g = gemm_schedule(a, 512, 512, 512, "i16", 64, 64, 32, 1, 1, dtype_out="i32", b_col_maj=False)
    c = next(t for t in g.transfers if t.tensor == "C")
    assert c.nbytes == 512 * 512 * 4 and c.run_bytes == 32 * 4


def test_cost_model_scales_sensibly():
    a = get_array("npu1")
    one = estimate(gemm_schedule(a, 512, 512, 512, "i16", 64, 64, 32, 1, 1), a)
    many = estimate(gemm_schedule(a, 512, 512, 512, "i16", 64, 64, 32, 4, 4), a)
    assert many.array_s < one.array_s / 2  # 16 cores beat one
    tiny = estimate(plan_rowwise(a, "rmsnorm", 1, 640), a)
    assert tiny.bound == "launch overhead"  # single-token decode ops are launch bound
    big = estimate(plan_gemv(a, 262144, 640), a)  # every weight streamed once: bound by data movement
    assert big.bound in ("shim DMA", "DDR interface") and big.how.startswith("emulated")
    # one W stream per shim column: its channel saturates before the DDR interface
    assert big.compute_s < big.ddr_s <= big.shim_s


@pytest.mark.parametrize("device", ["npu1", "npu2"])
@pytest.mark.parametrize("shape", [(1, 640, 1024), (16, 640, 2048), (7, 2048, 640), (64, 5376, 21504)])
@pytest.mark.parametrize("dtype", ["bf16", "i8"])
def test_gemm_tiles_fit_kernel_expansion(device, shape, dtype):
    """The kernels' static_asserts: m % (em * r) and n % (en * t) with the expansion of the kernel for that
    architecture and dtype (mm.cc for bf16, our mm_i8.cc for int8, expanding as mm.cc's int8 kernels do);
    recent aie2 (npu1) int8 and bf16 kernels need m % 16."""
    a = get_array(device)
    g = plan_gemm(a, *shape, dtype)
    r, s_, t = a.mac_tile(dtype)
    em, en = MM_EXPAND[a.generation, dtype]
    assert g.tile["m"] % (em * r) == 0 and g.tile["k"] % s_ == 0 and g.tile["n"] % (en * t) == 0
    if dtype == "bf16":
        assert g.kernels[0] == f"matmul_{dtype}_{g.dtype_out}"  # mm.cc's symbol; B's layout is a -D define
    else:
        assert g.kernels == (
            "matmul_i8_i32",
            "zero_i32",
            "mm_i8_{m}x{k}x{n}.o".format(**g.tile),
            "matmul_srs_i8_i16",
        )


def test_int8_gemm_keeps_int32_partials_and_the_shift_in_b():
    """mm_i8.cc: the int32 partial sums of a core's m x n tile live in a buffer of the core's own (counted
    in its memory), B tiles arrive pretiled with the weight's int32 SRS shift behind them (no memory-tile
    transform), and int8 B must be pretiled."""
    a = get_array("npu1")
    g = gemm_schedule(a, 16, 640, 1024, "i8", 16, 128, 32, 4, 1, pretiled_b=True)
    fifo = {f.name: f for f in g.fifos}
    assert g.scratch_bytes == 16 * 32 * 4
    assert fifo["B_L2L1"].shape == (128 * 32 + SHIFT_BYTES,) and fifo["B_L2L1"].dims == ()
    b = next(t for t in g.transfers if t.tensor == "B")
    assert b.run_bytes == 128 * 32 + SHIFT_BYTES and b.nbytes == 1024 // 32 * 640 // 128 * (128 * 32 + 4)
    with pytest.raises(ScheduleError, match="int8 B must be pretiled"):
        gemm_schedule(a, 16, 640, 1024, "i8", 16, 128, 32, 4, 1)


def test_int8_gemm_tiles_on_npu1_are_multiples_of_16_rows():
    """aie2 mm.cc's int8 kernels expand the 4x8x8 MAC tile 4 times in m (matmul_vectorized_4x2_mmul:
    static_assert(m % (4 * r) == 0)), and so does our mm_i8.cc (schedule.MM_EXPAND): even decode pads to
    16 rows."""
    a = get_array("npu1")
    assert mm_multiples(a, "i8") == (16, 16) and mm_multiples(a, "i16") == (8, 8)
    assert plan_gemm(a, 1, 640, 1024, "i8").tile["m"] == 16
    with pytest.raises(ScheduleError, match=r"m % 16, k % 8 and n % 16 must be 0"):
        gemm_schedule(a, 8, 640, 1024, "i8", 8, 64, 32, 1, 1, pretiled_b=True)
    assert gemm_schedule(a, 8, 640, 1024, "i16", 8, 64, 32, 1, 1).tile["m"] == 8  # i16 stays 2 x 2


def test_gemm_rejects_tiles_mm_cc_cannot_run():
    a = get_array("npu1")
    with pytest.raises(ScheduleError, match=r"npu1 kernel expands the bf16 MAC tile 4x8x4 4 x 4 times"):
        gemm_schedule(a, 16, 640, 2048, "bf16", 8, 128, 16, 4, 4)
    assert plan_gemm(a, 16, 640, 2048).tile["M_pad"] == 16  # fewer core rows rather than padded rows


@pytest.mark.parametrize(
    "make",
    [
        lambda a, d: gemm_schedule(a, 512, 512, 512, "bf16", 64, 64, 32, 4, 4, depth=d),
        lambda a, d: gemm_schedule(a, 256, 256, 256, "i16", 32, 32, 32, 1, 1, dtype_out="i32", depth=d),
        lambda a, d: gemv_schedule(a, 2048, 640, "bf16", 32, 640, 4, 4, depth=d),
        lambda a, d: gemv_schedule(a, 288, 288, "i16", 32, 32, 1, 1, depth=d, vectorized=False),
    ],
)
def test_single_buffering_is_never_faster(make):
    a = get_array("npu1")
    single, double = estimate(make(a, 1), a), estimate(make(a, 2), a)
    assert single.array_s >= double.array_s
    if single.bound.endswith("(single-buffered)"):
        assert single.array_s == pytest.approx(
            single.compute_s + max(single.stream_s, single.memtile_s, single.shim_s, single.ddr_s)
        )


def test_attention_cores_share_the_query_tile_or_the_kv_stream():
    """share="q": a column's cores take key splits of one query group; "kv": query tiles of one KV head, so
    the K|V chunks are streamed once per column round instead of once per query tile."""
    a = get_array("npu1")
    q = attention_schedule(a, 64, 512, 4, 1, 256, 4, 8, 1)
    kv = attention_schedule(a, 64, 512, 4, 1, 256, 4, 8, 1, share="kv")
    assert (q.rows, kv.rows) == (1, 4) and q.notes["work_items"] == kv.notes["work_items"] == 16

    def kv_bytes(s):
        return next(t.nbytes for t in s.transfers if t.tensor == "KV")

    assert kv_bytes(q) == 4 * kv_bytes(kv)
    with pytest.raises(ScheduleError, match="takes one key split"):
        attention_schedule(a, 64, 512, 4, 1, 256, 4, 8, 2, share="kv")
    with pytest.raises(ScheduleError, match="6 query tiles are not a multiple of the 4 core rows"):
        attention_schedule(a, 24, 512, 4, 1, 256, 4, 8, 1, share="kv")
