"""Dequantizers match gguf.quants.dequantize bit for bit, on random blocks and on the model's tensors."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.quant.dequant import DEQUANTIZERS, dequantize
from workbench.quant.formats import FORMATS, GGMLType, UnsupportedQuantError

TYPES = sorted(DEQUANTIZERS)


def _reference(raw: np.ndarray, t: GGMLType) -> np.ndarray:
    return quants.dequantize(raw, GGMLQuantizationType(int(t))).astype(np.float32).reshape(-1)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_random_blocks_match_gguf(qtype, data):
    fmt = FORMATS[qtype]
    n_blocks = data.draw(st.integers(1, 9))
    rows = data.draw(st.integers(1, 3))
    seed = data.draw(st.integers(0, 2**32 - 1))
    raw = np.random.default_rng(seed).integers(
        0, 256, size=(rows, n_blocks * fmt.block_bytes), dtype=np.uint8
    )
    with np.errstate(all="ignore"):
        ours = dequantize(raw, qtype)
        ref = _reference(raw, qtype)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize(
    "name",
    [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.0.attn_v.weight",
        "blk.0.attn_output.weight",
        "blk.0.ffn_down.weight",
        "blk.1.ffn_down.weight",
        "blk.2.attn_v.weight",
        "output_norm.weight",
    ],
)
def test_real_tensors_match_gguf(default_model, name):
    t = default_model.weights[name]
    raw = t.raw if name != "token_embd.weight" else t.raw[:4096]  # a slice of the 170 MB table suffices
    np.testing.assert_array_equal(dequantize(raw, t.type), _reference(np.asarray(raw), t.type))


def test_every_format_of_the_default_model_is_covered(default_model):
    assert {t.type for t in default_model.weights.values()} <= set(DEQUANTIZERS)


def test_unknown_type_is_a_clear_error():
    with pytest.raises(UnsupportedQuantError, match="IQ2_XXS"):
        dequantize(np.zeros(66, np.uint8), GGMLType.IQ2_XXS, "blk.0.x")
    with pytest.raises(ValueError, match="whole number"):
        dequantize(np.zeros(35, np.uint8), GGMLType.Q8_0)


def test_dequantize_rows_matches_full(default_model):
    t = default_model.weights["blk.3.ffn_gate.weight"]
    rows = np.array([0, 7, 2047])
    np.testing.assert_array_equal(t.dequantize_rows(rows), t.dequantize()[rows])
