"""The numba ``cpu`` backend: each kernel against the numpy reference, fused graphs, whole-model logits."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.backends import make_backend
from workbench.backends.base import Step, UnsupportedOpError
from workbench.backends.numba_cpu import attend
from workbench.backends.numba_cpu import instructions as ins
from workbench.backends.numba_cpu import kernels as k
from workbench.backends.numba_cpu import matvec as mv
from workbench.backends.numba_cpu import matvec_table as mt
from workbench.backends.numba_cpu import program as pg
from workbench.models.synth import random_blocks
from workbench.ops import reference as ref
from workbench.ops.fusion import fuse
from workbench.quant.dequant import dequantize
from workbench.quant.formats import GGMLType

QUANTS = [GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K]


def _quantized_activations(x: np.ndarray, levels: int):
    xq = np.empty(x.shape, np.int16)
    xd = np.empty((x.shape[0], x.shape[1] // 32), np.float32)
    xs = np.empty_like(xd)
    mv.quantize_rows_i16(x, levels, xq, xd, xs)
    return xq, xd, xs


def _check_matvec(qtype: GGMLType, raw: np.ndarray, cols: int, x: np.ndarray) -> None:
    w = dequantize(raw, qtype).reshape(raw.shape[0], cols)
    want = x @ w.T
    scale = np.abs(w).sum(axis=1).max() * np.abs(x).max() + 1e-6
    n_units = mv.units(qtype, cols)
    out = np.empty_like(want)
    xs = np.empty((x.shape[0], cols // 32), np.float32)
    mv.block_sums(x, xs)
    mv.matvec(int(qtype), raw, n_units, x, 0, mv.NO_CODES, mv.NO_FLOATS, xs, out)
    assert np.abs(out - want).max() <= 2e-6 * scale
    mv.matvec(int(qtype), raw, n_units, x, 32767, *_quantized_activations(x, 32767), out)
    assert np.abs(out - want).max() <= 2e-4 * scale
    dense = np.empty((raw.shape[0], cols), np.float32)
    mv.dequantize_rows(int(qtype), raw, n_units, 0, dense)
    np.testing.assert_array_equal(dense, w)


@settings(max_examples=16, deadline=None)
@given(
    qtype=st.sampled_from(QUANTS),
    rows=st.integers(1, 70),
    units=st.integers(1, 21),  # one-scale formats: groups of 8 and 4 blocks, then single blocks
    t=st.integers(1, 3),
    seed=st.integers(0, 2**31),
)
def test_matvec_random_blocks(qtype, rows, units, t, seed):
    rng = np.random.default_rng(seed)
    cols = units * mv.DECODERS[qtype].unit_values
    raw = random_blocks(qtype, rows, cols, rng)
    _check_matvec(qtype, raw, cols, rng.standard_normal((t, cols)).astype(np.float32))


def test_matvec_real_tensors(default_model):
    rng = np.random.default_rng(0)
    seen = set()
    for qt in default_model.weights.values():
        if qt.type in mv.QUANT_TYPES and qt.type not in seen and len(qt.shape) == 2:
            seen.add(qt.type)
            raw = qt.raw[:300]
            _check_matvec(qt.type, raw, qt.cols, rng.standard_normal((2, qt.cols)).astype(np.float32))
    assert seen >= {GGMLType.Q8_0, GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q6_K}


@settings(max_examples=10, deadline=None)
@given(t=st.integers(1, 4), heads=st.sampled_from([1, 2, 4]), seed=st.integers(0, 2**31))
def test_small_kernels_match_reference(t, heads, seed):
    rng = np.random.default_rng(seed)
    hd = 16
    x = rng.standard_normal((t, heads * hd)).astype(np.float32) * 3
    w = rng.standard_normal(hd).astype(np.float32)
    out = np.empty_like(x)
    k.rmsnorm(x, w, 1e-6, hd, out)
    np.testing.assert_allclose(out, ref.rmsnorm(x, w, 1e-6, hd), rtol=1e-5, atol=1e-5)
    pos = rng.integers(0, 5000, t).astype(np.int32)
    cos, sin = ref.rope_tables(pos, hd, 10000.0)
    k.rmsnorm_rope(x, w, 1e-6, cos, sin, hd, out)
    want = ref.rope(ref.rmsnorm(x, w, 1e-6, hd), pos, heads, hd, 10000.0)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    k.gelu_mul(x, x[::-1].copy(), out)
    # the kernel's rational tanh has an absolute error below 1e-6, so gelu(g) * u is off by up to
    # 0.5 * |g * u| * 1e-6 (~7e-5 for these values): near-zero outputs need that absolute tolerance
    atol = float(np.max(np.abs(x * x[::-1]))) * 1e-6
    np.testing.assert_allclose(out, ref.gelu_mul(x, x[::-1]), rtol=1e-5, atol=max(atol, 1e-5))
    k.softcap(x * 20, 30.0, out)
    np.testing.assert_allclose(out, ref.softcap(x * 20, 30.0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [0, 5])
def test_attention_over_ring_slots_matches_reference(window):
    rng = np.random.default_rng(1)
    hd, nh, nkv, n = 8, 4, 2, 12
    keys = rng.standard_normal((16, nkv * hd)).astype(np.float32)
    vals = rng.standard_normal((16, nkv * hd)).astype(np.float32)
    kpos = np.full(16, -1, np.int64)
    kpos[:n] = np.arange(n)
    q = rng.standard_normal((1, nh * hd)).astype(np.float32)
    a = {"head_dim": hd, "n_heads": nh, "n_kv_heads": nkv, "scale": 0.3, "window": window}
    got = attend(q, keys, vals, np.array([n - 1]), kpos, a)
    want = ref.attention(q, keys[:n], vals[:n], np.array([n - 1]), kpos[:n], nh, nkv, hd, 0.3, window)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("window", "ring"), [(0, 0), (5, 7)])
@pytest.mark.parametrize(
    ("hd", "nh", "nkv", "n"),
    [
        (16, 4, 2, 11),  # one range of keys, 2 query heads a KV head
        (24, 3, 1, 11),  # dims past the last whole 16 (loops), 3 query heads
        (256, 8, 1, 40),  # two calls of 4 query heads, 64-dim value slices, two key ranges (no ring)
        (80, 4, 1, 40),  # 64-dim and 16-dim value slices
        (256, 8, 2, 40),  # two KV heads: each one's columns
        (64, 6, 1, 20),  # 6 query heads a KV head: calls of 4 and 2
    ],
)
def test_decode_attention_kernel_matches_reference(window, ring, hd, nh, nkv, n):
    rng = np.random.default_rng(2)
    cap = ring or 64
    keys = rng.standard_normal((cap, nkv * hd)).astype(np.float32)
    vals = rng.standard_normal((cap, nkv * hd)).astype(np.float32)
    kpos = np.full(cap, -1, np.int64)
    for p in range(n):  # positions written as the cache does: slot = position (mod ring)
        kpos[p % ring if ring else p] = p
    q = rng.standard_normal(nh * hd).astype(np.float32)
    out = np.empty_like(q)
    k.attend_one(q, keys, vals, kpos, cap, n - 1, nh, hd, 0.3, window, out)
    seen = kpos >= 0
    want = ref.attention(
        q[None], keys[seen], vals[seen], np.array([n - 1]), kpos[seen], nh, nkv, hd, 0.3, window
    )
    np.testing.assert_allclose(out, want[0], rtol=1e-5, atol=1e-5)


def test_decode_program_equals_op_by_op(default_model):
    """The compiled one-token program computes what the op handlers compute (same kernels; split into shards
    it sums in another order: test_cpu_shards compares the two)."""
    cpu = make_backend("cpu", default_model, threads=2, tune="decode_shards=1")
    toks = default_model.tokenizer.encode("Programs must not change the numbers.")
    g1 = cpu.prepare_graph(default_model.graph(1, 1))
    assert cpu._program(g1, Step.single(cpu.new_cache(4), [1], 0)) is not None
    runs = []
    for lowered in (True, False):
        cache = cpu.new_cache(64)
        cpu.run(cpu.prepare_graph(default_model.graph(len(toks), 1)), Step.single(cache, toks, 0))
        if not lowered:
            cpu._programs[id(g1)] = (g1, None)
        runs.append(
            [cpu.run(g1, Step.single(cache, [5 + i], len(toks) + i, "last", "decode")) for i in range(3)]
        )
    assert cpu._program(g1, Step.single(cpu.new_cache(4), [1], 0)) is None  # the forced op-by-op run
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_greedy_program_token_is_the_argmax_of_its_logits(default_model):
    """run_greedy takes the argmax from the LM head's tasks (matvec.argmax_of_tasks): the token np.argmax
    picks from the same step's logits (run the same way: as one program, or in shards where the host's
    decode_shards > 1, whose column shares sum in another order)."""
    cpu = make_backend("cpu", default_model, threads=2)
    toks = default_model.tokenizer.encode("The argmax comes from the LM head's own tasks.")
    g1 = cpu.prepare_graph(default_model.graph(1, 1))
    caches = [cpu.new_cache(64), cpu.new_cache(64)]
    for cache in caches:
        cpu.run(cpu.prepare_graph(default_model.graph(len(toks), 1)), Step.single(cache, toks, 0))
    token = 5
    for i in range(4):
        steps = [Step.single(cache, [token], len(toks) + i, "last", "decode") for cache in caches]
        logits = cpu.run(g1, steps[0])
        if i % 2:
            token = cpu.run_greedy(g1, steps[1])
        else:  # as run_greedy does, but -1 (np.argmax's fallback) fails the test
            token = cpu._execute(cpu._program(g1, steps[1]), steps[1], None, argmax=True)[1]
        assert token == int(np.argmax(logits[-1]))


@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize(("hd", "nh", "nkv", "t"), [(16, 4, 2, 7), (24, 3, 1, 6), (256, 8, 1, 9)])
def test_attention_of_many_rows_matches_reference(window, hd, nh, nkv, t):
    """Prefill/verification rows (attend_rows): older slots first in any order (-1: empty), then the step's."""
    rng = np.random.default_rng(3)
    held = np.array([3, -1, 1, 0, 2], np.int64)  # positions of cache slots from earlier steps, out of order
    kpos = np.concatenate([held, np.arange(4, 4 + t, dtype=np.int64)])
    keys = rng.standard_normal((len(kpos), nkv * hd)).astype(np.float32)
    vals = rng.standard_normal((len(kpos), nkv * hd)).astype(np.float32)
    q = rng.standard_normal((t, nh * hd)).astype(np.float32)
    qpos = np.arange(4, 4 + t, dtype=np.int64)
    out = np.empty_like(q)
    k.attend_rows(q, keys, vals, kpos, qpos, nh, hd, 0.3, window, out)
    full = kpos >= 0
    want = ref.attention(q, keys[full], vals[full], qpos, kpos[full], nh, nkv, hd, 0.3, window)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=20, deadline=None)
