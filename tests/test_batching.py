"""Ragged multi-sequence steps, the cpu batched kernel, and the continuous-batching scheduler."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from tiny import TINY, write_tiny_gguf

import workbench as wb
from workbench.models.config import ModelConfig
from workbench.models.synth import write_synthetic
from workbench.runtime.batch import SeqChunk, build_step, forward_batch
from workbench.runtime.scheduler import QueueFullError, Request, Scheduler, seq_kv_bytes

# small dims that are multiples of 256 where k-quants need it; ffn 384 makes ffn_down fall back to Q5_0/Q8_0
QUANT_TINY = ModelConfig(name="qtiny", n_layers=3, hidden=256, ffn=384, n_heads=4, n_kv_heads=1, head_dim=64,
                         vocab_size=512, context_length=512, sliding_window=16, sliding_window_pattern=3,
                         query_pre_attn_scalar=64)  # fmt: skip


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return wb.load(write_tiny_gguf(tmp_path_factory.mktemp("t") / "tiny.gguf"))


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    """The tiny model with a longer context, so global-layer caches grow past their first 256 slots."""
    config = replace(TINY, context_length=1024)
    return wb.load(write_tiny_gguf(tmp_path_factory.mktemp("l") / "long.gguf", config=config))


@pytest.fixture(scope="module")
def quant_model(tmp_path_factory):
    path = write_synthetic(QUANT_TINY, "q4_k_m", tmp_path_factory.mktemp("q") / "q.gguf", progress=False)
    return wb.load(path)


def _ragged_vs_alone(engine: wb.Engine, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Sequences of different lengths: some decode one token, some prefill a chunk, in one step."""
    rng = np.random.default_rng(seed)
    vocab = engine.model.config.vocab_size
    history = [list(rng.integers(6, vocab, n)) for n in (5, 1, 12, 9, 3)]
    new = [
        [int(rng.integers(6, vocab))],
        list(rng.integers(6, vocab, 4)),
        [7],
        list(rng.integers(6, vocab, 6)),
        [9],
    ]
    seqs = [engine.new_sequence(64) for _ in history]
    for s, h in zip(seqs, history, strict=True):
        engine.forward(s, h)
    got = forward_batch(engine, [SeqChunk(s, n, "all") for s, n in zip(seqs, new, strict=True)])
    want = []
    for h, n in zip(history, new, strict=True):
        s = engine.new_sequence(64)
        engine.forward(s, h)
        want.append(engine.forward(s, n, logits="all"))
    return got, want


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_ragged_step_equals_sequences_alone(tiny_model, backend):
    got, want = _ragged_vs_alone(wb.Engine(tiny_model, backend))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "tune", [None, "batch_min_rows=2"]
)  # one-row kernels per row (default), batched kernel
def test_cpu_batched_kernel_matches_reference_and_is_batch_invariant(quant_model, tune):
    """Quantized weights (Q4_K, Q6_K, Q5_0/Q8_0): the rows of a batched step equal the numpy oracle to float32
    rounding, and a sequence's logits are bit-identical whether it runs with 2 or 7 others."""
    cpu, ref = wb.Engine(quant_model, "cpu", tune=tune), wb.Engine(quant_model, "numpy")
    types = {t.type.name for t in quant_model.weights.values()}
    assert {"Q4_K", "Q6_K"} <= types and types & {"Q5_0", "Q8_0"}
    rng = np.random.default_rng(1)
    prompts = [list(rng.integers(6, 512, n)) for n in (4, 9, 2, 7, 5, 3, 8, 6)]

    def decode_batch(engine, idx):
        seqs = [engine.new_sequence(32) for _ in idx]
        for s, i in zip(seqs, idx, strict=True):
            engine.forward(s, prompts[i])
        return forward_batch(engine, [SeqChunk(s, [11 + i]) for s, i in zip(seqs, idx, strict=True)])

    eight = decode_batch(cpu, range(8))
    want = decode_batch(ref, range(8))
    for g, w in zip(eight, want, strict=True):
        np.testing.assert_allclose(g, w, atol=2e-3 * np.abs(w).max())
    three = decode_batch(cpu, [5, 0, 3])
    for g, i in zip(three, [5, 0, 3], strict=True):
        assert np.array_equal(g, eight[i])


def test_build_step_rejects_bad_batches(tiny_model):
    e = wb.Engine(tiny_model, "numpy")
    s = e.new_sequence(8)
    with pytest.raises(ValueError, match="only once"):
        build_step([SeqChunk(s, [1]), SeqChunk(s, [2])])
    with pytest.raises(ValueError, match="at least one token"):
        build_step([SeqChunk(s, [])])
    with pytest.raises(ValueError, match="at least one sequence"):
        build_step([])
    with pytest.raises(ValueError, match="logit rows"):
        build_step([SeqChunk(s, [1, 2], [5])])
    with pytest.raises(ValueError, match="context limit"):
        build_step([SeqChunk(s, list(range(6, 16)))])
    step, owned = build_step([SeqChunk(s, [5, 6, 7], "none"), SeqChunk(e.new_sequence(8), [8])])
    assert step.logit_rows.tolist() == [3] and owned[0] == slice(0, 0)


