"""The int16-activation batched kernel (workbench.backends.numba_cpu.rows16) on every block format."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from repacked import LAYOUTS

from workbench.backends.numba_cpu import batched as rk
from workbench.backends.numba_cpu import matvec as mv
from workbench.backends.numba_cpu.simd import format_code
from workbench.models.synth import random_blocks
from workbench.quant.dequant import dequantize
from workbench.quant.formats import GGMLType

FORMATS = ["Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K", *LAYOUTS]
_EMPTY_W, _EMPTY_O = np.zeros((0, 1), np.uint8), np.zeros((1, 0), np.float32)


def _quantized(x: np.ndarray):
    xq, xd = np.empty(x.shape, np.int16), np.empty((len(x), x.shape[1] // 32), np.float32)
    xs = np.empty_like(xd)
    mv.quantize_rows_i16(x, 32767, xq, xd, xs)
    return xq, xd, xs


def _batched(fmt: int, data: np.ndarray, units: int, x: np.ndarray) -> np.ndarray:
    out = np.empty((len(x), data.shape[0]), np.float32)
    args = (_EMPTY_W, 0, _EMPTY_O)
    rk.matmul_rows3(fmt, data, units, out, 0, *args, 0, *args, x, 32767, *_quantized(x), 16)
    return out


@pytest.mark.parametrize("name", FORMATS)
@settings(max_examples=3, deadline=None)
@given(
    rows=st.integers(1, 40),
    units=st.integers(1, 3),
    t=st.integers(1, 11),
    slot=st.integers(0, 15),
    seed=st.integers(0, 2**31),
)
def test_batched_int16_rows_match_the_weights_and_do_not_depend_on_the_batch(
    name, rows, units, t, slot, seed
):
    """Each row equals x @ W.T to the int16 activations' precision and the single-row int16 kernel closely,
    and a row's result is bit-identical whatever slot it takes and whatever rows run beside it."""
    rng = np.random.default_rng(seed)
    lay = LAYOUTS.get(name)
    qtype, fmt = (lay.qtype, lay.fmt) if lay else (GGMLType[name], int(GGMLType[name]))
    cols = units * format_code(fmt).unit_values
    raw = random_blocks(qtype, rows, cols, rng)
    data = lay.repack(raw) if lay else raw
    w = dequantize(raw, qtype).reshape(rows, cols)
    x = np.zeros((rk.pad_rows(t), cols), np.float32)
    x[:t] = rng.standard_normal((t, cols))
    got = _batched(fmt, data, units, x)
    scale = np.abs(w).sum(axis=1).max() * np.abs(x).max() + 1e-6
    assert np.abs(got[:t] - x[:t] @ w.T).max() <= 2e-4 * scale
    single = np.empty_like(got)
    mv.matvec(fmt, data, units, x, 32767, *_quantized(x), single)
    assert np.abs(got - single).max() <= 1e-6 * scale
    other = np.zeros((16, cols), np.float32)
    other[:] = rng.standard_normal((16, cols))
    other[slot] = x[0]
    np.testing.assert_array_equal(_batched(fmt, data, units, other)[slot], got[0])
