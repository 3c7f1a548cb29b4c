"""Repacking at load (workbench.quant.repack: Q5_0 -> Q8_0, Q6_K -> Q6_K_I8, Q5_0 -> Q5_0_X4) and the cpu backend's
use of it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from repacked import LAYOUTS
from tiny import TINY, tiny_vocab, tiny_weights

import workbench as wb
from workbench.backends import make_backend
from workbench.backends.base import Step
from workbench.backends.numba_cpu import batched as rk
from workbench.backends.numba_cpu import matvec as mv
from workbench.backends.numba_cpu.simd import Q6_K_I8
from workbench.models.gguf_writer import write_gguf
from workbench.models.synth import random_blocks
from workbench.quant.dequant import dequantize
from workbench.quant.formats import GGMLType
from workbench.quant.repack import q5_0_to_q8_0, q5_0_to_x4, q6_k_to_i8


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
    with pytest.raises(ValueError, match="multiple of 88"):
        q5_0_to_x4(np.zeros((2, 66), np.uint8))  # 3 blocks: not whole groups of 4


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@settings(max_examples=10, deadline=None)
@given(rows=st.integers(1, 40), units=st.integers(1, 9), t=st.integers(1, 3), seed=st.integers(0, 2**31))
def test_repacked_layout_kernels_compute_the_gguf_weights(layout, rows, units, t, seed):
    """A repacked layout's decoder gives the GGUF weights bit for bit; its matvecs (float, int16 and the
    batched kernel) match x @ W.T, the int16 one the GGUF blocks' int16 kernel closely, and the batched
    kernel gives exactly what it gives on the GGUF blocks."""
    qtype, fmt, repack, unit_values, unit_bytes, gguf_units = LAYOUTS[layout]
    rng = np.random.default_rng(seed)
    cols = unit_values * units
    raw = random_blocks(qtype, rows, cols, rng)
    packed = repack(raw)
    assert packed.shape == (rows, unit_bytes * units)
    w = dequantize(raw, qtype).reshape(rows, cols)
    dense = np.empty((rows, cols), np.float32)
    mv.dequantize_rows(fmt, packed, units, 0, dense)
    np.testing.assert_array_equal(dense, w)
    x = rng.standard_normal((t, cols)).astype(np.float32)
    want = x @ w.T
    scale = np.abs(w).sum(axis=1).max() * np.abs(x).max() + 1e-6
    out = np.empty_like(want)
    xs = np.empty((t, cols // 32), np.float32)
    mv.block_sums(x, xs)
    mv.matvec(fmt, packed, units, x, 0, mv.NO_CODES, mv.NO_FLOATS, xs, out)
    assert np.abs(out - want).max() <= 2e-6 * scale
    xq, xd = np.empty(x.shape, np.int16), np.empty_like(xs)
    mv.quantize_rows_i16(x, 32767, xq, xd, xs)
    mv.matvec(fmt, packed, units, x, 32767, xq, xd, xs, out)
    assert np.abs(out - want).max() <= 2e-4 * scale
    native = np.empty_like(out)
    mv.matvec(int(qtype), raw, units * gguf_units, x, 32767, xq, xd, xs, native)
    assert np.abs(out - native).max() <= 1e-6 * scale
    xp = np.zeros((rk.pad_rows(t), cols), np.float32)
    xp[:t] = x
    batched = []
    for f, data, u in ((fmt, packed, units), (int(qtype), raw, units * gguf_units)):
        o = np.empty((len(xp), rows), np.float32)
        empty_w, empty_o = np.zeros((0, 1), np.uint8), np.zeros((1, 0), np.float32)
        no_codes = (mv.NO_CODES, mv.NO_FLOATS, mv.NO_FLOATS)
        rk.matmul_rows3(f, data, u, o, 0, empty_w, 0, empty_o, 0, empty_w, 0, empty_o, xp, 0, *no_codes, 16)
        batched.append(o[:t])
    np.testing.assert_array_equal(batched[0], batched[1])
    assert np.abs(batched[0] - want).max() <= 2e-6 * scale


def test_backend_repacks_q5_0_and_q6_k_weights_unless_told(default_model):
    toks = default_model.tokenizer.encode("Repacking must not change the model.")
    q6 = next(n for n, t in default_model.weights.items() if t.type == GGMLType.Q6_K)
    logits = []
    q5_0 = {"q8_0": int(GGMLType.Q8_0), "x4": mv.Q5_0_X4, "none": int(GGMLType.Q5_0)}
    for q5, q6_on in (("q8_0", True), ("x4", False), ("none", False)):
        tune = f"q5_0_as_q8_0={int(q5 == 'q8_0')},q5_0_as_x4={int(q5 == 'x4')},q6_k_as_i8={int(q6_on)}"
        cpu = make_backend("cpu", default_model, threads=2, act_quant="none", tune=tune)
        assert cpu.weights["blk.0.attn_q.weight"].fmt == q5_0[q5]
        assert cpu.weights[q6].fmt == (Q6_K_I8 if q6_on else int(GGMLType.Q6_K))
        details = cpu.device.details
        assert (details["q5_0_as_q8_0"], details["q5_0_as_x4"], details["q6_k_as_i8"]) == (
            q5 == "q8_0",
            q5 == "x4",
            q6_on,
        )
        cache = cpu.new_cache(64)
        cpu.run(cpu.prepare_graph(default_model.graph(len(toks), 1)), Step.single(cache, toks, 0))
        g1 = cpu.prepare_graph(default_model.graph(1, 1))
        logits.append(cpu.run(g1, Step.single(cache, [5], len(toks), "last", "decode")))
    for other in logits[1:]:
        np.testing.assert_allclose(logits[0], other, atol=1e-3, rtol=0)


def test_q5_0_x4_int16_kernel_on_real_tensors(default_model):
    """The Q5_0_X4 int16 kernel on the default model's Q5_0 tensors: the reference to int16 precision, and
    the GGUF blocks' kernel up to summation order."""
    rng = np.random.default_rng(3)
    names = [n for n, t in default_model.weights.items() if t.type == GGMLType.Q5_0 and t.cols % 128 == 0]
    assert names
    for name in names[:3]:
        qt = default_model.weights[name]
        raw = np.ascontiguousarray(qt.raw[:200])
        w = dequantize(raw, GGMLType.Q5_0).reshape(len(raw), qt.cols)
        x = rng.standard_normal((1, qt.cols)).astype(np.float32)
        xq, xd = np.empty(x.shape, np.int16), np.empty((1, qt.cols // 32), np.float32)
        xs = np.empty_like(xd)
        mv.quantize_rows_i16(x, 32767, xq, xd, xs)
        got, native = np.empty((1, len(raw)), np.float32), np.empty((1, len(raw)), np.float32)
        mv.matvec(mv.Q5_0_X4, q5_0_to_x4(raw), qt.cols // 128, x, 32767, xq, xd, xs, got)
        mv.matvec(int(GGMLType.Q5_0), raw, qt.cols // 32, x, 32767, xq, xd, xs, native)
        scale = np.abs(w).sum(axis=1).max() * np.abs(x).max()
        assert np.abs(got - x @ w.T).max() <= 2e-4 * scale
        assert np.abs(got - native).max() <= 2e-6 * scale


@pytest.mark.parametrize("hidden", [64, 128])
def test_backend_regroups_q5_0_rows_of_128_values_and_keeps_the_others(tmp_path, hidden):
    """Q5_0 weights whose rows hold a multiple of 128 values are regrouped (Q5_0_X4), the others stay GGUF
    blocks; the decode step program (int16 activations) gives the numpy oracle's logits either way."""
    config = replace(TINY, hidden=hidden)
    rng = np.random.default_rng(hidden)
    tensors = {
        n: (GGMLType.Q5_0, random_blocks(GGMLType.Q5_0, *w.shape, rng))
        if w.ndim == 2 and n != "token_embd.weight"
        else (GGMLType.F32, w)
        for n, w in tiny_weights(config).items()
    }
    model = wb.load(write_gguf(tmp_path / "q5.gguf", config, tensors, tiny_vocab()))
    cpu = wb.Engine(model, "cpu", threads=2, tune="q5_0_as_x4=1,q5_0_as_q8_0=0,interleave_rows=0")
    fmts = {n: w.fmt for n, w in cpu.backend.weights.items() if model.weights[n].type == GGMLType.Q5_0}
    assert fmts and all(
        f == (mv.Q5_0_X4 if model.weights[n].cols % 128 == 0 else mv.Q5_0) for n, f in fmts.items()
    )
    assert (mv.Q5_0_X4 in fmts.values()) == (hidden == 128)
    ref = wb.Engine(model, "numpy")
    logits = []
    for e in (cpu, ref):
        seq = e.new_sequence(32)
        e.forward(seq, [2, 40, 41, 42, 43, 44])
        logits.append(np.asarray(e.forward(seq, [45])).reshape(-1))  # a one-token step: the step program
    assert np.abs(logits[0] - logits[1]).max() <= 2e-2 * np.abs(logits[1]).max()