@given(
    hd=st.sampled_from([8, 16, 40, 64, 96, 144]),
    nkv=st.integers(1, 3),
    group=st.integers(1, 9),
    n=st.integers(1, 70),
    t=st.integers(1, 5),
    window=st.sampled_from([0, 3, 17]),
    seed=st.integers(0, 2**31),
)
def test_attention_kernels_match_reference_for_any_shape(hd, nkv, group, n, t, window, seed):
    """attend_one (decode, key ranges merged) and attend_rows (several rows) against the reference."""
    rng = np.random.default_rng(seed)
    nh, total = nkv * group, n + t
    keys = rng.standard_normal((total, nkv * hd)).astype(np.float32)
    vals = rng.standard_normal((total, nkv * hd)).astype(np.float32)
    kpos = np.arange(total, dtype=np.int64)
    q = rng.standard_normal((t, nh * hd)).astype(np.float32)
    qpos = np.arange(n, total, dtype=np.int64)
    want = ref.attention(q, keys, vals, qpos, kpos, nh, nkv, hd, 0.2, window)
    rows = np.empty_like(q)
    k.attend_rows(q, keys, vals, kpos, qpos, nh, hd, 0.2, window, rows)
    np.testing.assert_allclose(rows, want, rtol=1e-4, atol=1e-5)
    one = np.empty(nh * hd, np.float32)
    k.attend_one(q[-1], keys, vals, kpos, total, total - 1, nh, hd, 0.2, window, one)
    np.testing.assert_allclose(one, want[-1], rtol=1e-4, atol=1e-5)


