"""Gemma 3n on the ``vulkan`` backend (lavapipe with the Khronos validation layer): the three tiny checkpoints
of tests/fixtures/gemma3n/ and the llama.cpp-converted GGUF against the numpy reference, prefill and token by
token, the sparse layers' skipping on and off (the dense twin), greedy tokens equal, validation clean."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_vulkan import REASON, assert_close, vulkan_engine

import workbench as wb
from workbench.backends.base import UnsupportedOpError
from workbench.models import synth
from workbench.models.config import preset

pytestmark = pytest.mark.skipif(bool(REASON), reason=f"VULKAN TESTS SKIPPED: {REASON}")

FIXTURES = Path(__file__).parent / "fixtures" / "gemma3n"
MODELS = ("e2b_pattern", "gqa_softcap", "shared_alternating", "e2b_pattern.gguf")
# 13 tokens: the windows (8, 4, 6) are crossed in the prefill and again while decoding
TOKENS = [2, 17, 201, 44, 5, 99, 123, 7, 8, 250, 31, 64, 211]
REL = 2e-4  # the backend's tolerance (tests/test_vulkan.py)


@pytest.fixture(scope="module")
def models() -> dict[str, wb.Model]:
    return {n: wb.load(str(FIXTURES / n)) for n in MODELS}


def _sparse_dispatches(ev: wb.Engine) -> set[str]:
    """The sparse-layer defines (SPARSE_UP, SKIP_ZERO, OP_DOWN_T) of every recorded program's dispatches."""
    return {
        d
        for p in ev.backend.programs.values()
        for x in p.dispatches
        for d in x.defines
        if d in ("SPARSE_UP", "SKIP_ZERO", "OP_DOWN_T")
    }


