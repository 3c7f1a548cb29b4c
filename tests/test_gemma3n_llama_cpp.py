"""Gemma 3n against llama.cpp on the checkpoint laid out as llama.cpp's graph hard-codes it.

tests/fixtures/gemma3n/llama_cpp_layout.gguf was written by llama.cpp's own convert_hf_to_gguf.py from a tiny
random ``Gemma3nForCausalLM`` (scripts/make_gemma3n_reference.py): 25 layers of which 20-24 share KV, 10 sparse
layers, per-layer inputs 256 wide, LAuReL rank 64, as llama.cpp's gemma3n graph assumes. Our numpy backend
matches transformers on it; llama.cpp (the packaged llama-server, on the CPU) picks the same greedy tokens
wherever the margin allows. Its logits differ from transformers' by up to ~0.2 because its Gaussian top-k
divides the variance by n - 1 where transformers divides by n (a 64-unit FFN here; 8,192 in E2B, where it
hardly matters); with our reference switched to that sample std the two agree to its float16 rounding
(docs/gemma3n.md).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

import workbench as wb
from workbench.eval.metrics import log_softmax
from workbench.ops import reference_gemma3n

FIXTURES = Path(__file__).parent / "fixtures"
GGUF = FIXTURES / "gemma3n" / "llama_cpp_layout.gguf"
TOLERANCE = 5e-4  # numpy vs transformers, both fp32
LLAMA_MARGIN = 0.05  # transformers' top-2 logit margin above which llama.cpp must pick the same token
LLAMA_SAME_STD = 0.02  # llama.cpp vs our reference with its sample std: max |log-probability difference|


@pytest.fixture(scope="module")
def reference():
    return json.loads((FIXTURES / "gemma3n_transformers.json").read_text())["models"]["llama_cpp_layout"]


@pytest.fixture(scope="module")
def model():
    return wb.load(GGUF)


@pytest.fixture(scope="module")
def server():
    from workbench.bench.llama_binary import LlamaBinaryUnavailable, packaged_binary
    from workbench.bench.llama_server import LlamaServerRunner

    try:
        runner = LlamaServerRunner(packaged_binary(), None, str(GGUF), 256, 2)
    except LlamaBinaryUnavailable as e:
        pytest.skip(f"llama.cpp's llama-server is not available: {e}")
    yield runner
    runner.close()


def test_layout_is_the_one_llama_cpp_assumes(model):
    c = model.config
    assert (c.n_layers, c.kv_shared_layers, c.ple_dim, c.laurel_rank) == (25, 5, 256, 64)
    assert [i for i, s in enumerate(c.activation_sparsity) if s > 0] == list(range(10))


@pytest.mark.parametrize("prompt", ["short", "long"])
def test_numpy_matches_transformers(model, reference, prompt):
    p = reference["prompts"][prompt]
    positions = sorted(int(k) for k in p["prefill"])
    e = wb.Engine(model, "numpy")
    got = e.forward(e.new_sequence(), p["ids"], logits=positions)
    want = np.array([p["prefill"][str(i)] for i in positions])
    assert float(np.abs(got - want).max()) < TOLERANCE
    seq = e.new_sequence()
    steps = np.stack([e.forward(seq, [t]) for t in p["ids"]])[positions]
    want = np.array([p["token_by_token"][str(i)] for i in positions])
    assert float(np.abs(steps - want).max()) < TOLERANCE


def _llama_logprobs(server, model, ids: list[int]) -> np.ndarray:
    """llama.cpp's log-probabilities after ``ids``; the token it generates is forced to a plain one."""
    emit = model.tokenizer.encode("a", add_bos=False)[0]
    return np.array(server.logprobs_after(ids, model.config.vocab_size, emit))


@pytest.mark.parametrize("prompt", ["short", "long"])
def test_llama_cpp_greedy_matches_transformers(server, model, reference, prompt):
    """Teacher-forced on transformers' greedy continuation: llama.cpp's most likely next token after each
    prefix is transformers' wherever transformers' top-2 margin exceeds LLAMA_MARGIN."""
    p = reference["prompts"][prompt]
    checked = []
    for k, (want, margin) in enumerate(zip(p["greedy"], p["greedy_margins"], strict=True)):
        if margin > LLAMA_MARGIN:
            got = int(np.nanargmax(_llama_logprobs(server, model, p["ids"] + p["greedy"][:k])))
            checked.append((k, got, want))
    assert len(checked) >= len(p["greedy"]) - 2
    assert all(got == want for _, got, want in checked), checked


def test_llama_cpp_differs_from_transformers_by_its_sample_std(server, model, reference, monkeypatch):
    """At each recorded prefill position llama.cpp's log-probabilities (all 300) are within LLAMA_SAME_STD of
    our reference computed with the sample std (n - 1), and several times further from transformers'."""
    p = reference["prompts"]["long"]
    ids = p["ids"]
    e = wb.Engine(model, "numpy")
    population = e.forward(e.new_sequence(), ids, logits=list(range(len(ids))))
    sample_std = functools.partial(reference_gemma3n.gaussian_topk, ddof=1)
    monkeypatch.setattr(reference_gemma3n, "gaussian_topk", sample_std)
    e = wb.Engine(model, "numpy")
    sample = e.forward(e.new_sequence(), ids, logits=list(range(len(ids))))
    compared = []
    for pos in sorted(int(k) for k in p["prefill"]):
        theirs = _llama_logprobs(server, model, ids[: pos + 1])
        assert not np.isnan(theirs).any()
        to_sample = float(np.abs(theirs - log_softmax(sample[pos])).max())
        to_population = float(np.abs(theirs - log_softmax(population[pos])).max())
        compared.append((pos, round(to_sample, 4), round(to_population, 4)))
    assert all(s < LLAMA_SAME_STD for _, s, _ in compared), compared
    assert max(t for _, _, t in compared) > 3 * max(s for _, s, _ in compared), compared
