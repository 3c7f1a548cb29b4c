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
    assert parse_sparsity("ffn-topk=0.9").ffn.down == "fp32"
    assert parse_sparsity("ffn-down=int8,ffn-topk=0.9").ffn.down == "int8"
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
     ("ffn-topk=0.9@0-30", "does not exist"), ("ffn-down=int4,ffn-topk=0.9", "one of fp32, fp16, int8"),
     ("ffn-down=int8", "needs an FFN item"), ("ffn-topk=0.9,ffn-down=fp16@1", "no @LAYERS")],
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
                                      "ffn-topk=0.75,attn-window=6", "ffn-topk=0.6,ffn-down=int8",
                                      "ffn-stat=0.7,ffn-down=fp16"])  # fmt: skip
@pytest.mark.parametrize("qtype", ["Q8_0", "F32"])
def test_cpu_matches_the_numpy_oracle(tmp_path, sparsity, qtype):
    """Prefill (dense masked FFN) and decode (the skipping kernel: kept up rows read in place for GGUF
    blocks, gathered for float weights; kept down columns in the op's down format; for Q8_0 inside the
    compiled step program)."""
    v = build_variant(tiny_model(tmp_path, qtype), "native", sparsity, progress=False)
    want, got = forward_logits(v, "numpy"), forward_logits(v, "cpu")
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max())


def test_cpu_sparse_ffn_on_planar_weights(tmp_path):
    v = build_variant(tiny_model(tmp_path, "Q8_0"), "int8", "ffn-topk=0.5", progress=False)
    want, got = forward_logits(v, "numpy"), forward_logits(v, "cpu")
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max())


def test_decode_steps_of_a_sparse_gguf_model_run_as_one_program(tmp_path):
    import workbench as wb
    from workbench.backends.base import Step

    e = wb.Engine(
        build_variant(tiny_model(tmp_path, "Q8_0"), "native", "ffn-topk=0.5", progress=False), "cpu"
    )
    graph = e.backend.prepare_graph(e.model.graph(1, 1))
    assert "sparse_ffn" in {op.kind for op in graph.ops}
    step = Step.single(e.new_sequence(4).cache, [5], 0, "last", "decode")
    assert e.backend._program(graph, step) is not None
    e.close()


def test_kv_rows_are_prefetched_by_an_op_of_their_own_layer_or_the_one_before(tmp_path):
    """With a sparse FFN in layer 1, layer 2's attention has no dense gate/up before it: its QKV prefetches."""
    import workbench as wb
    from workbench.backends.base import Step
    from workbench.backends.numba_cpu import instructions as ins

    e = wb.Engine(
        build_variant(tiny_model(tmp_path, "Q8_0"), "native", "ffn-topk=0.5@1", progress=False), "cpu"
    )
    graph = e.backend.prepare_graph(e.model.graph(1, 1))
    code = e.backend._program(graph, Step.single(e.new_sequence(4).cache, [5], 0, "last", "decode")).code
    attentions = np.flatnonzero(code["op"] == ins.ATTENTION)
    kinds = []
    for prev, i in zip([-1, *attentions[:-1]], attentions, strict=True):
        hosts = np.flatnonzero(code["pf_layer"] == code[i]["layer"] + 1)
        assert len(hosts) == 1 and prev < hosts[0] < i
        kinds.append(code[hosts[0]]["op"])
    assert kinds == [ins.NORM_MATMUL, ins.NORM_MATMUL_GELU, ins.NORM_MATMUL]
    e.close()


@pytest.mark.parametrize("fmt", ["fp32", "fp16", "int8"])
def test_down_store_sums_exactly_the_reference_values(fmt):
    from workbench.backends.numba_cpu import sparse_down as sd
    from workbench.sparsity.ffn import down_values

    w = RNG.standard_normal((70, 96)).astype(np.float32)  # hidden 70: int8 rows padded to 4 bytes
    store = sd.column_store(w, fmt)
    row = np.array(sd.table_row(store, fmt, 70), np.int64)
    idx = np.array([0, 3, 4, 50, 95], np.int64)
    f = RNG.standard_normal(5).astype(np.float32)
    for parts in (1, 3):
        out = np.empty(70, np.float32)
        sd.down_kept(row, idx, f, out, parts)
        np.testing.assert_allclose(out, down_values(w, fmt)[:, idx] @ f, rtol=1e-5, atol=1e-5)
    if fmt == "fp32":
        np.testing.assert_array_equal(down_values(w, fmt), w)


@pytest.mark.parametrize("k", [1, 7, 100, 511, 512])
def test_top_k_keeps_the_k_largest_and_the_first_of_ties(k):
    from workbench.backends.numba_cpu.sparse import top_k

    a = RNG.standard_normal(512).astype(np.float32)
    a[100:140] = -a[5]  # a run of ties (in magnitude)
    idx = top_k(a, k)
    v = np.abs(a)
    assert len(idx) == k and (np.diff(idx) > 0).all()
    rest = np.setdiff1d(np.arange(512), idx)
    if len(rest):
        assert v[idx].min() >= v[rest].max()
        thr = v[idx].min()
        tied = np.flatnonzero(v == thr)
        assert set(idx) & set(tied) == set(tied[: len(set(idx) & set(tied))])


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
    g8 = build_variant(m, "native", "ffn-topk=0.9,ffn-down=int8", progress=False).graph(1, 1)
    assert sum(op_cost(op, g8, pos).bytes for op in g8.ops if op.name == "blk.0.ffn_sparse") < sparse