def _prompts(vocab: int, lengths, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(rng.integers(6, vocab, n)) for n in lengths]


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_scheduler_outputs_equal_requests_run_alone(tiny_model, backend):
    """Requests join and leave between steps (more requests than slots, chunked prefill beside decode)."""
    e = wb.Engine(tiny_model, backend)
    prompts = _prompts(300, (3, 17, 9, 30, 1, 12, 40))
    lengths = (20, 5, 12, 20, 8, 3, 15)
    alone = [e.generate(p, n, stop_ids=[]).output_ids for p, n in zip(prompts, lengths, strict=True)]
    sched = Scheduler(e, max_batch=3, max_step_tokens=16)
    reqs = sched.run_until_done([Request(p, n) for p, n in zip(prompts, lengths, strict=True)])
    assert [r.output_ids for r in reqs] == alone
    assert all(r.finish_reason == "length" and r.seq is None for r in reqs)
    assert max(sched.stats.batch_sizes) == 3 and sched.stats.generated_tokens == sum(lengths)
    assert not sched.running and not sched.waiting


def test_preemption_keeps_outputs_and_budget(long_model):
    """A KV budget too small for every grown cache: the youngest request is evicted and recomputed, the
    held KV bytes never exceed the budget, the oldest request never waits behind younger ones."""
    e = wb.Engine(long_model, "numpy")
    prompts = _prompts(300, (250, 240, 230, 220), seed=3)
    alone = [e.generate(p, 40, stop_ids=[]).output_ids for p in prompts]
    one = seq_kv_bytes(long_model.config, 290, 290)
    start = seq_kv_bytes(long_model.config, 256, 290)
    budget = 2 * one + 2 * start  # room for all four at first, for only two once their global layers grow
    sched = Scheduler(e, max_batch=4, max_step_tokens=1024, kv_budget_bytes=budget)
    reqs = [sched.submit(Request(p, 40)) for p in prompts]
    peak, first_done = 0, None
    while sched.has_work():
        sched.step()
        peak = max(peak, sched.kv_used_bytes())
        if first_done is None and any(r.done for r in reqs):
            first_done = next(i for i, r in enumerate(reqs) if r.done)
    assert sched.stats.preemptions > 0 and reqs[-1].preemptions > 0
    assert reqs[0].preemptions == 0 and first_done == 0
    assert peak <= budget
    assert [r.output_ids for r in reqs] == alone


def test_scheduler_bad_input_and_back_pressure(tiny_model):
    e = wb.Engine(tiny_model, "numpy")
    sched = Scheduler(e, max_batch=2, max_queue=2)
    with pytest.raises(ValueError, match="context limit"):
        sched.submit(Request([5] * 200, 100))
    with pytest.raises(ValueError, match="empty"):
        sched.submit(Request([], 4))
    with pytest.raises(ValueError, match="max_tokens"):
        sched.submit(Request([5], 0))
    with pytest.raises(ValueError, match="token ids"):
        sched.submit(Request([5, 300], 4))
    with pytest.raises(ValueError, match="KV cache"):
        Scheduler(e, kv_budget_bytes=1000).submit(Request([5], 4))
    with pytest.raises(ValueError, match="max_batch"):
        Scheduler(e, max_batch=0)
    a, b = sched.submit(Request([5, 6], 50)), sched.submit(Request([7], 3))
    with pytest.raises(QueueFullError) as err:
        sched.submit(Request([8], 3))
    assert err.value.retry_after_s >= 1 and sched.stats.requests_rejected == 1
    sched.step()
    assert a.seq is not None
    sched.cancel(a)  # a client went away: freed before the next step, the other goes on
    sched.step()
    assert a.done and a.finish_reason == "cancelled" and a.seq is None
    while sched.has_work():
        sched.step()
    assert b.finish_reason == "length" and len(b.output_ids) == 3


def test_decode_sweep_warms_each_size_for_the_asked_time(tiny_model, monkeypatch):
    """Warm-up runs: at least ``warmups`` per size and ``warmup_s`` seconds; none with ``warmups=0``."""
    import time

    from workbench.bench import batching

    calls: list[tuple[int, int]] = []

    def fake(engine, prompts, gen):
        calls.append((len(prompts), gen))
        time.sleep(0.01)
        return [0.01] * gen

    monkeypatch.setattr(batching, "time_batched_decode", fake)
    engine = wb.Engine(tiny_model, "numpy")
    rows = batching.decode_sweep(engine, [1, 2], 4, 3, 1, warmups=1, warmup_s=0.05)
    warm = calls[:-2]  # the last 2 calls are the measured repeats
    assert [r["batch"] for r in rows] == [1, 2]
    assert sum(1 for b, _ in warm if b == 1) >= 4 and sum(1 for b, _ in warm if b == 2) >= 4
    calls.clear()
    batching.decode_sweep(engine, [1, 2], 4, 3, 1, warmups=0, warmup_s=10.0)
    assert len(calls) == 2  # the repeats only


@pytest.mark.parametrize("bad", [-1, 10**6])
def test_out_of_range_tokens_in_a_batched_step_are_rejected(tiny_model, bad):
    """Token ids are checked before any work, in decode-sized steps and in long ones, and the caches keep their
    lengths."""
    eng = wb.Engine(tiny_model, "numpy")
    seqs = [eng.new_sequence(128) for _ in range(3)]
    for tokens in ([[1], [bad], [2]], [[1, 2], [*range(1, 70), bad], [3]]):
        with pytest.raises(ValueError, match="token ids must be in"):
            forward_batch(eng, [SeqChunk(s, t) for s, t in zip(seqs, tokens, strict=True)])
        assert [s.cache.length for s in seqs] == [0, 0, 0]
