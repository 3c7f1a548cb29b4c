"""Faults inside the continuous-batching scheduler: a backend error in a batched step, a KV cache that cannot
be made, a request's callback that raises. Only the request at fault fails; the others give exactly the
tokens they give alone (tiny model, numpy reference, greedy)."""

from __future__ import annotations

import numpy as np
import pytest
from fault_backend import FaultyBackend
from tiny import write_tiny_gguf

import workbench as wb
from workbench.runtime.scheduler import QueueFullError, Request, Scheduler


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return wb.load(write_tiny_gguf(tmp_path_factory.mktemp("t") / "tiny.gguf"))


@pytest.fixture(scope="module")
def cases(tiny_model):
    """Prompts longer than the sliding window (8), so the ring caches wrap, and their outputs alone."""
    rng = np.random.default_rng(7)
    prompts = [list(map(int, rng.integers(6, 300, n))) for n in (13, 21, 9, 40)]
    lengths = [14, 10, 16, 12]
    e = wb.Engine(tiny_model, "numpy")
    alone = [e.generate(p, n, stop_ids=[]).output_ids for p, n in zip(prompts, lengths, strict=True)]
    return prompts, lengths, alone


def unused_token(lists: list[list[int]]) -> int:
    used = {t for ids in lists for t in ids}
    return next(t for t in range(6, 300) if t not in used)


def solo_cache(model, prompt: list[int], max_len: int):
    e = wb.Engine(model, "numpy")
    seq = e.new_sequence(max_len)
    e.forward(seq, prompt)
    return seq.cache


def assert_same_kv(cache, reference) -> None:
    """Every layer holds the same positions with the same keys and values (to float32 rounding)."""
    assert cache.length == reference.length
    for got, ref in zip(cache.layers, reference.layers, strict=True):
        held, ref_held = got.pos >= 0, ref.pos >= 0
        order, ref_order = np.argsort(got.pos[held]), np.argsort(ref.pos[ref_held])
        assert np.array_equal(got.pos[held][order], ref.pos[ref_held][ref_order])
        np.testing.assert_allclose(got.keys[held][order], ref.keys[ref_held][ref_order], atol=1e-5)
        np.testing.assert_allclose(got.values[held][order], ref.values[ref_held][ref_order], atol=1e-5)


def test_backend_error_in_a_batched_step_fails_only_the_request_at_fault(tiny_model, cases):
    """The failing step holds three decoding requests and the middle prefill chunk of a long prompt, whose
    ring caches the failed step overwrote: all are recomputed and give their tokens alone."""
    prompts, lengths, alone = cases
    poison = unused_token(prompts + alone)
    backend = FaultyBackend(tiny_model, poison_token=poison)
    sched = Scheduler(wb.Engine(tiny_model, backend), max_batch=8, max_step_tokens=32)
    good = [sched.submit(Request(p, n)) for p, n in zip(prompts[:3], lengths[:3], strict=True)]
    while not all(r.output_ids for r in good):
        sched.step()
    good.append(sched.submit(Request(prompts[3], lengths[3])))
    sched.step()
    assert 8 < good[3].seq.cache.length < len(prompts[3])  # its prompt half fed
    bad = sched.submit(Request([2, 40, poison, 41, 42], 6))
    assert sched.step() == 5 and sched.stats.step_errors == 1
    assert all(r.suspect and r.seq is None and r.status == "waiting" for r in [*good, bad])  # caches freed
    while good[3].seq is None or good[3].seq.cache.length < len(prompts[3]):
        sched.step()
    assert_same_kv(good[3].seq.cache, solo_cache(tiny_model, prompts[3], good[3].max_len))
    while sched.has_work():
        sched.step()
    assert bad.finish_reason == "error" and "injected fault" in bad.error
    assert [r.output_ids for r in good] == alone
    assert all(r.finish_reason == "length" and not r.suspect for r in good)
    assert backend.faults == 2 and sched.stats.step_errors == 2  # the batched step, then the request alone
    h = sched.health()
    assert h["errors_recent"] == 1 and h["requests_failed"] == 1 and "injected fault" in h["last_error"]
    assert not sched.running and not sched.waiting and sched.kv_used_bytes() == 0


def test_cache_that_cannot_be_made_fails_that_request(tiny_model, cases):
    prompts, lengths, alone = cases
    backend = FaultyBackend(tiny_model, no_cache_len=33)
    sched = Scheduler(wb.Engine(tiny_model, backend), max_batch=2, max_step_tokens=32)
    bad = Request([5] * 30, 3)  # 33 tokens at full length
    reqs = sched.run_until_done([Request(prompts[0], lengths[0]), bad, Request(prompts[1], lengths[1])])
    assert bad.finish_reason == "error" and "MemoryError" in bad.error and backend.faults == 1
    assert [reqs[0].output_ids, reqs[2].output_ids] == alone[:2]


def test_callback_that_raises_fails_only_its_request(tiny_model, cases):
    prompts, lengths, alone = cases
    seen: list[int] = []

    def broken(req: Request, token: int | None, text: str) -> None:
        seen.append(token)
        if len(seen) == 3:
            raise ConnectionError("the client's queue is gone")

    sched = Scheduler(wb.Engine(tiny_model, "numpy"), max_batch=4)
    bad = Request(prompts[2], lengths[2], on_update=broken)
    reqs = sched.run_until_done([Request(prompts[0], lengths[0]), bad, Request(prompts[3], lengths[3])])
    assert bad.finish_reason == "error" and "ConnectionError" in bad.error and len(bad.output_ids) == 3
    assert [reqs[0].output_ids, reqs[2].output_ids] == [alone[0], alone[3]]


def test_waiting_kv_budget_refuses_with_retry_after(tiny_model):
    e = wb.Engine(tiny_model, "numpy")
    probe = Scheduler(e)
    one = probe.full_kv_bytes(Request([5] * 20, 20))
    sched = Scheduler(e, max_batch=1, max_waiting_kv_bytes=2 * one)
    first = sched.submit(Request([5] * 20, 20))
    sched.submit(Request([6] * 20, 20))
    with pytest.raises(QueueFullError) as err:
        sched.submit(Request([7] * 20, 20))
    assert err.value.code == "kv_budget_full" and err.value.retry_after_s >= 1
    assert sched.stats.requests_rejected == 1
    sched.step()  # the first is admitted: the queue has room again
    assert first.status == "running"
    sched.submit(Request([7] * 20, 20))
    big = Request([8] * 100, 100)  # more than the waiting budget, but alone in the queue it may wait
    while sched.waiting:
        sched.step()
    sched.submit(big)
    while sched.has_work():
        sched.step()
    assert big.finish_reason == "length"
