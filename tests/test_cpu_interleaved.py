"""Rows interleaved 16 at a time (Q8_0_R16, Q5_0_R16: workbench.quant.repack, the cpu backend's
interleaved.py): the same weights, and every kernel that reads them gives the GGUF blocks' results."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.backends import make_backend
from workbench.backends.base import Step
from workbench.backends.numba_cpu import batched as rk
from workbench.backends.numba_cpu import interleaved as il
from workbench.backends.numba_cpu import matvec as mv
from workbench.backends.numba_cpu.simd import Q4_K_R16, Q5_0_R16, Q8_0_R16
from workbench.models.synth import random_blocks
from workbench.quant.dequant import dequantize
from workbench.quant.formats import GGMLType
from workbench.quant.repack import q4_k_to_r16, q5_0_to_r16, q8_0_to_r16

LAYOUTS = {  # GGUF type, layout, interleaving, values of a unit (block or superblock)
    "Q8_0_R16": (GGMLType.Q8_0, Q8_0_R16, q8_0_to_r16, 32),
    "Q5_0_R16": (GGMLType.Q5_0, Q5_0_R16, q5_0_to_r16, 32),
    "Q4_K_R16": (GGMLType.Q4_K, Q4_K_R16, q4_k_to_r16, 256),
}
EMPTY_W, EMPTY_O = np.zeros((0, 1), np.uint8), np.zeros((1, 0), np.float32)


def test_interleaving_rejects_bad_shapes():
    with pytest.raises(ValueError, match="multiple of 16 rows"):
        q8_0_to_r16(np.zeros((15, 34), np.uint8))
    with pytest.raises(ValueError, match="multiple of 22 bytes"):
        q5_0_to_r16(np.zeros((16, 23), np.uint8))
    with pytest.raises(ValueError, match="multiple of 144 bytes"):
        q4_k_to_r16(np.zeros((32, 145), np.uint8))


def _quantized(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xq, xd = np.empty(x.shape, np.int16), np.empty((len(x), x.shape[1] // 32), np.float32)
    xs = np.empty_like(xd)
    mv.quantize_rows_i16(x, 32767, xq, xd, xs)
    return xq, xd, xs


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@settings(max_examples=10, deadline=None)
@given(groups=st.integers(1, 4), units=st.integers(1, 21), t=st.integers(1, 3), seed=st.integers(0, 2**31))
def test_interleaved_kernels_compute_the_gguf_weights(layout, groups, units, t, seed):
    """The same weights; the int16 matvec equals the GGUF blocks' kernel up to the order of float sums,
    whatever rows a task covers (ranges cutting groups included); the batched int16 kernel gives the same
    results, and the float, batched float, dequantizing and gather paths read each row back exactly."""
    qtype, fmt, interleave, unit_values = LAYOUTS[layout]
    blocks = units if unit_values == 32 else 1 + units % 4  # Q4_K: 1-4 superblocks
    rng = np.random.default_rng(seed)
    rows, cols = 16 * groups, unit_values * blocks
    raw = random_blocks(qtype, rows, cols, rng)
    packed = interleave(raw)
    assert packed.shape == raw.shape
    w = dequantize(raw, qtype).reshape(rows, cols)
    dense = np.empty((rows, cols), np.float32)
    mv.dequantize_rows(fmt, packed, blocks, 0, dense)
    np.testing.assert_array_equal(dense, w)
    picks = rng.integers(0, rows, 5)
    gathered = np.empty((5, cols), np.float32)
    mv.dequantize_gather(fmt, packed, blocks, picks, gathered)
    np.testing.assert_array_equal(gathered, w[picks])

    x = rng.standard_normal((t, cols)).astype(np.float32)
    scale = np.abs(w).sum(axis=1).max() * np.abs(x).max() + 1e-6
    xq, xd, xs = _quantized(x)
    got, native = np.empty((t, rows), np.float32), np.empty((t, rows), np.float32)
    mv.matvec(fmt, packed, blocks, x, 32767, xq, xd, xs, got)
    mv.matvec(int(qtype), raw, blocks, x, 32767, xq, xd, xs, native)
    assert np.abs(got - native).max() <= 1e-6 * scale
    assert np.abs(got - x @ w.T).max() <= 2e-4 * scale
    for rpt in (1, 5, 24):  # tasks of rows not a multiple of 16 run whole groups: the same results
        tasks = np.empty_like(got)
        mv.matvec(fmt, packed, blocks, x, 32767, xq, xd, xs, tasks, rpt)
        np.testing.assert_array_equal(tasks, got)
    for r0, r1 in ((0, rows), (3, rows - 2), (5, 6), (17, min(rows, 40))):  # ranges cutting groups
        if r0 < r1:
            part = np.full((t, r1 - r0 + 2), -1.0, np.float32)
            il.rows_i16(fmt, packed.ctypes.data, packed.shape[1], blocks, r0, r1, xq, xd, xs, part, 1)
            np.testing.assert_array_equal(part[:, 1:-1], got[:, r0:r1])
            assert (part[:, [0, -1]] == -1).all()

    batched = np.zeros((rk.pad_rows(t), rows), np.float32)
    xp = np.zeros((rk.pad_rows(t), cols), np.float32)
    xp[:t] = x
    bq, bd, bs = _quantized(xp)
    free = (0, EMPTY_W, 0, EMPTY_O, 0, EMPTY_W, 0, EMPTY_O)  # the unused slots
    rk.matmul_rows3(fmt, packed, blocks, batched, *free, xp, 32767, bq, bd, bs, 16)
    np.testing.assert_array_equal(batched[:t], got)

    exact = np.empty_like(got)
    mv.block_sums(x, xs)
    mv.matvec(fmt, packed, blocks, x, 0, mv.NO_CODES, mv.NO_FLOATS, xs, exact)
    assert np.abs(exact - x @ w.T).max() <= 2e-6 * scale
    rk.matmul_rows3(fmt, packed, blocks, batched, *free, xp, 0, mv.NO_CODES, mv.NO_FLOATS, mv.NO_FLOATS, 16)
    np.testing.assert_array_equal(batched[:t], exact)


def test_backend_interleaves_q8_0_q5_0_and_q4_k_for_int16_decode_only(default_model):
    """int16 activations on this host: the LM head (Q8_0), the Q5_0 and the Q4_K projections interleaved,
    unless told not to; int8 and float activations keep the rows whole. The decode step's logits move only
    by the order of float sums, which 18 layers amplify (measured: at most 3.6e-3, logits of magnitude
    ~20-40; the issue allows 0.05 against the numpy reference)."""
    toks = default_model.tokenizer.encode("Interleaving must not change the model.")
    logits = []
    for act, tune in (("int16", ""), ("int16", "interleave_rows=0"), ("int8", ""), ("none", "")):
        cpu = make_backend("cpu", default_model, threads=2, act_quant=act, tune=tune or None)
        on = act == "int16" and not tune and mv.VNNI
        assert cpu.device.details["interleave_rows"] == on
        assert cpu.weights["token_embd.weight"].fmt == (Q8_0_R16 if on else int(GGMLType.Q8_0))
        assert (cpu.weights["blk.0.attn_q.weight"].fmt == Q5_0_R16) == on
        assert (cpu.weights["blk.0.attn_output.weight"].fmt == Q4_K_R16) == on
        if act == "int16":
            cache = cpu.new_cache(64)
            cpu.run(cpu.prepare_graph(default_model.graph(len(toks), 1)), Step.single(cache, toks, 0))
            g1 = cpu.prepare_graph(default_model.graph(1, 1))
            logits.append(cpu.run(g1, Step.single(cache, [5], len(toks), "last", "decode")))
    np.testing.assert_allclose(logits[0], logits[1], atol=1e-2, rtol=0)