def test_attention_kernels_refuse_rows_that_are_not_back_to_back():
    keys = np.zeros((8, 32), np.float32)
    q, out, kpos = np.zeros((1, 32), np.float32), np.zeros((1, 32), np.float32), np.arange(8, dtype=np.int64)
    with pytest.raises(ValueError, match="C-contiguous"):
        k.attend_rows(q, keys[:, :16], keys[:, :16], kpos, kpos[:1], 2, 8, 0.3, 0, out[:, :16])
    with pytest.raises(ValueError, match="C-contiguous"):
        k.attend_one(q[0, :16], keys[:, ::2], keys[:, ::2], kpos, 8, 7, 2, 8, 0.3, 0, out[0, :16])


def test_each_dense_attention_has_its_kv_rows_prefetched_by_a_gate_up_before_it(default_model):
    cpu = make_backend("cpu", default_model, threads=2)
    prog = cpu._program(cpu.prepare_graph(default_model.graph(1, 1)), Step.single(cpu.new_cache(4), [1], 0))
    code = prog.code
    for i in np.flatnonzero(code["op"] == ins.ATTENTION):
        layer = code[i]["layer"]
        hosts = np.flatnonzero(code["pf_layer"] == layer + 1)
        assert len(hosts) == 1 and hosts[0] < i
        want = ins.NORM_MATMUL if layer == 0 else ins.NORM_MATMUL_GELU  # layer 0: its QKV
        assert code[hosts[0]]["op"] == want and code[hosts[0]]["pf_width"] == code[i]["kv_width"]
    region = np.zeros(3, np.int64)
    kv = np.array([[100, 200, 0, 8, 0]], np.int64)
    pg.kv_prefetch_region(kv, 0, 16, 5, region)
    assert region.tolist() == [100, 200, 5 * 16 * 4]
    pg.kv_prefetch_region(kv, 0, 1 << 20, 5, region)  # past PREFETCH_MAX: the first rows
    assert region[2] == mt.PREFETCH_MAX // 2
    pg.kv_prefetch_region(kv, 0, 16, 20, region)  # a ring of 8 slots, all written
    assert region[2] == 8 * 16 * 4


