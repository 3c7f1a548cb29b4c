"""The 512-bit decode kernels (dot_int16_512bit.py) against the reference and the 128-bit kernels, on any host (LLVM
lowers their 512-bit vectors to what the host has)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.backends.numba_cpu import dot_int16_512bit
from workbench.backends.numba_cpu import matvec as mv
from workbench.backends.numba_cpu.dot_int16_128bit import make_dot_i16
from workbench.backends.numba_cpu.simd import Q6_K_I8
from workbench.models.synth import random_blocks
from workbench.numba_jit import numba
from workbench.quant.dequant import dequantize
from workbench.quant.formats import GGMLType
from workbench.quant.repack import q6_k_to_i8

WIDE_TYPES = [GGMLType.Q8_0, GGMLType.Q5_0, GGMLType.Q4_K]
# kernels by layout: the GGUF types above and Q6_K_I8 (Q6_K repacked at load), which both builds have
DOTS = {t: (make_dot_i16(t), dot_int16_512bit.make_dot_i16_wide(t)) for t in [*WIDE_TYPES, Q6_K_I8]}


def _rows_kernel(narrow, wide):
    @numba.njit
    def rows(raw, n_units, xq, xd, xs, out):  # pragma: no cover - compiled
        rb = raw.shape[1]
        for n in range(raw.shape[0]):
            a = raw.ctypes.data + n * rb
            out[0, n] = narrow(a, xq.ctypes.data, xd.ctypes.data, xs.ctypes.data, n_units)
            out[1, n] = wide(a, xq.ctypes.data, xd.ctypes.data, xs.ctypes.data, n_units)

    return rows


KERNELS = {t: _rows_kernel(*DOTS[t]) for t in DOTS}


def _check(qtype: GGMLType, raw: np.ndarray, cols: int, rng: np.random.Generator) -> None:
    """The wide and narrow kernels of ``qtype`` on ``raw`` (Q6_K: of its Q6_K_I8 repacking)."""
    x = rng.standard_normal((1, cols)).astype(np.float32)
    w = dequantize(raw, qtype).reshape(raw.shape[0], cols)
    layout, data = (Q6_K_I8, q6_k_to_i8(raw)) if qtype == GGMLType.Q6_K else (qtype, raw)
    xq = np.empty(x.shape, np.int16)
    xd = np.empty((1, cols // 32), np.float32)
    xs = np.empty_like(xd)
    mv.quantize_rows_i16(x, 32767, xq, xd, xs)
    out = np.empty((2, raw.shape[0]), np.float32)
    KERNELS[layout](data, mv.units(qtype, cols), xq, xd, xs, out)
    want = (x @ w.T)[0]
    scale = np.abs(w).sum(axis=1).max() * np.abs(x).max() + 1e-6
    assert np.abs(out[1] - want).max() <= 2e-4 * scale  # the wide kernel against the reference
    assert np.abs(out[1] - out[0]).max() <= 2e-6 * scale  # and the 128-bit kernel: only summation order


@pytest.mark.parametrize("qtype", [*WIDE_TYPES, GGMLType.Q6_K])
@settings(max_examples=4, deadline=None)
@given(
    rows=st.integers(1, 40),
    units=st.integers(1, 21),  # one-scale formats: groups of 8 blocks, then single blocks
    seed=st.integers(0, 2**31),
)
def test_wide_dot_random_blocks(qtype, rows, units, seed):
    rng = np.random.default_rng(seed)
    cols = units * mv.DECODERS[qtype].unit_values
    _check(qtype, random_blocks(qtype, rows, cols, rng), cols, rng)


def test_wide_dot_real_tensors(default_model):
    rng = np.random.default_rng(1)
    seen = set()
    for qt in default_model.weights.values():
        if qt.type in [*WIDE_TYPES, GGMLType.Q6_K] and qt.type not in seen and len(qt.shape) == 2:
            seen.add(qt.type)
            _check(qt.type, qt.raw[:200], qt.cols, rng)
    assert seen == {*WIDE_TYPES, GGMLType.Q6_K}


@pytest.mark.parametrize(("value", "wide"), [("wide", True), ("narrow", False), (" Narrow ", False)])
def test_kernel_choice_from_environment(monkeypatch, value, wide):
    monkeypatch.setenv(dot_int16_512bit.KERNELS_ENV, value)
    assert dot_int16_512bit.use_wide_kernels() is wide


def test_bad_kernel_choice_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(dot_int16_512bit.KERNELS_ENV, "avx9")
    with pytest.raises(ValueError, match="WORKBENCH_CPU_KERNELS must be one of wide, avx2, narrow"):
        dot_int16_512bit.use_wide_kernels()
