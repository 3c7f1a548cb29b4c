"""Speculative decoding: drafts, exact equality with plain greedy decoding, rollback, acceptance, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tiny import write_tiny_gguf

import workbench as wb
from workbench.bench.speculative import REPETITIVE_PROMPTS, speculative_compare
from workbench.cli import main
from workbench.runtime.speculative import (
    ModelDrafter,
    NgramDrafter,
    layer_skip_model,
    make_drafter,
    speculative_generate,
)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return wb.load(write_tiny_gguf(tmp_path_factory.mktemp("t") / "tiny.gguf"))


class WrongDrafter:
    """Drafts that are always wrong (the worst case: every step rolls back k tokens)."""

    name = "wrong"

    def __init__(self, vocab: int):
        self.vocab = vocab

    def propose(self, context, k):
        return [(int(context[-1]) + 7 + i) % self.vocab for i in range(k)]


def test_ngram_drafter_proposes_what_followed_the_latest_match():
    d = NgramDrafter(max_ngram=2, min_ngram=1)
    assert d.propose([5, 6, 7, 8, 1, 5, 6, 9, 5, 6], 3) == [9, 5, 6]  # latest match of (5, 6)
    assert d.propose([5, 6, 7, 8, 1, 5, 6], 3) == [7, 8, 1]  # the latest match lacks 3 tokens after it
    assert d.propose([1, 2, 3, 4], 2) == []  # no earlier occurrence
    assert d.propose([3], 2) == []
    assert d.propose([4, 9, 4], 4) == [9, 4]  # fewer than k tokens follow the only match
    with pytest.raises(ValueError, match="min_ngram"):
        NgramDrafter(max_ngram=1, min_ngram=2)


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("draft", ["ngram", "layers", "wrong"])
def test_speculative_equals_greedy_on_numpy(tiny_model, draft, k):
    """The numpy oracle: speculative output is plain greedy output, token for token."""
    e = wb.Engine(tiny_model, "numpy")
    drafter = {
        "ngram": lambda: NgramDrafter(),
        "layers": lambda: ModelDrafter(layer_skip_model(tiny_model, 2), "layers:2"),
        "wrong": lambda: WrongDrafter(tiny_model.config.vocab_size),
    }[draft]()
    rng = np.random.default_rng(k)
    pattern = list(rng.integers(6, 300, 7))
    prompts = [pattern * 4, list(rng.integers(6, 300, 5)), [2, 40, 41, 42, 40, 41]]
    for p in prompts:
        want = e.generate(p, 40, stop_ids=[]).output_ids
        got = speculative_generate(e, p, 40, drafter, k, stop_ids=[])
        assert got.output_ids == want
        assert got.finish_reason == "length" and len(got.output_ids) == 40
        assert got.drafted >= got.accepted >= 0 and got.verify_steps == len(got.accepted_per_step)
        if draft == "wrong":
            assert got.accepted == 0 and got.verify_steps == 39  # one token per step, every draft rolled back


def test_repetitive_prompt_accepts_drafts_and_saves_steps(tiny_model):
    e = wb.Engine(tiny_model, "numpy")
    p = [11, 12, 13, 14, 15] * 6
    res = speculative_generate(e, p, 48, NgramDrafter(), 4, stop_ids=[])
    assert res.output_ids == e.generate(p, 48, stop_ids=[]).output_ids
    assert res.acceptance_rate > 0.3 and res.verify_steps < 47
    d = res.to_dict()
    assert d["acceptance_rate"] == res.acceptance_rate and d["timing"].startswith("measured")


def test_stop_token_ends_speculation(tiny_model):
    e = wb.Engine(tiny_model, "numpy")
    p = [20, 21, 22, 23] * 5
    plain = e.generate(p, 30, stop_ids=[]).output_ids
    stop = plain[5]
    got = speculative_generate(e, p, 30, NgramDrafter(), 4, stop_ids=[stop])
    assert got.output_ids == plain[: plain.index(stop) + 1] and got.finish_reason == "stop"


def test_quant_draft_of_the_same_model_and_cpu_verification(tiny_model):
    """An int4 copy of the model drafts; the cpu backend verifies (its multi-row verification runs the
    batched kernel, its single-row decode the one-row kernel, summing in other orders: outputs are compared,
    not assumed)."""
    drafter = make_drafter("quant:int4-g32", tiny_model)
    assert drafter.name == "quant:int4-g32"
    p = [30, 31, 32, 33, 34] * 4
    for backend in ("numpy", "cpu"):
        e = wb.Engine(tiny_model, backend)
        got = speculative_generate(e, p, 24, drafter, 4, stop_ids=[])
        assert got.output_ids == e.generate(p, 24, stop_ids=[]).output_ids, backend
        assert got.acceptance_rate > 0.25  # int4 of the same (random, small-margin) weights often agrees


def test_real_model_speculative_equals_greedy(numpy_engine):
    """Gemma 3 270M on the numpy oracle, a short repetitive prompt: identical to plain greedy."""
    prompt = "one two three four five, one two three four five, one two three"
    want = numpy_engine.generate(prompt, 12).output_ids
    got = speculative_generate(numpy_engine, prompt, 12, NgramDrafter(), 4)
    assert got.output_ids == want
    assert got.verify_steps < len(want) - 1  # drafts were accepted


def test_speculative_bad_input(tiny_model):
    e = wb.Engine(tiny_model, "numpy")
    with pytest.raises(ValueError, match="k"):
        speculative_generate(e, [5, 6], 4, NgramDrafter(), 0)
    with pytest.raises(ValueError, match="max_tokens"):
        speculative_generate(e, [5, 6], 0, NgramDrafter(), 2)
    with pytest.raises(ValueError, match="context limit"):
        speculative_generate(e, [5] * 250, 10, NgramDrafter(), 4)
    with pytest.raises(ValueError, match="empty"):
        speculative_generate(e, [], 4, NgramDrafter(), 2)
    for spec, match in [("beam", "unknown draft"), ("layers:9", "draft layers"), ("layers:x", "layers:N"),
                        ("ngram:a-b", "n-gram"), ("quant:", "quant:SPEC"), ("quant:int3", "unknown weight format")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            make_drafter(spec, tiny_model)


def test_compare_and_cli(tiny_model, capsys):
    e = wb.Engine(tiny_model, "numpy")
    out = speculative_compare(e, NgramDrafter(), REPETITIVE_PROMPTS[:2], 16, 4, 1)
    assert out["identical"] and out["decode_speedup"]["ratio"] > 0 and len(out["prompts"]) == 2
    assert out["how"].startswith("measured")
    capsys.readouterr()
    rc = main(["speculate", "--model", tiny_model.source, "--backend", "numpy", "-n", "8", "-r", "1",
               "--prompt", "a b c a b c a b", "--json", "--no-record"])  # fmt: skip
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["identical"] and res["drafter"] == "ngram:1-3" and res["backend"] == "numpy"
