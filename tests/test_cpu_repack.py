"""Q5_0 -> Q8_0 repacking at load (workbench.quant.repack) and the cpu backend's use of it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.backends import make_backend
from workbench.backends.base import Step
from workbench.models.synth import random_blocks
from workbench.quant.dequant import dequantize
from workbench.quant.formats import GGMLType
from workbench.quant.repack import q5_0_to_q8_0


@settings(max_examples=10, deadline=None)
@given(rows=st.integers(1, 40), blocks=st.integers(1, 24), seed=st.integers(0, 2**31))
def test_q5_0_as_q8_0_holds_the_same_weights(rows, blocks, seed):
    raw = random_blocks(GGMLType.Q5_0, rows, 32 * blocks, np.random.default_rng(seed))
    out = q5_0_to_q8_0(raw)
    assert out.shape == (rows, 34 * blocks)
    np.testing.assert_array_equal(dequantize(out, GGMLType.Q8_0), dequantize(raw, GGMLType.Q5_0))


def test_q5_0_repack_rejects_bad_shapes():
    with pytest.raises(ValueError, match="Q5_0 rows"):
        q5_0_to_q8_0(np.zeros((2, 23), np.uint8))


def test_backend_computes_q5_0_weights_as_q8_0_unless_told(default_model):
    toks = default_model.tokenizer.encode("Repacking must not change the model.")
    logits = []
    for tune in ("q5_0_as_q8_0=1", "q5_0_as_q8_0=0"):
        cpu = make_backend("cpu", default_model, threads=2, act_quant="none", tune=tune)
        w = cpu.weights["blk.0.attn_q.weight"]
        assert w.type == (GGMLType.Q8_0 if tune.endswith("1") else GGMLType.Q5_0)
        assert cpu.device.details["q5_0_as_q8_0"] is tune.endswith("1")
        cache = cpu.new_cache(64)
        cpu.run(cpu.prepare_graph(default_model.graph(len(toks), 1)), Step.single(cache, toks, 0))
        g1 = cpu.prepare_graph(default_model.graph(1, 1))
        logits.append(cpu.run(g1, Step.single(cache, [5], len(toks), "last", "decode")))
    np.testing.assert_allclose(logits[0], logits[1], atol=1e-3, rtol=0)
