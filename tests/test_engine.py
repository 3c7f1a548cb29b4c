"""KV cache, chunked prefill, context limits and generation on the tiny model and the default model."""

from __future__ import annotations

import numpy as np
import pytest
from tiny import TINY, write_tiny_gguf

import workbench as wb
from workbench.runtime.kv_cache import ContextLimitError, KVCache


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return wb.load(write_tiny_gguf(tmp_path_factory.mktemp("t") / "tiny.gguf"))


def test_decode_with_cache_equals_full_prefill(tiny_model):
    """Token-by-token decode through the ring buffers gives the logits of one full pass."""
    ids = list(np.random.default_rng(1).integers(6, 300, 40))
    full_engine = wb.Engine(tiny_model, "numpy")
    full = full_engine.forward(full_engine.new_sequence(), ids, logits="all")
    e = wb.Engine(tiny_model, "numpy")
    seq = e.new_sequence()
    step = np.stack([e.forward(seq, [t]) for t in ids])
    np.testing.assert_allclose(step, full, atol=2e-5)


@pytest.mark.parametrize("chunk", [1, 3, 8, 13])
def test_chunked_prefill_equals_single_pass(tiny_model, chunk):
    ids = list(np.random.default_rng(2).integers(6, 300, 30))
    ref = wb.Engine(tiny_model, "numpy", prefill_chunk=64)
    want = ref.forward(ref.new_sequence(), ids, logits="all")
    e = wb.Engine(tiny_model, "numpy", prefill_chunk=chunk)
    np.testing.assert_allclose(e.forward(e.new_sequence(), ids, logits="all"), want, atol=2e-5)
    rows = e.forward(e.new_sequence(), ids, logits=[0, 17, 29])
    np.testing.assert_allclose(rows, want[[0, 17, 29]], atol=2e-5)


def test_sliding_layers_do_not_grow():
    cache = KVCache(TINY, max_len=256)
    rng = np.random.default_rng(0)
    for start in range(0, 200, 20):
        pos = np.arange(start, start + 20)
        for layer in cache.layers:
            layer.append(pos, rng.standard_normal((20, TINY.kv_dim)), rng.standard_normal((20, TINY.kv_dim)))
    sliding = [layer for i, layer in enumerate(cache.layers) if TINY.is_sliding(i)]
    glob = [layer for i, layer in enumerate(cache.layers) if not TINY.is_sliding(i)]
    assert all(layer.capacity == TINY.sliding_window for layer in sliding)
    assert all(layer.capacity >= 200 for layer in glob)


def test_truncate_with_slack_keeps_window(tiny_model):
    """Rolling back k tokens (speculative decoding) is exact when the ring has k slots of slack."""
    ids = list(np.random.default_rng(3).integers(6, 300, 30))
    e = wb.Engine(tiny_model, "numpy")
    seq = e.new_sequence(slack=4)
    e.forward(seq, ids[:20])
    e.forward(seq, [7, 8, 9, 10])  # speculative tokens, rejected
    seq.cache.truncate(20)
    got = e.forward(seq, ids[20:], logits="all")
    ref = e.forward(e.new_sequence(), ids, logits="all")[20:]
    np.testing.assert_allclose(got, ref, atol=2e-5)


def test_context_limit(tiny_model):
    e = wb.Engine(tiny_model, "numpy", max_context=16)
    with pytest.raises(ContextLimitError, match="context limit of 16"):
        e.generate(list(range(2, 20)), max_tokens=1)
    r = e.generate(list(range(2, 12)), max_tokens=50, stop_ids=[])
    assert r.finish_reason == "context" and len(r.input_ids) + len(r.output_ids) <= 17
    with pytest.raises(ContextLimitError):
        wb.Engine(tiny_model, "numpy", max_context=10**6).new_sequence().cache.check_room(10**6)


def test_bad_inputs(tiny_model):
    e = wb.Engine(tiny_model, "numpy")
    with pytest.raises(ValueError, match="token ids"):
        e.forward(e.new_sequence(), [5, 10**6])
    with pytest.raises(ValueError, match="at least one token"):
        e.forward(e.new_sequence(), [])
    with pytest.raises(ValueError, match="max_tokens"):
        e.generate([2, 5], max_tokens=-1)
    with pytest.raises(ValueError, match="prefill_chunk"):
        wb.Engine(tiny_model, "numpy", prefill_chunk=0)


def test_generate_stops_on_end_of_turn(default_model, numpy_engine):
    r = numpy_engine.generate(
        "<start_of_turn>user\nSay hi.<end_of_turn>\n<start_of_turn>model\n", max_tokens=40
    )
    assert r.finish_reason in ("stop", "length")
    if r.finish_reason == "stop":
        assert r.output_ids[-1] in (1, 106)
    assert r.prefill_tok_s > 0 and r.text == default_model.tokenizer.decode(r.output_ids)


def test_sampling_is_seeded(numpy_engine):
    s = wb.SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=7)
    a = numpy_engine.generate("Once upon a time", max_tokens=8, sampling=s)
    b = numpy_engine.generate("Once upon a time", max_tokens=8, sampling=s)
    assert a.output_ids == b.output_ids
