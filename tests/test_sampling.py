"""Sampler transforms: repetition penalty, top-k, top-p, min-p, greedy and seeded draws."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.runtime.sampling import SamplingParams, apply_repetition_penalty, filter_logits, make_sampler


def test_greedy_is_argmax():
    logits = np.array([0.1, 3.0, 2.0], np.float32)
    assert make_sampler(SamplingParams())(logits, []) == 1


def test_repetition_penalty_matches_hf_rule():
    out = apply_repetition_penalty(np.array([2.0, -2.0, 1.0], np.float32), [0, 1, 1], 2.0)
    np.testing.assert_allclose(out, [1.0, -4.0, 1.0])


def test_top_k_top_p_min_p():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert np.isfinite(filter_logits(logits, top_k=2)).sum() == 2
    assert np.isfinite(filter_logits(logits, top_p=0.7)).sum() == 2  # 0.5 + 0.3 reaches 0.7
    assert np.isfinite(filter_logits(logits, top_p=0.5)).sum() == 1
    assert np.isfinite(filter_logits(logits, min_p=0.2)).sum() == 3  # keeps p >= 0.1
    assert np.isfinite(filter_logits(logits, top_p=1e-9)).sum() == 1  # the best token always stays


def test_seeded_draws_follow_the_distribution():
    p = np.array([0.6, 0.3, 0.1])
    sampler = make_sampler(SamplingParams(temperature=1.0, seed=123))
    draws = np.bincount([sampler(np.log(p), []) for _ in range(3000)], minlength=3) / 3000
    np.testing.assert_allclose(draws, p, atol=0.03)
    again = make_sampler(SamplingParams(temperature=1.0, seed=123))
    first = make_sampler(SamplingParams(temperature=1.0, seed=123))
    assert [again(np.log(p), []) for _ in range(20)] == [first(np.log(p), []) for _ in range(20)]


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=-1),
        dict(top_k=-2),
        dict(top_p=0),
        dict(top_p=1.5),
        dict(min_p=1.0),
        dict(repetition_penalty=0),
        dict(temperature=float("nan")),
    ],
)
def test_invalid_params(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)
