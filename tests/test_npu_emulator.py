"""AIE emulator numerics and tiled kernels against the numpy reference (the oracle)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.backends.npu.arch import get_array
from workbench.backends.npu.emulator import kernels as emu
from workbench.backends.npu.emulator.numerics import quantize_rows_i8, srs, srs_shift, to_bf16
from workbench.backends.npu.schedule import (
    ScheduleError,
    attention_schedule,
    gemm_schedule,
    plan_gemm,
    plan_gemv,
    plan_rowwise,
    rowwise_schedule,
)
from workbench.ops import reference as ref

A = get_array("npu1")
RNG = np.random.default_rng(0)


def test_bf16_rounds_to_nearest_even():
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, 3.14159265, 65504.0, np.inf], np.float32)
    got = to_bf16(x)
    assert got.tolist()[:5] == [1.0, 1.0, 1.015625, -2.5, 3.140625]
    assert np.isinf(got[-1]) and np.isnan(to_bf16(np.array([np.nan], np.float32)))[0]
    bits = got.view(np.uint32)
    assert np.all(bits & 0xFFFF == 0)  # nothing below the bf16 mantissa survives


def test_srs_rounds_half_even_and_saturates():
    acc = np.array([5, 6, 7, -5, -6, -7, 2**40, -(2**40)])
    assert srs(acc, 1).tolist() == [2, 3, 4, -2, -3, -4, 32767, -32768]
    assert srs(np.array([12345]), 0).tolist() == [12345]
    with pytest.raises(ValueError):
        srs(acc, -1)


def test_int8_quantization_and_static_shift():
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    q, s = quantize_rows_i8(x)
    assert q.dtype == np.int8 and np.abs(q).max() == 127
    assert np.allclose(q * s[:, None], x, atol=s.max())
    assert srs_shift(np.full((2, 1024), 127, np.int8)) == (127 * 127 * 1024).bit_length() - 15


@pytest.mark.parametrize("rows", [1, 5])
def test_bf16_matmul_is_fp32_accumulation_of_bf16_inputs(rows):
    x = RNG.standard_normal((rows, 640)).astype(np.float32)
    w = (RNG.standard_normal((1024, 640)) / 25).astype(np.float32)
    s = plan_gemv(A, 1024, 640) if rows == 1 else plan_gemm(A, rows, 640, 1024)
    got = emu.matmul_bf16(s, A, x, to_bf16(w))
    exact_bf16 = to_bf16(x).astype(np.float64) @ to_bf16(w).astype(np.float64).T
    assert np.abs(got - exact_bf16).max() < 1e-4  # fp32 accumulation of exactly bf16 products
    err = np.abs(got - ref.matmul(x, w)).max()
    assert 1e-4 < err < 0.05  # bf16 inputs: a real, bounded difference from the fp32 reference


def test_int8_matmul_is_exact_integer_arithmetic():
    x = RNG.standard_normal((4, 2048)).astype(np.float32)
    w = (RNG.standard_normal((96, 2048)) / 45).astype(np.float32)
    wq, sw = quantize_rows_i8(w)
    shift = srs_shift(wq)
    s = plan_gemm(A, 4, 2048, 96, "i8")
    got = emu.matmul_i8(s, A, x, wq.astype(np.float32), sw, shift)
    xq, sx = quantize_rows_i8(x)
    acc = xq.astype(np.int64) @ wq.astype(np.int64).T
    want = srs(acc, shift).astype(np.float64) * 2.0**shift * sx[:, None] * sw[None, :]
    assert np.allclose(got, want, rtol=1e-6, atol=1e-6)
    assert np.abs(got - x @ w.T).max() < 0.1 * np.abs(x @ w.T).max()


def test_rmsnorm_matches_reference_within_bf16():
    x = RNG.standard_normal((3, 640)).astype(np.float32)
    w = (1 + 0.1 * RNG.standard_normal(640)).astype(np.float32)
    got = emu.rmsnorm(plan_rowwise(A, "rmsnorm", 3, 640), A, x, to_bf16(w), 1e-6, None)
    want = ref.rmsnorm(x, w, 1e-6)
    assert np.allclose(got, want, rtol=2e-2, atol=2e-2) and np.all(to_bf16(got) == got)
    q = RNG.standard_normal((2, 4 * 16)).astype(np.float32)
    wg = (1 + 0.1 * RNG.standard_normal(16)).astype(np.float32)
    grouped = emu.rmsnorm(plan_rowwise(A, "rmsnorm", 8, 16), A, q, to_bf16(wg), 1e-6, 16)
    assert np.allclose(grouped, ref.rmsnorm(q, wg, 1e-6, 16), rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="row-wise op must be one of"):
        plan_rowwise(A, "softmax", 3, 640)  # no design or model op uses a row softmax


@pytest.mark.parametrize("rows,length", [(1, 640), (64, 256), (2, 5376)])
def test_rmsnorm_runs_the_kernel_rows_of_its_schedule(rows, length):
    """mlir/kernels/rmsnorm.cc takes any row length that is a multiple of 16 (gemma3-27b: 5376); the
    emulator runs exactly the rows and length its schedule was planned for."""
    x = (3 * RNG.standard_normal((rows, length))).astype(np.float32)
    w = (1 + 0.1 * RNG.standard_normal(length)).astype(np.float32)
    s = plan_rowwise(A, "rmsnorm", rows, length)
    got = emu.rmsnorm(s, A, x, to_bf16(w), 1e-6, None)
    assert np.all(to_bf16(got) == got)
    assert np.allclose(got, ref.rmsnorm(x, w, 1e-6), rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="schedule is for"):
        emu.rmsnorm(s, A, x[:, : length // 2], to_bf16(w[: length // 2]), 1e-6, None)
    with pytest.raises(ScheduleError, match="multiple of the kernel's 16 lanes"):
        rowwise_schedule(A, "rmsnorm", rows, length + 8, "bf16", 1, 1, True)


@pytest.mark.parametrize("window", [0, 8])
@pytest.mark.parametrize("q_tile,splits,chunk", [(1, 1, 8), (3, 3, 4), (2, 2, 16), (1, 8, 4)])
def test_attention_schedule_matches_reference(window, q_tile, splits, chunk):
    t, s, nh, nkv, d = 3, 21, 4, 2, 16
    q = RNG.standard_normal((t, nh * d)).astype(np.float32)
    k = RNG.standard_normal((s, nkv * d)).astype(np.float32)
    v = RNG.standard_normal((s, nkv * d)).astype(np.float32)
    qp, kp = np.array([18, 19, 20]), np.arange(s)
    sched = attention_schedule(A, t, s, nh, nkv, d, q_tile, chunk, splits, window=window)
    got = emu.attention(sched, A, q, k, v, qp, kp, 0.25)
    want = ref.attention(q, k, v, qp, kp, nh, nkv, d, 0.25, window)
    assert np.abs(got - want).max() < 2e-2
    with pytest.raises(ValueError, match="schedule is for"):  # more queries than the schedule's
        emu.attention(sched, A, np.vstack([q, q[:1]]), k, v, np.append(qp, 20), kp, 0.25)
    with pytest.raises(ScheduleError, match="not a multiple of the 4 core rows"):
        attention_schedule(A, t, s, nh, nkv, d, q_tile, chunk, 5, window=window)  # a column's cores share q


def test_emulator_refuses_schedules_that_do_not_fit():
    s = gemm_schedule(A, 256, 256, 256, "bf16", 128, 128, 128, 1, 1)
    x = np.zeros((256, 256), np.float32)
    with pytest.raises(ScheduleError, match="core buffers"):
        emu.matmul_bf16(s, A, x, x)
