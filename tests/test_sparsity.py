"""Sparsity: specs and their errors, FFN masks, the sparse_ffn op on numpy and cpu, N:M pruning, windows."""

from __future__ import annotations

import numpy as np
import pytest
from quant_models import forward_logits, tiny_model

from workbench.ops import reference as ref
from workbench.quant.planar import FormatError
from workbench.quant.spec import SpecError
from workbench.sparsity.apply import build_variant
from workbench.sparsity.ffn import ffn_mask, kept_count, sparse_ffn
from workbench.sparsity.nm import prune_nm
from workbench.sparsity.spec import parse_sparsity

RNG = np.random.default_rng(1)


def test_spec_parsing():
    s = parse_sparsity("ffn-stat=0.95@0-9,nm=2:4@ffn@1,attn-window=128", n_layers=18)
    assert s.ffn.method == "stat" and s.ffn.target == 0.95 and s.ffn.applies(9) and not s.ffn.applies(10)
    assert (s.nm.n, s.nm.m, s.nm.kinds, s.nm.layers) == (
        2,
        4,
        ("ffn_gate", "ffn_up", "ffn_down"),
        frozenset({1}),
    )
    assert s.attn_window == 128
    assert parse_sparsity("none").is_dense


@pytest.mark.parametrize(
    "text, message",
    [("ffn-topk=1.0", r"outside \[0, 1\)"), ("ffn-topk=-0.1", "outside"), ("ffn-topk=abc", "not a number"),
     ("ffn-max=0.5", "unknown FFN method"), ("nm=4:2", "0 < N < M"), ("nm=2:4@mlp", "unknown weights"),
     ("attn-window=0", ">= 1"), ("dropout=0.1", "unknown sparsity item"), ("ffn-topk", "NAME=VALUE"),
     ("ffn-topk=0.9@0-30", "does not exist")],
)  # fmt: skip
def test_bad_specs(text, message):
    with pytest.raises(SpecError, match=message):
        parse_sparsity(text, n_layers=18)


def test_nm_pattern_must_divide_the_input_dimension():
    with pytest.raises(FormatError, match="does not divide the input dimension 30"):
        prune_nm(np.ones((2, 30), np.float32), 2, 4, "w")


def test_nm_keeps_the_largest_n_of_each_m():
    w = RNG.standard_normal((8, 32)).astype(np.float32)
    p = prune_nm(w, 2, 4)
    g, gw = p.reshape(8, 8, 4), w.reshape(8, 8, 4)
    assert ((g != 0).sum(axis=2) == 2).all()
    kept_min = np.where(g != 0, np.abs(gw), np.inf).min(axis=2)
    dropped_max = np.where(g == 0, np.abs(gw), -np.inf).max(axis=2)
    assert (kept_min >= dropped_max).all()
    np.testing.assert_array_equal(p[p != 0], w[p != 0])


def test_topk_mask_keeps_k_largest_magnitudes():
    g = RNG.standard_normal((3, 200)).astype(np.float32)
    a = ref.gelu_tanh(g)
    m = ffn_mask(g, a, "topk", 0.9)
    assert kept_count(200, 0.9) == 20
    assert (m.sum(axis=1) == 20).all()
    for t in range(3):
        assert np.abs(a[t][m[t]]).min() >= np.abs(a[t][~m[t]]).max()


def test_statistical_topk_keeps_about_the_target_fraction():
    g = RNG.standard_normal((4, 20000)).astype(np.float32)
    kept = ffn_mask(g, ref.gelu_tanh(g), "stat", 0.95).mean(axis=1)
    np.testing.assert_allclose(kept, 0.05, atol=0.006)


def test_sparse_ffn_at_zero_sparsity_is_the_dense_ffn():
    h = RNG.standard_normal((2, 16)).astype(np.float32)
    gw, uw, dw = (RNG.standard_normal(s).astype(np.float32) for s in ((40, 16), (40, 16), (16, 40)))
    dense = ref.matmul(ref.gelu_tanh(ref.matmul(h, gw)) * ref.matmul(h, uw), dw)
    np.testing.assert_allclose(
        sparse_ffn(h, gw, uw, dw, [None] * 3, "topk", 0.0), dense, rtol=1e-5, atol=1e-5
    )


def test_rewrite_replaces_the_ffn_of_chosen_layers(tmp_path):
    v = build_variant(tiny_model(tmp_path), "native", "ffn-topk=0.5@1", progress=False)
    g = v.graph(1, 1)
    assert [op.layer for op in g.ops if op.kind == "sparse_ffn"] == [1]
    assert "blk.0.ffn_up" in {op.name for op in g.ops} and "blk.1.ffn_up" not in {op.name for op in g.ops}


@pytest.mark.parametrize("sparsity", ["ffn-topk=0.5", "ffn-stat=0.8@0-1", "nm=2:4", "attn-window=4",
                                      "ffn-topk=0.75,attn-window=6"])  # fmt: skip
@pytest.mark.parametrize("qtype", ["Q8_0", "F32"])
def test_cpu_matches_the_numpy_oracle(tmp_path, sparsity, qtype):
    """Prefill (dense masked FFN) and decode (the skipping kernel: kept up rows read in place for GGUF
    blocks, gathered for float weights; kept down columns)."""
    v = build_variant(tiny_model(tmp_path, qtype), "native", sparsity, progress=False)
    want, got = forward_logits(v, "numpy"), forward_logits(v, "cpu")
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max())


def test_cpu_sparse_ffn_on_planar_weights(tmp_path):
    v = build_variant(tiny_model(tmp_path, "Q8_0"), "int8", "ffn-topk=0.5", progress=False)
    want, got = forward_logits(v, "numpy"), forward_logits(v, "cpu")
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max())


def test_cpu_kept_set_equals_the_reference_rule():
    from workbench.backends.numba_cpu.sparse import select_kept

    g = RNG.standard_normal((5, 512)).astype(np.float32)
    a = ref.gelu_tanh(g)
    from statistics import NormalDist

    for method, target in (("topk", 0.9), ("topk", 0.5), ("stat", 0.9)):
        mask = ffn_mask(g, a, method, target)
        z = NormalDist().inv_cdf(target) if method == "stat" else 0.0
        for t in range(5):
            idx = select_kept(g[t], a[t], method == "stat", z, kept_count(512, target))
            np.testing.assert_array_equal(idx, np.flatnonzero(mask[t]))


def test_sparse_ffn_cost_counts_only_kept_rows(tmp_path):
    from workbench.ops.kinds import op_cost

    m = tiny_model(tmp_path)
    dense_g = m.graph(1, 1)
    sparse_g = build_variant(m, "native", "ffn-topk=0.9", progress=False).graph(1, 1)
    pos = np.array([3])
    dense = sum(op_cost(op, dense_g, pos).bytes for op in dense_g.ops if op.name.startswith("blk.0.ffn_"))
    sparse = sum(op_cost(op, sparse_g, pos).bytes for op in sparse_g.ops if op.name == "blk.0.ffn_sparse")
    assert sparse < 0.5 * dense
