"""The Vulkan backend's float16 KV cache (``kv.fp16=1``): every kernel that writes the cache (kv_store, the
RoPE kernel's KV_OUT) or reads it (attention) in its KV_F16 variant, against two oracles: the numpy reference
with its host cache held in float16 (the same rounding of K and V: tight tolerance), and the float32 cache
(the rounding's effect on the logits: a stated, looser tolerance). Sliding rings wrap, batched steps serve
several sequences, and a device without 16-bit storage buffers is a clear error.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_vulkan import REASON, SMALL, TOKENS, assert_close, vulkan_engine
from tiny import write_tiny_gguf

import workbench as wb
from workbench.backends.numpy_ref import NumpyBackend
from workbench.models.synth import write_synthetic
from workbench.runtime.kv_cache import KVCache

pytestmark = pytest.mark.skipif(bool(REASON), reason=f"VULKAN TESTS SKIPPED: {REASON}")

FP16 = "kv.fp16=1"
# vulkan's fp16 cache against numpy's fp16 cache, relative to the largest |logit|: both round the same K and
# V, but keys computed in a different float32 order may round to neighbouring halves (measured on lavapipe:
# 5e-5 at most)
SAME_ROUNDING = 2.5e-4
# the fp16 cache against the fp32 cache: K and V rounded to 11 significant bits (relative error <= 2^-11 per
# element) move the logits by ~1e-3 of the largest |logit| (measured on lavapipe: 6e-4 to 9e-4)
FP16_ROUNDING = 5e-3
KV_KERNELS = ("kv_store", "attention")


class Fp16CacheNumpy(NumpyBackend):
    """The numpy reference with its host KV cache in float16: keys and values rounded as the fp16 cache
    rounds them, every product in float32."""

    def new_cache(self, max_len: int, slack: int = 0) -> KVCache:
        return KVCache(self.model.config, max_len, slack, dtype=np.float16)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("kv16")
    return {
        "tiny": wb.load(str(write_tiny_gguf(d / "tiny.gguf"))),
        "small": wb.load(str(write_synthetic(SMALL, "f32", d / "small.gguf", progress=False))),
    }


def kv_dispatches(engine: wb.Engine) -> list:
    """Every dispatch of the engine's recorded programs that writes or reads a KV cache."""
    return [d for p in engine.backend.programs.values() for d in p.dispatches if d.kv]


def assert_rel(got: np.ndarray, want: np.ndarray, rel: float) -> float:
    """``got`` within ``rel`` of the largest |want| of ``want``; returns the relative difference."""
    diff = float(np.abs(got - want).max() / np.abs(want).max())
    assert diff <= rel, f"max diff {diff:.3g} of the largest |logit| > {rel:.3g}"
    return diff


@pytest.mark.parametrize(
    "name, tune",
    [
        ("tiny", FP16),
        ("small", FP16),
        # the separate KV store, the fused split merge and several splits per query
        ("tiny", f"{FP16},attention.kv_in_rope=0,attention.fused_combine=1,attention.split_keys=4"),
    ],
)
def test_fp16_cache_matches_rounded_oracle_and_fp32_cache(models, monkeypatch, name, tune):
    """A 13-token prefill (GEMM path, one split) then 20 decode steps (split attention), the sliding rings
    wrapping: logits equal numpy's with an fp16 host cache, and stay within fp16 rounding of the fp32 cache."""
    from workbench.backends.vulkan import kv_cache

    monkeypatch.setattr(kv_cache, "MAX_RING_STEP", len(TOKENS) - 1)  # rings of window + 12 slots
    model = models[name]
    oracle = wb.Engine(model, Fp16CacheNumpy(model))
    v32, v16 = vulkan_engine(model), vulkan_engine(model, tune=tune)
    s_or, s32, s16 = oracle.new_sequence(), v32.new_sequence(), v16.new_sequence()
    steps = 21
    for step in range(steps):
        toks = TOKENS if step == 0 else [(37 * step + 11) % model.config.vocab_size]
        want = oracle.forward(s_or, toks, logits="all")
        got32, got16 = v32.forward(s32, toks, logits="all"), v16.forward(s16, toks, logits="all")
        assert_rel(got16, want, SAME_ROUNDING)
        assert_rel(got16, got32, FP16_ROUNDING)
    assert not np.array_equal(got16, got32)  # the cache really is float16
    wraps = [la for la in s16.cache.device_kv.layers if la.wraps]
    assert wraps and len(TOKENS) + steps - 1 > max(la.slots for la in wraps)
    layers32, layers16 = s32.cache.device_kv.layers, s16.cache.device_kv.layers
    assert [2 * la.buffer.size for la in layers16] == [la.buffer.size for la in layers32]
    readers = kv_dispatches(v16)
    assert {d.kernel for d in readers} >= {"attention"} and all("KV_F16" in d.defines for d in readers)
    assert not any("KV_F16" in d.defines for d in kv_dispatches(v32))
    assert v16.backend.device.details["kv_cache"] == "float16"
    assert v32.backend.device.details["kv_cache"] == "float32"
    v16.backend.dev.check_validation()


