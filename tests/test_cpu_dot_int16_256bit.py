"""The 256-bit decode kernels (dot_int16_256bit.py) give the 128-bit kernels' bits, on any host (LLVM lowers
their 256-bit vectors to what the host has), and the kernel choice follows the host and the environment."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.backends.numba_cpu import dot_int16_256bit as avx2
from workbench.backends.numba_cpu import matvec as mv
from workbench.backends.numba_cpu.dot_int16_128bit import make_dot_i16
from workbench.backends.numba_cpu.simd import Q6_K_I8
from workbench.instrument import environment
from workbench.models.synth import random_blocks
from workbench.numba_jit import numba
from workbench.quant.dequant import dequantize
from workbench.quant.formats import GGMLType
from workbench.quant.repack import q6_k_to_i8

Q4_K = int(GGMLType.Q4_K)


def _both_kernel(layout: int):
    narrow, avx2_dot = make_dot_i16(layout), avx2.make_dot_i16_256(layout)

    @numba.njit
    def both(raw, n_units, xq, xd, xs, out):  # pragma: no cover - compiled
        rb = raw.shape[1]
        for n in range(raw.shape[0]):
            a = raw.ctypes.data + n * rb
            out[0, n] = narrow(a, xq.ctypes.data, xd.ctypes.data, xs.ctypes.data, n_units)
            out[1, n] = avx2_dot(a, xq.ctypes.data, xd.ctypes.data, xs.ctypes.data, n_units)

    return both


# the GGUF type each layout comes from, and the layout's bytes from the GGUF rows
LAYOUTS = {Q4_K: (GGMLType.Q4_K, lambda raw: raw), Q6_K_I8: (GGMLType.Q6_K, q6_k_to_i8)}
BOTH = {f: _both_kernel(f) for f in LAYOUTS}


@pytest.mark.parametrize("layout", list(LAYOUTS), ids=["q4_k", "q6_k_i8"])
@settings(max_examples=6, deadline=None)
@given(rows=st.integers(1, 9), units=st.integers(1, 5), seed=st.integers(0, 2**31 - 1),
       spread=st.sampled_from([1e-3, 1.0, 1e3]))  # fmt: skip
def test_bits_equal_the_128_bit_kernel(layout, rows, units, seed, spread):
    qtype, repack = LAYOUTS[layout]
    rng = np.random.default_rng(seed)
    cols = 256 * units
    raw = random_blocks(qtype, rows, cols, rng)
    x = (rng.standard_normal((1, cols)) * spread).astype(np.float32)
    xq, xd = np.empty(x.shape, np.int16), np.empty((1, cols // 32), np.float32)
    xs = np.empty_like(xd)
    mv.quantize_rows_i16(x, 32767, xq, xd, xs)
    out = np.empty((2, rows), np.float32)
    BOTH[layout](repack(raw), units, xq, xd, xs, out)
    assert np.array_equal(out[0].view(np.uint32), out[1].view(np.uint32))
    w = dequantize(raw, qtype).reshape(rows, cols)
    scale = np.abs(w).sum(axis=1).max() * np.abs(x).max() + 1e-6
    assert np.abs(out[1] - (x @ w.T)[0]).max() <= 2e-4 * scale  # and against the reference


@pytest.mark.parametrize(("env", "want"), [("avx2", True), ("wide", False), ("narrow", False)])
def test_the_environment_picks_the_kernels(monkeypatch, env, want):
    monkeypatch.setenv("WORKBENCH_CPU_KERNELS", env)
    assert avx2.use_256bit_kernels() is want


def test_half_width_cores_keep_the_128_bit_kernels(monkeypatch):
    monkeypatch.delenv("WORKBENCH_CPU_KERNELS", raising=False)
    monkeypatch.setattr(avx2.llvm, "get_host_cpu_name", lambda: "znver1")
    assert not avx2.host_has_full_avx2()
    assert not avx2.use_256bit_kernels()


def test_a_bad_kernel_choice_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("WORKBENCH_CPU_KERNELS", "avx9")
    with pytest.raises(ValueError, match="WORKBENCH_CPU_KERNELS must be one of wide, avx2, narrow"):
        avx2.use_256bit_kernels()


def test_records_name_the_override_as_the_code_reads_it(monkeypatch):
    monkeypatch.setenv("WORKBENCH_CPU_KERNELS", " Narrow ")
    assert environment.overrides() == {"WORKBENCH_CPU_KERNELS": "narrow"}
    monkeypatch.setenv("WORKBENCH_CPU_KERNELS", " ")
    assert environment.overrides() == {}
