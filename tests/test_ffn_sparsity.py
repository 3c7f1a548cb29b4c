"""The share of FFN units zeroed per layer (``eval.ffn_sparsity``) on a tiny Gemma 3n checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import workbench as wb
from workbench.eval.ffn_sparsity import ZeroCountingBackend, ffn_zero_share
from workbench.eval.text import load_text

FIXTURE = Path(__file__).parent / "fixtures" / "gemma3n" / "e2b_pattern"


def test_sparse_layers_zero_about_their_target_and_the_logits_are_the_reference_s():
    model = wb.load(FIXTURE)
    ids = model.tokenizer.encode(load_text("kjv")[0])[:120]
    rows = ffn_zero_share(model, ids, prefill_chunk=50)
    sparse = [r for r in rows if r["target"] > 0]
    assert [r["layer"] for r in sparse] == [0, 1, 2, 3, 4]
    assert all(abs(r["zeroed"] - 0.95) < 0.03 for r in sparse)  # 64 units: the Gaussian cutoff, not exact
    assert all(r["zeroed"] == 0 for r in rows if r["target"] == 0)
    # counting does not change what is computed
    counted = wb.Engine(model, ZeroCountingBackend(model))
    plain = wb.Engine(model, "numpy")
    a = counted.forward(counted.new_sequence(), ids[:20])
    b = plain.forward(plain.new_sequence(), ids[:20])
    assert np.array_equal(a, b)
