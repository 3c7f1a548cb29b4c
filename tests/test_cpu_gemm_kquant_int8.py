"""The int8 prefill GEMM (gemm_kquant_int8.py): Q4_K and Q6_K_I8 weights times int8 activations with one scale
per 256 values equal the float64 product of the dequantized weights and the dequantized activations, whatever
the tasks and threads; the cpu backend takes it by ``prefill_gemm``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.backends.numba_cpu import gemm_kquant_int8 as gk
from workbench.backends.numba_cpu.simd import Q6_K_I8
from workbench.models.synth import random_blocks
from workbench.numba_jit import numba
from workbench.quant.dequant import dequantize
from workbench.quant.formats import GGMLType
from workbench.quant.repack import q6_k_to_i8

LAYOUTS = {gk.Q4_K: (GGMLType.Q4_K, lambda raw: raw), Q6_K_I8: (GGMLType.Q6_K, q6_k_to_i8)}


def _numpy_q8k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q8_K-style activations in numpy (one scale per 256 values, max|x| / 127): codes, scales, scale x the
    sum of each 16 codes."""
    t, k = x.shape
    blocks = x.reshape(t, k // 256, 256)
    amax = np.abs(blocks).max(axis=2)
    d = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(blocks * inv[:, :, None]).astype(np.int8)
    sums = q.reshape(t, k // 256, 16, 16).astype(np.int32).sum(axis=3)
    return q.reshape(t, k), d, (d[:, :, None] * sums.astype(np.float32)).reshape(t, k // 16)


@settings(max_examples=10, deadline=None)
@given(t=st.integers(1, 5), units=st.integers(1, 3), seed=st.integers(0, 2**31 - 1),
       spread=st.sampled_from([1e-3, 1.0, 1e3]))  # fmt: skip
def test_quantize_q8k_matches_numpy(t, units, seed, spread):
    x = (np.random.default_rng(seed).standard_normal((t, 256 * units)) * spread).astype(np.float32)
    x[0, :256] = 0.0  # an all-zero block: scale 0, codes 0
    got, want = gk.quantize_activations(x), _numpy_q8k(x)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[2], want[2], rtol=1e-6)
    assert np.abs(got[0].astype(np.int32)).max() <= 127


@pytest.mark.parametrize("layout", list(LAYOUTS), ids=["q4_k", "q6_k_i8"])
@settings(max_examples=8, deadline=None)
@given(rows=st.integers(1, 19), units=st.integers(1, 14), t=st.integers(1, 7), seed=st.integers(0, 2**31 - 1),
       spread=st.sampled_from([1e-3, 1.0, 1e3]))  # fmt: skip
def test_gemm_equals_the_dequantized_product(layout, rows, units, t, seed, spread):
    """Rows not a multiple of the 8-row tile, any number of activation rows, rows of more superblocks than a
    column chunk (CHUNK_UNITS: later chunks add to the output rows); the integer sums are exact, so the
    result is the float64 product up to float32 rounding of a few terms."""
    qtype, repack = LAYOUTS[layout]
    rng = np.random.default_rng(seed)
    cols = 256 * units
    raw = random_blocks(qtype, rows, cols, rng)
    x = (rng.standard_normal((t, cols)) * spread).astype(np.float32)
    q = gk.quantize_activations(x)
    got = gk.gemm(layout, repack(raw), q, 16)
    w = dequantize(raw, qtype).reshape(rows, cols).astype(np.float64)
    xq = (q[0].astype(np.float64).reshape(t, units, 256) * q[1][:, :, None]).reshape(t, cols)
    want = xq @ w.T
    bound = np.abs(xq) @ np.abs(w).T  # the size of the terms the float32 sums round
    assert got.shape == (t, rows)
    assert np.all(np.abs(got - want) <= 1e-5 * bound + 1e-30)


@pytest.mark.parametrize("layout", list(LAYOUTS), ids=["q4_k", "q6_k_i8"])
def test_gemm_bits_do_not_depend_on_tasks_or_threads(layout):
    qtype, repack = LAYOUTS[layout]
    rng = np.random.default_rng(7)
    cols = 256 * (2 * gk.CHUNK_UNITS + 1)  # three column chunks
    raw = repack(random_blocks(qtype, 45, cols, rng))
    q = gk.quantize_activations(rng.standard_normal((11, cols)).astype(np.float32))
    runs = []
    for threads, rpt in ((1, 8), (2, 16), (2, 3), (1, 64)):
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        runs.append(gk.gemm(layout, raw, q, rpt))
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    for r in runs[1:]:
        assert np.array_equal(r.view(np.uint32), runs[0].view(np.uint32))
    # one activation row alone gives its row of the batch: rows are independent
    one = gk.gemm(layout, raw, tuple(a[3:4] for a in q), 16)
    assert np.array_equal(one[0].view(np.uint32), runs[0][3].view(np.uint32))


def test_bad_operands_are_refused():
    with pytest.raises(ValueError, match="multiple of 256"):
        gk.quantize_activations(np.zeros((2, 640), np.float32))
    q = gk.quantize_activations(np.ones((2, 512), np.float32))
    raw = random_blocks(GGMLType.Q4_K, 3, 512, np.random.default_rng(0))
    with pytest.raises(ValueError, match="does not match 512 columns"):
        gk.gemm(int(GGMLType.Q8_0), raw, q, 16)  # a layout this GEMM does not read
    with pytest.raises(ValueError, match="does not match 512 columns"):
        gk.gemm(gk.Q4_K, raw[:, :144], q, 16)  # rows of another width
    with pytest.raises(ValueError, match="do not fit codes"):
        gk.gemm(gk.Q4_K, raw, (q[0], q[1][:1], q[2]), 16)


@pytest.fixture(scope="module")
def kquant_model(tmp_path_factory):
    """A tiny Gemma 3 whose projections are Q4_K (ffn_down Q6_K), rows of 256 and 512 values."""
    import gguf
    from tiny import TINY, tiny_vocab, tiny_weights

    import workbench as wb
    from workbench.models.gguf_writer import write_gguf

    config = dataclasses.replace(TINY, hidden=256, ffn=512, n_heads=4, n_kv_heads=2, head_dim=64,
                                 query_pre_attn_scalar=64)  # fmt: skip
    rng = np.random.default_rng(3)
    tensors = {}
    for name, w in tiny_weights(config).items():
        if name == "token_embd.weight":
            tensors[name] = (GGMLType.Q8_0, gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0))
        elif w.ndim == 2 and w.shape[1] % 256 == 0:
            qtype = GGMLType.Q6_K if "ffn_down" in name else GGMLType.Q4_K
            tensors[name] = (qtype, random_blocks(qtype, w.shape[0], w.shape[1], rng))
        else:
            tensors[name] = (GGMLType.F32, w)
    path = tmp_path_factory.mktemp("kquant") / "tiny-kquant.gguf"
    write_gguf(path, config, tensors, tiny_vocab())
    return wb.load(str(path))


def test_backend_prefill_int8_against_numpy(kquant_model):
    """A 24-token prefill with the int8 GEMM stays close to the numpy reference (int8 activations: llama.cpp's
    error), the float path closer; auto picks float while the float copies fit the dense cache, int8 past it;
    the device details say which."""
    from workbench.backends import make_backend
    from workbench.backends.base import Step

    ids = np.arange(10, 34, dtype=np.int32)

    def logits(name, **options):
        b = make_backend(name, kquant_model, threads=2, **options)
        out = b.run(
            b.prepare_graph(kquant_model.graph(len(ids), 1)), Step.single(b.new_cache(64), ids, 0, "all")
        )
        return out, b

    want, _ = logits("numpy")
    flt, b_float = logits("cpu")
    int8, b_int8 = logits("cpu", tune="prefill_gemm=int8")
    auto, b_auto = logits("cpu", tune="dense_cache_mib=0")
    assert b_float.prefill_gemm == "float" and b_float.device.details["prefill_gemm"].startswith("float")
    assert b_int8.device.details["prefill_gemm"].startswith("int8")
    assert "q4_k" in b_int8.device.details["prefill_gemm"] or not gk.supported(gk.Q4_K, 256)
    if gk.HAS_AVX2:  # auto takes the int8 GEMM only where vpmaddubsw runs it
        assert b_auto.prefill_gemm == "int8"
        np.testing.assert_array_equal(auto, int8)
    else:
        assert b_auto.prefill_gemm == "float"
    scale = np.abs(want).max()
    err_float, err_int8 = np.abs(flt - want).max() / scale, np.abs(int8 - want).max() / scale
    assert err_float < 1e-4
    assert 0 < err_int8 < 0.05
    assert (np.argmax(int8, axis=1) == np.argmax(want, axis=1)).mean() >= 0.75


def test_backend_rejects_an_unknown_prefill_gemm(kquant_model):
    from workbench.backends import make_backend

    with pytest.raises(ValueError, match="prefill_gemm must be one of"):
        make_backend("cpu", kquant_model, tune="prefill_gemm=int4")