def test_fp16_cache_writes_from_rope_and_store(models):
    """Both writers have an fp16 variant in use: the RoPE kernel's KV_OUT (default) and kv_store."""
    fused = vulkan_engine(models["tiny"], tune=FP16)
    fused.generate(TOKENS[:3], max_tokens=2)
    ropes = [d for d in kv_dispatches(fused) if d.kernel == "rmsnorm"]
    assert ropes and all({"KV_OUT", "KV_F16"} <= set(d.defines) for d in ropes)
    store = vulkan_engine(models["tiny"], tune=f"{FP16},attention.kv_in_rope=0")
    store.generate(TOKENS[:3], max_tokens=2)
    stores = [d for d in kv_dispatches(store) if d.kernel == "kv_store"]
    assert stores and all("KV_F16" in d.defines for d in stores)


def test_fp16_cache_batched_steps(models):
    """Ragged steps (prefill chunks mixed with decode) and batched decode past the sliding window, each
    sequence with its own fp16 cache (one attention dispatch serves them all), against the fp16-cache oracle
    sequence by sequence; device argmax tokens equal the oracle's."""
    from workbench.runtime.batch import SeqChunk, forward_batch, greedy_batch

    model = models["tiny"]
    en, ev = wb.Engine(model, Fp16CacheNumpy(model)), vulkan_engine(model, tune=FP16)
    history = [TOKENS[:5], TOKENS[:1], TOKENS[:12], TOKENS[3:12], TOKENS[:3]]
    new = [[40], [41, 42, 43, 44], [45], [46, 47, 48, 49, 50, 51], [52]]
    seqs, refs = [ev.new_sequence(64) for _ in history], [en.new_sequence(64) for _ in history]
    for s, r, h in zip(seqs, refs, history, strict=True):
        assert_rel(ev.forward(s, h), en.forward(r, h), SAME_ROUNDING)
    got = forward_batch(ev, [SeqChunk(s, n, "all") for s, n in zip(seqs, new, strict=True)])
    for g, r, n in zip(got, refs, new, strict=True):
        assert_rel(g, en.forward(r, n, logits="all"), SAME_ROUNDING)
    for step in range(12):  # past the tiny model's window of 8
        toks = [60 + step + i for i in range(len(seqs))]
        got = forward_batch(ev, [SeqChunk(s, [t]) for s, t in zip(seqs, toks, strict=True)])
        for g, r, t in zip(got, refs, toks, strict=True):
            assert_rel(g.reshape(-1), en.forward(r, [t]).reshape(-1), SAME_ROUNDING)
    toks = greedy_batch(ev, [SeqChunk(s, [70 + i]) for i, s in enumerate(seqs)])
    assert toks == [int(np.argmax(en.forward(r, [70 + i]))) for i, r in enumerate(refs)]
    attn = [d for d in kv_dispatches(ev) if d.kernel == "attention" and len(d.kv) == len(seqs)]
    assert attn and all("KV_F16" in d.defines for d in attn)
    ev.backend.dev.check_validation()


def test_fp16_cache_greedy_tokens_equal_numpy(models):
    """Greedy decoding with the fp16 cache gives the float32 reference's tokens on the tiny model."""
    prompt = TOKENS[:6]
    want = wb.Engine(models["tiny"], "numpy").generate(prompt, max_tokens=16).output_ids
    ev = vulkan_engine(models["tiny"], tune=FP16)
    assert ev.generate(prompt, max_tokens=16).output_ids == want
    ev.backend.dev.check_validation()


def test_fp32_cache_is_the_default(models):
    """Without the tunable the cache stays float32 (4 bytes an element) and equals the reference."""
    model = models["tiny"]
    en, ev = wb.Engine(model, "numpy"), vulkan_engine(model)
    assert ev.backend.tuning["kv.fp16"] == 0 and ev.backend.device.details["kv_cache"] == "float32"
    sn, sv = en.new_sequence(32), ev.new_sequence(32)
    kv_dim = model.config.kv_dim
    assert sv.cache.nbytes == sum(2 * la.slots * kv_dim * 4 for la in sv.cache.device_kv.layers)
    assert_close(ev.forward(sv, TOKENS[:4]), en.forward(sn, TOKENS[:4]))


@pytest.mark.parametrize(
    "tune, words", [(FP16, "kv.fp16=1 needs storageBuffer16BitAccess"), ("kv.fp16=2", "must be 0 or 1")]
)
def test_fp16_cache_without_16bit_storage_is_a_clear_error(models, monkeypatch, tune, words):
    """On a device without 16-bit storage buffers the tunable is refused before anything runs; the default
    (fp32) cache still works there."""
    from workbench.backends.vulkan import device

    real = device.select_device
    monkeypatch.setattr(
        device, "select_device", lambda *a: dataclasses.replace(real(*a), storage_16bit=False)
    )
    with pytest.raises(ValueError, match=words):
        vulkan_engine(models["tiny"], tune=tune)
    ev = vulkan_engine(models["tiny"])
    assert not ev.backend.dev.features.storage_16bit
    assert ev.generate(TOKENS[:3], max_tokens=2).output_ids
