"""Compressed N:M sparse weights: the storage (workbench.quant.nm_store), the planar formats that hold it, the
cpu kernels that read only the kept values, and pruned models end to end."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quant_models import forward_logits, tiny_model

from workbench.backends.numba_cpu.qformats import NMWeight, cpu_weight
from workbench.quant.nm_store import NMError, compress, expand
from workbench.quant.planar import FormatError, PlanarFormat, make_planar
from workbench.quant.requant import requantize
from workbench.sparsity.apply import build_variant
from workbench.sparsity.nm import prune_nm

PATTERNS = [(2, 4), (1, 4), (2, 8), (4, 8), (3, 16)]


def _pruned(rng, rows: int, cols: int, n: int, m: int) -> np.ndarray:
    return prune_nm(rng.standard_normal((rows, cols)).astype(np.float32), n, m)


@settings(max_examples=25, deadline=None)
@given(pattern=st.sampled_from(PATTERNS), rows=st.integers(1, 9), groups=st.integers(1, 12),
       seed=st.integers(0, 2**31))  # fmt: skip
def test_compress_expand_round_trip(pattern, rows, groups, seed):
    n, m = pattern
    groups += (groups * n) % 2  # an even number of kept values a row
    w = _pruned(np.random.default_rng(seed), rows, groups * m, n, m)
    w[0, :m] = 0  # a group with fewer nonzeros than slots
    values, idx = compress(w, n, m)
    assert values.shape == (rows, groups * n) and idx.shape == (rows, groups * n // 2)
    np.testing.assert_array_equal(expand(values, idx, n, m), w)


@pytest.mark.parametrize(
    ("w", "n", "m", "match"),
    [(np.ones((2, 8), np.float32), 2, 4, "more than 2 nonzeros"), (np.zeros((2, 10), np.float32), 2, 4, "does not divide"),
     (np.zeros((2, 12), np.float32), 1, 4, "odd number"), (np.zeros((2, 64), np.float32), 2, 32, "M <= 16")],
)  # fmt: skip
def test_compress_rejects_what_it_cannot_hold(w, n, m, match):
    with pytest.raises(NMError, match=match):
        compress(w, n, m)


@pytest.mark.parametrize("kind", ["fp32", "fp16", "bf16", "int8"])
def test_nm_formats_hold_the_dense_formats_values(kind):
    w = _pruned(np.random.default_rng(0), 6, 64, 2, 4)
    sparse = make_planar("w", w, PlanarFormat(kind, nm=(2, 4)), "F32")
    dense = make_planar("w", w, PlanarFormat(kind), "F32")
    assert sparse.type.name == f"{kind}-nm2:4"
    np.testing.assert_array_equal(sparse.dequantize(), dense.dequantize())
    np.testing.assert_array_equal(sparse.dequantize_rows(np.array([4, 1])), dense.dequantize()[[4, 1]])
    assert sparse.nbytes == sparse.row_bytes * 6 < dense.nbytes


@pytest.mark.parametrize(("fmt", "match"), [(PlanarFormat("int4", 32, nm=(2, 4)), "no int4"),
                                            (PlanarFormat("int8", act8=True, nm=(2, 4)), r"no \+a8"),
                                            (PlanarFormat("fp16", nm=(2, 4)), "not 2:4 sparse")])  # fmt: skip
def test_nm_formats_refuse_what_they_cannot_store(fmt, match):
    with pytest.raises(FormatError, match=match):
        make_planar("w", np.ones((2, 64), np.float32), fmt, "F32")


# 2:4 over pairs of groups in 4-pair steps (64), with a remainder (40), an odd group count (36: scalar loop)
@pytest.mark.parametrize(("pattern", "cols"), [((2, 4), 64), ((2, 4), 40), ((2, 4), 36), ((1, 4), 64), ((1, 4), 40),
                                               ((4, 8), 64), ((4, 8), 40)])  # fmt: skip
@pytest.mark.parametrize("kind", ["fp32", "fp16", "bf16", "int8"])
def test_cpu_nm_matvec_equals_the_dense_product(pattern, kind, cols):
    n, m = pattern
    rng = np.random.default_rng(cols)
    w = _pruned(rng, 37, cols, n, m)  # 37 rows: tasks of 16 rows and a partial one
    wt = cpu_weight(make_planar("w", w, PlanarFormat(kind, nm=pattern), "F32"))
    assert isinstance(wt, NMWeight)
    assert (wt.codes is not None) == (
        pattern == (2, 4) and cols % 8 == 0
    )  # the vector kernel where it applies
    want_w = wt.tensor.dequantize()
    x = rng.standard_normal((3, cols)).astype(np.float32)
    got = wt.matvec(x, 16)
    np.testing.assert_allclose(got, x @ want_w.T, rtol=1e-5, atol=1e-5 * np.abs(x @ want_w.T).max())


def test_cpu_nm_matvec_reads_the_stored_positions():
    """A row that keeps exactly one input per group picks that input's activation (no dense fallback)."""
    w = np.zeros((4, 32), np.float32)
    for r in range(4):
        w[r, r::4] = 1.0  # position r of every group
    wt = cpu_weight(make_planar("w", w, PlanarFormat("fp32", nm=(2, 4)), "F32"))
    x = np.arange(32, dtype=np.float32)[None, :]
    np.testing.assert_array_equal(wt.matvec(x, 16)[0], [x[0, r::4].sum() for r in range(4)])


@pytest.mark.parametrize("quant", ["native", "fp16", "int8"])
def test_pruned_model_runs_compressed_on_cpu_and_matches_numpy(tmp_path, quant):
    v = build_variant(tiny_model(tmp_path, "Q8_0"), quant, "nm=2:4@ffn", progress=False)
    ffn = v.weights["blk.0.ffn_up.weight"]
    assert ffn.type.nm == (2, 4) and ffn.type.kind == ("fp32" if quant == "native" else quant)
    assert getattr(v.weights["blk.0.attn_q.weight"].type, "nm", None) is None
    want, got = forward_logits(v, "numpy"), forward_logits(v, "cpu")
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max())


def test_requantizing_to_int4_stores_the_pruned_weights_dense_and_says_so(tmp_path):
    pruned = build_variant(tiny_model(tmp_path, "Q8_0"), "native", "nm=2:4@ffn", progress=False)
    v = requantize(pruned, "int4-g32", progress=False)
    assert v.weights["blk.0.ffn_up.weight"].type.nm is None
    assert "nm_stored_dense" in v.notes


def test_vulkan_refuses_nm_weights_clearly():
    from workbench.backends.base import UnsupportedOpError
    from workbench.backends.vulkan.weights import planar_defines

    t = make_planar("blk.0.ffn_up.weight", _pruned(np.random.default_rng(0), 2, 32, 2, 4),
                    PlanarFormat("fp16", nm=(2, 4)), "F32")  # fmt: skip
    with pytest.raises(UnsupportedOpError, match="N:M"):
        planar_defines(t)
