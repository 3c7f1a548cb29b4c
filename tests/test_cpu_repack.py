"""Repacking at load (workbench.quant.repack: Q5_0 -> Q8_0, Q6_K -> Q6_K_I8) and the cpu backend's use of it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.backends import make_backend
from workbench.backends.base import Step
from workbench.backends.numba_cpu import matvec as mv
from workbench.backends.numba_cpu import rows as rk
from workbench.models.synth import random_blocks
from workbench.quant.dequant import dequantize
from workbench.quant.formats import GGMLType
from workbench.quant.repack import q5_0_to_q8_0, q6_k_to_i8


@settings(max_examples=10, deadline=None)
@given(rows=st.integers(1, 40), blocks=st.integers(1, 24), seed=st.integers(0, 2**31))
def test_q5_0_as_q8_0_holds_the_same_weights(rows, blocks, seed):
    raw = random_blocks(GGMLType.Q5_0, rows, 32 * blocks, np.random.default_rng(seed))
    out = q5_0_to_q8_0(raw)
    assert out.shape == (rows, 34 * blocks)
    np.testing.assert_array_equal(dequantize(out, GGMLType.Q8_0), dequantize(raw, GGMLType.Q5_0))


def test_repacks_reject_bad_shapes():
    with pytest.raises(ValueError, match="Q5_0 rows"):
        q5_0_to_q8_0(np.zeros((2, 23), np.uint8))
    with pytest.raises(ValueError, match="Q6_K rows"):
        q6_k_to_i8(np.zeros((2, 211), np.uint8))


@settings(max_examples=10, deadline=None)
@given(rows=st.integers(1, 40), units=st.integers(1, 9), t=st.integers(1, 3), seed=st.integers(0, 2**31))
def test_q6_k_as_i8_kernels_compute_the_q6_k_weights(rows, units, t, seed):
    """The repacked layout's decoder gives the Q6_K weights bit for bit; its matvecs (float, int16 and the
    batched kernel) match x @ W.T, and the batched kernel gives exactly what it gives on the Q6_K blocks."""
    rng = np.random.default_rng(seed)
    cols = 256 * units
    raw = random_blocks(GGMLType.Q6_K, rows, cols, rng)
    packed = q6_k_to_i8(raw)
    assert packed.shape == (rows, 274 * units)
    w = dequantize(raw, GGMLType.Q6_K).reshape(rows, cols)
    dense = np.empty((rows, cols), np.float32)
    mv.dequantize_rows(mv.Q6_K_I8, packed, units, 0, dense)
    np.testing.assert_array_equal(dense, w)
    x = rng.standard_normal((t, cols)).astype(np.float32)
    want = x @ w.T
    scale = np.abs(w).sum(axis=1).max() * np.abs(x).max() + 1e-6
    out = np.empty_like(want)
    xs = np.empty((t, cols // 32), np.float32)
    mv.block_sums(x, xs)
    mv.matvec_f32(mv.Q6_K_I8, packed, units, x, xs, out)
    assert np.abs(out - want).max() <= 2e-6 * scale
    xq, xd = np.empty(x.shape, np.int16), np.empty_like(xs)
    mv.quantize_rows_i16(x, 32767, xq, xd, xs)
    mv.matvec_i16(mv.Q6_K_I8, packed, units, xq, xd, xs, out)
    assert np.abs(out - want).max() <= 2e-4 * scale
    xp = np.zeros((rk.pad_rows(t), cols), np.float32)
    xp[:t] = x
    batched = []
    for fmt, data in ((mv.Q6_K_I8, packed), (int(GGMLType.Q6_K), raw)):
        o = np.empty((len(xp), rows), np.float32)
        empty_w, empty_o = np.zeros((0, 1), np.uint8), np.zeros((1, 0), np.float32)
        rk.matmul_rows3(fmt, data, units, o, 0, empty_w, 0, empty_o, 0, empty_w, 0, empty_o, xp, 16)
        batched.append(o[:t])
    np.testing.assert_array_equal(batched[0], batched[1])
    assert np.abs(batched[0] - want).max() <= 2e-6 * scale


def test_backend_repacks_q5_0_and_q6_k_weights_unless_told(default_model):
    toks = default_model.tokenizer.encode("Repacking must not change the model.")
    q6 = next(n for n, t in default_model.weights.items() if t.type == GGMLType.Q6_K)
    logits = []
    for tune in ("q5_0_as_q8_0=1,q6_k_as_i8=1", "q5_0_as_q8_0=0,q6_k_as_i8=0"):
        cpu = make_backend("cpu", default_model, threads=2, act_quant="none", tune=tune)
        on = tune.endswith("1")
        w = cpu.weights["blk.0.attn_q.weight"]
        assert w.type == (GGMLType.Q8_0 if on else GGMLType.Q5_0)
        assert cpu.weights[q6].fmt == (mv.Q6_K_I8 if on else int(GGMLType.Q6_K))
        assert cpu.device.details["q5_0_as_q8_0"] is on and cpu.device.details["q6_k_as_i8"] is on
        cache = cpu.new_cache(64)
        cpu.run(cpu.prepare_graph(default_model.graph(len(toks), 1)), Step.single(cache, toks, 0))
        g1 = cpu.prepare_graph(default_model.graph(1, 1))
        logits.append(cpu.run(g1, Step.single(cache, [5], len(toks), "last", "decode")))
    np.testing.assert_allclose(logits[0], logits[1], atol=1e-3, rtol=0)