def test_fused_graph_on_numpy_equals_unfused(default_model):
    b = make_backend("numpy", default_model)
    toks = default_model.tokenizer.encode("Fusion must not change the numbers.")
    g = default_model.graph(len(toks), 2)
    fused = fuse(g)
    kinds = {op.kind for op in fused.ops}
    assert {"rmsnorm_matmul", "rmsnorm_matmul_gelu", "rmsnorm_rope", "matmul_rmsnorm_add"} <= kinds
    assert len(fused.ops) < len(g.ops)
    rows = np.array([0, len(toks) - 1])
    a = b.run(g, Step.single(b.new_cache(64), toks, 0, rows))
    f = b.run(fused, Step.single(b.new_cache(64), toks, 0, rows))
    np.testing.assert_array_equal(a, f)


def _logits(backend, model, toks, n_decode=3):
    cache = backend.new_cache(64)
    g = backend.prepare_graph(model.graph(len(toks), len(toks)))
    outs = [backend.run(g, Step.single(cache, toks, 0, "all"))]
    nxt = int(outs[-1][-1].argmax())
    for i in range(n_decode):
        g1 = backend.prepare_graph(model.graph(1, 1))
        outs.append(backend.run(g1, Step.single(cache, [nxt], len(toks) + i, "last", "decode")))
        nxt = int(outs[-1][-1].argmax())
    return outs


@pytest.fixture(scope="module")
def reference_logits(default_model):
    toks = default_model.tokenizer.encode("The capital of France is Paris, and the capital of Germany is")
    return toks, _logits(make_backend("numpy", default_model), default_model, toks)


@pytest.mark.parametrize(("act_quant", "tol"), [("int16", 0.05), ("none", 1e-3)])
def test_whole_model_logits_match_numpy(default_model, reference_logits, act_quant, tol):
    toks, want = reference_logits
    cpu = make_backend("cpu", default_model, act_quant=act_quant, threads=2)
    got = _logits(cpu, default_model, toks)
    for g, w in zip(got, want, strict=True):
        assert np.abs(g - w).max() < tol
    assert cpu.jit["warm_up_s"] > 0 and isinstance(cpu.jit["from_cache"], bool)


def test_one_and_two_threads_give_identical_logits(default_model):
    toks = default_model.tokenizer.encode("Threads must not change results.")
    one = _logits(make_backend("cpu", default_model, threads=1), default_model, toks, 2)
    two = _logits(make_backend("cpu", default_model, threads=2), default_model, toks, 2)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a, b)


def test_bad_options_are_clear_errors(default_model):
    with pytest.raises(ValueError, match="threads"):
        make_backend("cpu", default_model, threads=0)
    with pytest.raises(ValueError, match="threads"):
        make_backend("cpu", default_model, threads=100000)
    with pytest.raises(ValueError, match="act_quant"):
        make_backend("cpu", default_model, act_quant="int3")
    with pytest.raises(ValueError, match="unknown tunables"):
        make_backend("cpu", default_model, tune="act_qaunt=int8")
    with pytest.raises(ValueError, match="unknown tunables"):
        make_backend("numpy", default_model, tune="fused=0")


def test_unsupported_tensor_type_names_tensor_and_type(default_model):
    weights = dict(default_model.weights.items())
    name = "blk.0.attn_q.weight"
    weights[name] = dataclasses.replace(weights[name], type=GGMLType.Q4_1, _raw=None)
    model = dataclasses.replace(default_model, weights=weights)
    model._graphs = {}
    with pytest.raises(UnsupportedOpError, match=r"blk\.0\.attn_q\.weight.*Q4_1"):
        make_backend("cpu", model)
