"""Block-sparse attention: spec errors, the mask, the cpu kernels against a dense masked reference, backends."""

from __future__ import annotations

import numpy as np
import pytest
from quant_models import forward_logits, tiny_model

from workbench.ops import reference as ref
from workbench.quant.spec import SpecError
from workbench.sparsity.apply import build_variant
from workbench.sparsity.attention import KIND, block_mask
from workbench.sparsity.spec import parse_sparsity

RNG = np.random.default_rng(7)


def test_spec():
    s = parse_sparsity("attn-blocks=64:1:4:8@5+11", n_layers=18).attn_blocks
    assert (s.block, s.sink, s.local, s.stride, s.layers) == (64, 1, 4, 8, frozenset({5, 11}))
    assert parse_sparsity("attn-blocks=16:0:2").attn_blocks.stride == 0
    assert not parse_sparsity("attn-blocks=16:0:2").is_dense


@pytest.mark.parametrize(
    "text, message",
    [("attn-blocks=0:1:4", "block size must be >= 1"), ("attn-blocks=8:1:0", "LOCAL must be >= 1"),
     ("attn-blocks=8:1:2:1", "STRIDE 1"), ("attn-blocks=8:1", "BLOCK:SINK:LOCAL"),
     ("attn-blocks=8:-1:2", "whole numbers"), ("attn-blocks=a:1:2", "whole numbers"),
     ("attn-blocks=8:1:2@40", "does not exist")],
)  # fmt: skip
def test_bad_specs(text, message):
    with pytest.raises(SpecError, match=message):
        parse_sparsity(text, n_layers=18)


