"""Correctness at the large sizes' layouts on tiny random models (tests/layouts.py).

The numpy reference against Hugging Face transformers fp32 (tests/fixtures/gemma3_layouts_transformers.json,
made by scripts/make_layout_reference.py) on the 27B's attention layout and on a Hub-style 4B directory;
then the ``cpu`` and ``vulkan`` backends against numpy on the 27B layout (F32 and Q8_0 weights): greedy
tokens equal, logits close, also past the sliding window.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from layouts import LAYOUT_27B, layout_weights, weights_digest, write_conditional_hf
from tiny import tiny_vocab, write_tiny_hf

import workbench as wb
from workbench.models.gguf_writer import write_gguf
from workbench.quant.formats import GGMLType

FIXTURE = Path(__file__).parent / "fixtures" / "gemma3_layouts_transformers.json"
TOLERANCE = 1e-4  # max |logit difference| numpy vs transformers, both fp32
MARGIN = 2e-3  # steps whose top-2 margin exceeds this must pick the same token as transformers
# the fields transformers resolved for each layout, as the engine's config names them
FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden",
    "intermediate_size": "ffn",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads",
    "head_dim": "head_dim",
    "query_pre_attn_scalar": "query_pre_attn_scalar",
    "sliding_window": "sliding_window",
    "max_position_embeddings": "context_length",
    "rms_norm_eps": "rms_eps",
    "final_logit_softcapping": "final_logit_softcap",
}


@pytest.fixture(scope="module")
def reference():
    return json.loads(FIXTURE.read_text())["layouts"]


@pytest.fixture(scope="module")
def models(tmp_path_factory, reference):
    """The fixture's weights as transformers read them: the 27B layout as a Gemma3ForCausalLM directory,
    the 4B as a Hub-style Gemma3ForConditionalGeneration directory."""
    root = tmp_path_factory.mktemp("layouts")
    out = {}
    for name, ref in reference.items():
        weights = layout_weights(name)
        assert weights_digest(weights) == ref["weights_sha256"], (
            f"tests/layouts.py makes other {name} weights than the fixture's: run `make fixtures`"
        )
        if ref["class"] == "Gemma3ForConditionalGeneration":
            folder = write_conditional_hf(root / name, weights, "hub")
        else:
            folder = write_tiny_hf(root / name, weights, config=LAYOUT_27B)
        out[name] = wb.load(folder)
    return out


def test_fixture_covers_both_layouts(reference):
    assert set(reference) == {"27b", "4b"}
    for ref in reference.values():
        assert {len(p["ids"]) for p in ref["prompts"].values()} == {6, 40}  # 40 crosses the 16-token window


@pytest.mark.parametrize("name", ["27b", "4b"])
def test_config_is_what_transformers_resolved(models, reference, name):
    """Every size, the scale, the window, the layer types and the RoPE of each layer type agree."""
    c, t = models[name].config, reference[name]["transformers_text_config"]
    for hf_key, ours in FIELDS.items():
        assert getattr(c, ours) == t[hf_key], f"{hf_key}: ours {getattr(c, ours)}, transformers {t[hf_key]}"
    assert c.layer_types == tuple("global" if x == "full_attention" else "sliding" for x in t["layer_types"])
    full, local = t["rope_parameters"]["full_attention"], t["rope_parameters"]["sliding_attention"]
    assert (c.rope_base_global, c.rope_base_local) == (full["rope_theta"], local["rope_theta"])
    assert c.rope_scale_global == (full["factor"] if full["rope_type"] == "linear" else 1.0) == 8.0
    assert local["rope_type"] == "default"


@pytest.mark.parametrize("prompt", ["short", "long"])
@pytest.mark.parametrize("name", ["27b", "4b"])
def test_numpy_logits_match_transformers(models, reference, name, prompt):
    ref = reference[name]
    p = ref["prompts"][prompt]
    positions = sorted(int(k) for k in p["positions"])
    e = wb.Engine(models[name], "numpy")
    rows = e.forward(e.new_sequence(), p["ids"], logits=positions)
    refs = [p["positions"][str(q)] for q in positions]
    assert rows.argmax(axis=1).tolist() == [r["top_ids"][0] for r in refs]
    worst = max(
        max(float(np.abs(row[r["top_ids"]] - r["top_logits"]).max()) for row, r in zip(rows, refs)),
        float(np.abs(rows[:, ref["sample_ids"]] - np.array([r["sample_logits"] for r in refs])).max()),
    )
    assert worst < TOLERANCE, f"max |logit difference| {worst:.3g} (tolerance {TOLERANCE})"


@pytest.mark.parametrize("prompt", ["short", "long"])
@pytest.mark.parametrize("name", ["27b", "4b"])
def test_numpy_greedy_matches_transformers(models, reference, name, prompt):
    """Teacher-forced on transformers' greedy tokens (prefill, then decode steps with the KV cache): our
    argmax equals theirs at every step whose top-2 margin exceeds ``MARGIN``."""
    p = reference[name]["prompts"][prompt]
    e = wb.Engine(models[name], "numpy")
    seq = e.new_sequence()
    ours = [int(np.argmax(e.forward(seq, p["ids"])))]
    ours += [int(np.argmax(e.forward(seq, [t]))) for t in p["greedy"][:-1]]
    checked = [
        (i, a, b) for i, (a, b, m) in enumerate(zip(ours, p["greedy"], p["greedy_margins"])) if m > MARGIN
    ]
    assert len(checked) >= len(p["greedy"]) - 2
    assert all(a == b for _, a, b in checked), f"(step, ours, transformers): {checked}"


# -- cpu and vulkan on the 27B layout -------------------------------------------------------------------
PROMPT = [2, 17, 201, 44, 5, 99, 123, 7, 8, 250, 31, 64, 211, 40, 77, 150, 9, 33, 180, 61]  # > the window
GREEDY = 8


def _layout_gguf(path: Path, qtype: str) -> Path:
    tensors = {}
    for name, w in layout_weights("27b").items():
        if w.ndim == 2 and qtype == "q8_0":
            tensors[name] = (GGMLType.Q8_0, gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0))
        else:
            tensors[name] = (GGMLType.F32, w)
    return write_gguf(path, LAYOUT_27B, tensors, tiny_vocab())


@pytest.fixture(scope="module", params=["f32", "q8_0"])
def layout_27b(request, tmp_path_factory):
    """(quant, model, numpy's greedy tokens, numpy's logits) of the 27B-layout model as a GGUF (F32, or
    Q8_0 matrices); the logits are of a prefill of the 20-token prompt (every row, past the 16-token
    window) then one decode step per greedy token."""
    quant = request.param
    model = wb.load(str(_layout_gguf(tmp_path_factory.mktemp("l27") / f"{quant}.gguf", quant)))
    e = wb.Engine(model, "numpy")
    greedy = e.generate(PROMPT, max_tokens=GREEDY, stop_ids=[]).output_ids
    return quant, model, greedy, _logits(e, greedy)


def _logits(engine: wb.Engine, greedy: list[int]) -> np.ndarray:
    seq = engine.new_sequence()
    rows = [engine.forward(seq, PROMPT, logits="all")]
    rows += [engine.forward(seq, [t])[None] for t in greedy[:-1]]
    return np.concatenate(rows)


def _check(engine: wb.Engine, reference, atol: float) -> None:
    """Greedy tokens equal numpy's; logits within ``atol`` at every prefill row and decode step (a random
    model with a tied head repeats one token greedily, so the logits are the finer check)."""
    _, _, greedy, want = reference
    assert engine.generate(PROMPT, max_tokens=GREEDY, stop_ids=[]).output_ids == greedy
    got = _logits(engine, greedy)
    assert np.abs(got - want).max() < atol, f"max |logit difference| {np.abs(got - want).max():.3g}"


def test_cpu_backend_equals_numpy(layout_27b):
    """Float weights within 1e-4; Q8_0 with the default int16 activations within 5e-3 (the README's
    bound for them)."""
    quant, model = layout_27b[:2]
    _check(wb.Engine(model, "cpu"), layout_27b, atol=1e-4 if quant == "f32" else 5e-3)


def test_vulkan_backend_equals_numpy(layout_27b):
    """Within 1e-4 for both weight formats (float accumulation throughout), validation layer on."""
    from test_vulkan import REASON, vulkan_engine

    if REASON:
        pytest.skip(f"VULKAN TESTS SKIPPED: {REASON}")
    engine = vulkan_engine(layout_27b[1])
    _check(engine, layout_27b, atol=1e-4)
    engine.backend.dev.check_validation()