@pytest.mark.parametrize(
    "name,skip,fuse,down_t",
    [(n, 1, 1, 1) for n in MODELS]
    + [
        ("e2b_pattern", 0, 1, 1),
        ("gqa_softcap", 0, 1, 1),
        ("e2b_pattern", 1, 0, 1),
        ("gqa_softcap", 1, 1, 0),
    ],
)
def test_logits_match_numpy(models, name, skip, fuse, down_t):
    """Prefill (all logits, GEMM path), a 4-token step (batched matvec) and single tokens equal numpy, with
    the sparse layers' skipping on and off (the dense twin; the down projection by transposed rows or by
    zero chunks) and Gemma 3n's folded dispatches on and off."""
    model = models[name]
    tune = f"ffn.sparse_skip={skip},gemma3n.fuse={fuse},ffn.down_t={down_t}"
    en, ev = wb.Engine(model, "numpy"), vulkan_engine(model, tune=tune)
    sn, sv = en.new_sequence(), ev.new_sequence()
    assert_close(ev.forward(sv, TOKENS, logits="all"), en.forward(sn, TOKENS, logits="all"), REL)
    chunk = [3, 141, 59, 26]
    assert_close(ev.forward(sv, chunk, logits="all"), en.forward(sn, chunk, logits="all"), REL)
    for t in range(4):
        tok = (37 * t + 11) % model.config.vocab_size
        assert_close(ev.forward(sv, [tok]), en.forward(sn, [tok]), REL)
    sparse = any(s > 0 for s in model.config.activation_sparsity)
    down = "OP_DOWN_T" if down_t else "SKIP_ZERO"
    assert _sparse_dispatches(ev) == ({"SPARSE_UP", down} if skip and sparse else set())
    folded = {d for p in ev.backend.programs.values() for x in p.dispatches for d in x.defines}
    folds = {"OP_LAUREL_NORM", "OP_PLE_INJECT_NORM", "GATE_MUL", "V_NORM", "INJECT"}
    assert folded & folds == (folds if fuse else set())
    ev.backend.dev.check_validation()


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> wb.Model:
    """E2B's layout and llama-quantize's Q4_K_M types (Q4_K, Q6_K, F16 AltUp/LAuReL, F32 coefficients) at a
    size lavapipe runs: 10 layers (7 own a cache), hidden 256, the first 4 sparse."""
    config = preset("gemma3n-e2b").with_(
        name="gemma3n-q", n_layers=10, hidden=256, ffn=512, vocab_size=512, ple_vocab_size=512,
        kv_shared_layers=3, activation_sparsity=(0.95,) * 4 + (0.0,) * 6, context_length=64,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("g3nq") / "q.gguf"
    return wb.load(str(synth.write_synthetic(config, "q4_k_m", path, progress=False, vocab="generated")))


@pytest.mark.parametrize("down_t", [1, 2])
def test_quantized_e2b_layout_matches_numpy(quantized, down_t):
    """The block-format paths of E2B's Q4_K_M file (sparse up rows, the transposed down copy in float16 or
    float32, the stacked F16 AltUp weights) against numpy, prefill and token by token."""
    en, ev = wb.Engine(quantized, "numpy"), vulkan_engine(quantized, tune=f"ffn.down_t={down_t}")
    sn, sv = en.new_sequence(), ev.new_sequence()
    assert_close(ev.forward(sv, TOKENS, logits="all"), en.forward(sn, TOKENS, logits="all"), REL)
    for tok in (3, 141, 59):
        got, want = ev.forward(sv, [tok]), en.forward(sn, [tok])
        # float16 rounding of the dequantized down weight moves the logits (~1e-4 of their range here);
        # the float32 copy is exact
        assert_close(got, want, REL if down_t == 1 else 5e-6)
    ev.backend.dev.check_validation()


@pytest.mark.parametrize("name", ["e2b_pattern", "shared_alternating"])
def test_greedy_tokens_equal_numpy(models, name):
    """Greedy decoding on the device (argmax there) gives numpy's tokens."""
    model = models[name]
    prompt = TOKENS[:6]
    want = wb.Engine(model, "numpy").generate(prompt, max_tokens=10).output_ids
    ev = vulkan_engine(model)
    assert ev.generate(prompt, max_tokens=10).output_ids == want
    ev.backend.dev.check_validation()


def test_chunked_prefill_equals_one_prefill(models):
    """Steps of 5 tokens over the sliding window (sharing layers read the owner's ring in the same step)."""
    model = models["e2b_pattern"]
    ev = vulkan_engine(model)
    whole = ev.forward(ev.new_sequence(), TOKENS, logits="all")
    s = ev.new_sequence()
    parts = [ev.forward(s, TOKENS[i : i + 5], logits="all") for i in range(0, len(TOKENS), 5)]
    assert_close(np.concatenate(parts), whole, REL)
    ev.backend.dev.check_validation()


def test_caches_only_for_owning_layers_and_ple_table_host_visible(models):
    """KV buffers exist for the layers that own a cache (sharing layers use their owner's); the per-layer
    embedding table is in host-visible memory (ple.host), and in device memory with ple.host=0."""
    model = models["e2b_pattern"]
    c = model.config
    ev = vulkan_engine(model)
    kv = ev.new_sequence().cache.device_kv
    owners = [i for i in range(c.n_layers) if c.owns_kv(i)]
    assert len(kv.owned()) == len(owners) < c.n_layers
    for i in range(c.n_layers):
        assert kv.layers[i] is kv.layers[c.kv_layer(i)]
    assert ev.backend.weight("per_layer_token_embd.weight").role == "host"
    assert ev.backend.weight("token_embd.weight").role == "device"
    # the sparse layers' transposed down weights (ffn.down_t=1) are placed and uploaded with the others;
    # the default (ffn.down_t=0) reads the row-major weight and makes no copy
    sparse = [i for i, s in enumerate(c.activation_sparsity) if s > 0]
    assert {n for n in ev.backend.device.details["tunables"]} >= {"ffn.down_t", "ffn.sparse_skip"}
    assert not any(n.endswith("^T") for n in ev.backend.weights_plan.roles)
    ev_t = vulkan_engine(model, tune="ffn.down_t=1")
    for i in range(c.n_layers):
        assert (f"blk.{i}.ffn_down.weight^T" in ev_t.backend.weights_plan.roles) == (i in sparse)
    assert (
        vulkan_engine(model, tune="ple.host=0").backend.weight("per_layer_token_embd.weight").role == "device"
    )


def test_unsupported_kind_refused_at_construction(models, monkeypatch):
    """A model with a kind the backend lacks is refused when the backend is built (``auto`` passes over it),
    not at its first step."""
    from workbench.backends.vulkan import backend

    monkeypatch.setattr(backend, "KINDS", tuple(k for k in backend.KINDS if k != "altup_correct"))
    with pytest.raises(UnsupportedOpError, match="altup_correct"):
        vulkan_engine(models["gqa_softcap"])


def test_profile_charges_folded_ops_to_the_op_that_did_them(models):
    """With timestamps, an op folded into another's dispatch (the post-norms, the PLE gate, the injection)
    reports 0 device time; the op whose dispatch did the work reports it."""
    from workbench.instrument.profiler import Profiler

    prof = Profiler()
    ev = vulkan_engine(models["e2b_pattern"])
    ev.observer = prof
    ev.generate(TOKENS[:5], max_tokens=2)
    df = prof.dataframe()
    dec = df[df["phase"] == "decode"]
    assert dec["device_s"].notna().all() and (dec["device_s"] >= 0).all()
    folded = dec[dec["op"].str.endswith((".post_attention_norm", ".laurel_post_norm", ".ple_gate"))]
    assert len(folded) and (folded["device_s"] == 0).all()
    assert (dec[dec["op"].str.endswith(".laurel_residual")]["device_s"] > 0).all()
    ev.backend.dev.check_validation()