def test_mask_keeps_sinks_local_and_strided_blocks():
    q = np.array([37])  # block 9 of size 4
    k = np.arange(38)
    kept_blocks = sorted({int(p) // 4 for p in k[block_mask(q, k, (4, 1, 2, 3))[0]]})
    assert kept_blocks == [0, 3, 6, 8, 9]  # sink 0; stride 3: 0, 3, 6, 9; local: 8, 9


def _qkv(t: int, s: int, nh: int = 4, nkv: int = 2, hd: int = 16):
    return (RNG.standard_normal((t, nh * hd)).astype(np.float32),
            RNG.standard_normal((s, nkv * hd)).astype(np.float32),
            RNG.standard_normal((s, nkv * hd)).astype(np.float32))  # fmt: skip


@pytest.mark.parametrize("blocks", [(4, 1, 1, 0), (3, 0, 2, 4), (5, 2, 1, 2), (64, 1, 1, 0)])
@pytest.mark.parametrize("window", [0, 9])
def test_cpu_kernels_match_the_dense_masked_reference(blocks, window):
    from workbench.backends.numba_cpu.sparse_attention import attend_blocks, attend_blocks_one

    a = {"n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "scale": 0.25, "window": window, "blocks": blocks}
    q, k, v = _qkv(20, 40)
    qpos, kpos = np.arange(20, 40), np.arange(40)
    want = ref.attention(q, k, v, qpos, kpos, 4, 2, 16, 0.25, window, block_mask(qpos, kpos, blocks))
    np.testing.assert_allclose(attend_blocks(q, k, v, qpos, kpos, a), want, rtol=1e-4, atol=1e-5)
    # decode at position 39, on a ring of 16 slots (slot = position mod 16, so a window of at most 16) and
    # on a plain cache (slot = position)
    for ring, win in ((0, window), (16, min(window, 16) if window else 16)):
        n_slots = ring or 40
        keys, vals = np.zeros((n_slots, 32), np.float32), np.zeros((n_slots, 32), np.float32)
        pos = np.full(n_slots, -1)
        for p in range(40):
            slot = p % ring if ring else p
            keys[slot], vals[slot], pos[slot] = k[p], v[p], p
        out = np.empty(64, np.float32)
        attend_blocks_one(q[-1], keys, vals, pos, n_slots, ring, 39, 4, 16, 0.25, win, np.array(blocks), out)
        qp = np.array([39])
        want1 = ref.attention(q[-1:], k, v, qp, kpos, 4, 2, 16, 0.25, win, block_mask(qp, kpos, blocks))
        np.testing.assert_allclose(out, want1[0], rtol=1e-4, atol=1e-5)


def test_decode_kernel_reads_only_kept_blocks():
    from workbench.backends.numba_cpu.sparse_attention import block_slots

    pos = np.arange(1000)
    seen = block_slots(pos, 1000, 0, 999, 0, np.array([100, 1, 2, 0]))
    np.testing.assert_array_equal(seen, np.concatenate([np.arange(100), np.arange(800, 1000)]))


@pytest.mark.parametrize(
    "sparsity", ["attn-blocks=4:1:1", "attn-blocks=2:1:2:3@0+2", "attn-blocks=3:0:1,attn-window=5"]
)
@pytest.mark.parametrize("qtype", ["Q8_0", "F32"])
def test_cpu_matches_the_numpy_oracle(tmp_path, sparsity, qtype):
    """Prefill (per query block) and decode (kept blocks only; for Q8_0 inside the compiled step program)."""
    v = build_variant(tiny_model(tmp_path, qtype), "native", sparsity, progress=False)
    assert KIND in {op.kind for op in v.graph(1, 1).ops}
    want, got = forward_logits(v, "numpy"), forward_logits(v, "cpu")
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max())


def test_blocks_that_keep_everything_are_dense_attention(tmp_path):
    m = tiny_model(tmp_path)
    dense = forward_logits(m, "numpy")
    v = build_variant(m, "native", "attn-blocks=4:100:1", progress=False)  # every block is a sink
    np.testing.assert_allclose(forward_logits(v, "cpu"), dense, atol=2e-3 * np.abs(dense).max())
    assert not np.allclose(
        forward_logits(build_variant(m, "native", "attn-blocks=2:0:1", progress=False), "numpy"), dense
    )


def test_program_lowers_block_sparse_attention(tmp_path):
    import workbench as wb
    from workbench.backends.base import Step

    e = wb.Engine(build_variant(tiny_model(tmp_path, "Q8_0"), "native", "attn-blocks=4:1:1"), "cpu")
    graph = e.backend.prepare_graph(e.model.graph(1, 1))
    assert e.backend._program(graph, Step.single(e.new_sequence(4).cache, [5], 0, "last", "decode"))
    e.close()


def test_cost_counts_only_kept_keys(tmp_path):
    from workbench.ops.kinds import op_cost

    m = tiny_model(tmp_path)
    dense_g = m.graph(1, 1)
    sparse_g = build_variant(m, "native", "attn-blocks=4:1:1@2", progress=False).graph(1, 1)
    pos = np.array([200])
    dense = op_cost(next(op for op in dense_g.ops if op.name == "blk.2.attn"), dense_g, pos)
    sparse = op_cost(next(op for op in sparse_g.ops if op.name == "blk.2.attn"), sparse_g, pos)
    assert sparse.flops < 0.1 * dense.flops and sparse.bytes_read < 0.1 * dense.bytes_read


def test_vulkan_refuses_block_sparse_attention(tmp_path):
    """Refused at construction, before any device work (so that `auto` passes over it), naming the kind."""
    import workbench as wb
    from workbench.backends.base import UnsupportedOpError

    v = build_variant(tiny_model(tmp_path), "native", "attn-blocks=4:1:1", progress=False)
    with pytest.raises(UnsupportedOpError, match=KIND):
        wb.Engine(v, "vulkan")


def test_npu_backend_runs_sparse_ops_on_its_host(tmp_path):
    """The npu backend has no kernel for the sparse kinds: they run on its host (the numpy reference)."""
    v = build_variant(tiny_model(tmp_path), "native", "attn-blocks=4:1:1,ffn-topk=0.5", progress=False)
    want, got = forward_logits(v, "numpy"), forward_logits(v, "npu")  # npu matmuls: emulated bf16
    np.testing.assert_allclose(got, want, atol=0.05 * np.abs(want).max())


def test_eval_measures_block_sparse_attention_after_a_long_prompt(tmp_path):
    from workbench.eval.run import EvalConfig, evaluate

    cfg = EvalConfig(sparsity="attn-blocks=4:1:1", tokens=40, window=40, chunk=8, prompts=0, speed_tokens=4,
                     repeats=1, speed_prompt=60)  # fmt: skip
    res = evaluate(cfg, model=tiny_model(tmp_path, "Q8_0"), progress=False)
    a, s = res["accuracy"], res["speed"]
    assert a["kl_mean"] > 0 and a["top1_agreement"] < 1.0
    assert s["prompt_tokens"] == 61 and s["attn_ms_per_token"] > 0 and s["attn_ms_per_token_ref"] > 0
