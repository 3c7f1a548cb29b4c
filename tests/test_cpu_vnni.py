"""The int8 VNNI decode kernels (dot_int8_vnni.py) against the int16 kernels at the same 127 levels (the same
integers: only the order of float sums differs) and against the reference; on a host without AVX512-VNNI
their instruction is built from plain IR, so the layouts are checked anywhere."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.backends.numba_cpu import matvec as mv
from workbench.backends.numba_cpu.dot_int8_vnni import VNNI_ORDER
from workbench.backends.numba_cpu.simd import Q6_K_I8
from workbench.models.synth import random_blocks
from workbench.quant.dequant import dequantize
from workbench.quant.formats import GGMLType
from workbench.quant.repack import q5_0_to_x4, q6_k_to_i8

# GGUF type, the layout the kernel reads and its repacking
LAYOUTS = {
    GGMLType.Q8_0: (mv.Q8_0, None),
    GGMLType.Q5_0: (mv.Q5_0_X4, q5_0_to_x4),
    GGMLType.Q4_K: (mv.Q4_K, None),
    GGMLType.Q6_K: (Q6_K_I8, q6_k_to_i8),
}


def _codes(x: np.ndarray, vnni: bool):
    xq = mv.act_codes(x.shape[0], x.shape[1], vnni)
    xd = np.empty((x.shape[0], x.shape[1] // 32), np.float32)
    xs = np.empty_like(xd)
    mv.quantize_rows_i16(x, 127, xq, xd, xs)
    return xq, xd, xs


def _check(qtype: GGMLType, raw: np.ndarray, cols: int, rng: np.random.Generator, t: int = 1) -> None:
    layout, repack = LAYOUTS[qtype]
    data = repack(raw) if repack else raw
    n_units = cols // (128 if layout == mv.Q5_0_X4 else mv.DECODERS[qtype].unit_values)
    x = rng.standard_normal((t, cols)).astype(np.float32)
    outs = []
    for vnni in (False, True):
        out = np.full((t, raw.shape[0]), np.nan, np.float32)
        mv.rows_i16_at(
            layout, data.ctypes.data, data.shape[1], n_units, 0, raw.shape[0], *_codes(x, vnni), out, 0
        )
        outs.append(out)
    w = dequantize(raw, qtype).reshape(raw.shape[0], cols)
    scale = np.abs(w).sum(axis=1).max() * np.abs(x).max() + 1e-6
    assert np.abs(outs[1] - outs[0]).max() <= 4e-6 * scale  # the same integers, another order of sums
    assert np.abs(outs[1] - x @ w.T).max() <= 2e-2 * scale  # int8 activations: 127 levels a block


@pytest.mark.parametrize("qtype", list(LAYOUTS))
@settings(max_examples=5, deadline=None)
@given(
    rows=st.integers(1, 24), groups=st.integers(1, 6), rows_x=st.integers(1, 3), seed=st.integers(0, 2**31)
)
def test_vnni_dot_random_blocks(qtype, rows, groups, rows_x, seed):
    rng = np.random.default_rng(seed)
    cols = groups * (256 if qtype in (GGMLType.Q4_K, GGMLType.Q6_K) else 128)
    _check(qtype, random_blocks(qtype, rows, cols, rng), cols, rng, rows_x)


def test_vnni_dot_real_tensors(default_model):
    rng = np.random.default_rng(3)
    seen = set()
    for qt in default_model.weights.values():
        if qt.type in LAYOUTS and qt.type not in seen and len(qt.shape) == 2:
            seen.add(qt.type)
            _check(qt.type, qt.raw[:64], qt.cols, rng)
    assert seen == set(LAYOUTS)


def test_q8_0_rows_of_partial_groups_use_the_int16_codes():
    """A Q8_0 row of 5 blocks has no whole second group: the int16 kernel runs on the int16 codes."""
    rng = np.random.default_rng(4)
    _check(GGMLType.Q8_0, random_blocks(GGMLType.Q8_0, 7, 160, rng), 160, rng)


def test_int8_copy_holds_the_codes_in_vnni_order():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 224)).astype(np.float32)  # 7 blocks: one whole group, then 3 in order
    q16, d16, s16 = _codes(x, False)
    q8, d8, s8 = _codes(x, True)
    np.testing.assert_array_equal(q8[:, : 2 * 224].view(np.int16), q16)
    np.testing.assert_array_equal(d8, d16)
    np.testing.assert_array_equal(s8, s16)
    order = [*VNNI_ORDER, 4, 5, 6]
    want = q16.reshape(2, 7, 32)[:, order].reshape(2, -1)
    np.testing.assert_array_equal(q8[:, 2 * 224 :].astype(np.int16), want)


def test_int8_backend_runs_the_vnni_kernels(default_model, monkeypatch):
    """``act_quant="int8"``: every projection of the model by the VNNI kernels (int8 codes) against the int16
    kernels on the same 127-level codes (a backend built with VNNI off); a decode step's logits as close to
    the numpy reference as int8 activations allow (measured: 0.5-1.1 on two prompts, either kernel family;
    the last-bit differences of one kernel family move some roundings of the next layer's activations by a
    level, so the two families' logits differ by that much too)."""
    from workbench.backends import make_backend
    from workbench.backends.base import Step

    vnni = make_backend("cpu", default_model, act_quant="int8", threads=2)
    assert vnni.vnni == mv.VNNI
    if not mv.VNNI:
        pytest.skip("host without AVX512-VNNI: int8 runs the int16 kernels")
    assert vnni.xq.dtype == np.int8 and "vpdpbusd" in vnni.device.details["decode_kernels"]
    monkeypatch.setattr(mv, "VNNI", False)
    plain = make_backend("cpu", default_model, act_quant="int8", threads=2)
    assert plain.xq.dtype == np.int16
    rng = np.random.default_rng(6)
    names = [n for n in vnni.weights if n.startswith(("blk.0.", "blk.1.")) or n == "token_embd.weight"]
    assert {vnni.weights[n].fmt for n in names} == {mv.Q8_0, mv.Q5_0_X4, mv.Q4_K, Q6_K_I8}
    for name in names:
        x = rng.standard_normal((1, vnni.weights[name].cols)).astype(np.float32)
        (got,), (want,) = vnni.project(x, (name,)), plain.project(x, (name,))
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), name

    toks = default_model.tokenizer.encode("Vectors of bytes, multiplied four at a time.")
    numpy = make_backend("numpy", default_model)
    logits = []
    for backend in (vnni, numpy):
        cache = backend.new_cache(32)
        g = backend.prepare_graph(default_model.graph(len(toks), 1))
        backend.run(g, Step.single(cache, toks, 0, "last"))
        g1 = backend.prepare_graph(default_model.graph(1, 1))
        logits.append(backend.run(g1, Step.single(cache, [toks[-1]], len(toks), "last", "decode")))
    assert 0 < np.abs(logits[0] - logits[1]).max() < 1.5
