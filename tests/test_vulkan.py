"""The ``vulkan`` backend on whatever Vulkan device exists (Mesa lavapipe in CI): every kernel through small
models in every weight format against the numpy reference, odd shapes, step sizes on both sides of the
matvec/GEMM switch, the sliding-window ring, tensors split by ``maxStorageBufferRange``, tunables, errors.
Every backend here runs with the Khronos validation layer; any validation error fails the test.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import numpy as np
import pytest
from tiny import TINY, write_tiny_gguf, write_tiny_hf

import workbench as wb
from workbench.backends.base import BackendUnavailableError
from workbench.models.synth import write_synthetic
from workbench.ops.graph import Op


def _vulkan_status() -> str:
    try:
        from workbench.backends.vulkan.device import VALIDATION_LAYER, list_devices, load_vulkan

        vk = load_vulkan()
        if not list_devices():
            return "no Vulkan device"
        if VALIDATION_LAYER not in {lay.layerName for lay in vk.vkEnumerateInstanceLayerProperties()}:
            return f"{VALIDATION_LAYER} missing (apt-get install vulkan-validationlayers)"
    except BackendUnavailableError as e:
        return str(e)
    return ""


REASON = _vulkan_status()
if REASON:
    warnings.warn(
        f"VULKAN TESTS SKIPPED: {REASON}; run `make setup` as root to install lavapipe", stacklevel=1
    )
pytestmark = pytest.mark.skipif(bool(REASON), reason=f"VULKAN TESTS SKIPPED: {REASON}")

SMALL = dataclasses.replace(
    TINY, name="small", n_layers=2, hidden=256, ffn=512, n_heads=2, n_kv_heads=1, head_dim=128,
    vocab_size=512, context_length=128, sliding_window=6, sliding_window_pattern=2, query_pre_attn_scalar=128,
    layer_types=(),
)  # fmt: skip
TOKENS = [2, 17, 201, 44, 5, 99, 123, 7, 8, 250, 31, 64, 211]


def vulkan_engine(model, **options) -> wb.Engine:
    return wb.Engine(model, "vulkan", validation=True, **options)


def assert_close(got: np.ndarray, want: np.ndarray, rel: float = 2e-4) -> None:
    tol = rel * float(np.abs(want).max()) + 1e-5
    assert np.abs(got - want).max() <= tol, f"max diff {np.abs(got - want).max():.3g} > {tol:.3g}"


def compare(model, tokens, decode: int = 3, rel: float = 2e-4, **options) -> wb.Engine:
    """Prefill ``tokens`` (all logits) then ``decode`` single tokens on numpy and vulkan; logits must agree."""
    en, ev = wb.Engine(model, "numpy"), vulkan_engine(model, **options)
    sn, sv = en.new_sequence(), ev.new_sequence()
    b = ev.backend
    # prefill on cooperative matrices takes fp16 inputs (GPUs that have them; lavapipe has none)
    coop = b.gemm_kernel == "matmul_coop" and len(tokens) > b.tuning["matvec.max_tokens"]
    assert_close(
        ev.forward(sv, tokens, logits="all"),
        en.forward(sn, tokens, logits="all"),
        max(rel, 2e-3 if coop else 0),
    )
    for t in range(decode):
        tok = (37 * t + 11) % model.config.vocab_size
        assert_close(ev.forward(sv, [tok]), en.forward(sn, [tok]), rel)
    ev.backend.dev.check_validation()
    return ev


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return wb.load(str(write_tiny_gguf(tmp_path_factory.mktemp("vk") / "tiny.gguf")))


@pytest.mark.parametrize("quant", ["f32", "f16", "q8_0", "q5_0", "q6_k", "q4_k_m"])
def test_each_weight_format_matches_numpy(quant, tmp_path):
    """matvec (decode, 1-8 tokens), GEMM (prefill of 13 tokens), embeddings in each GGUF format."""
    model = wb.load(str(write_synthetic(SMALL, quant, tmp_path / f"{quant}.gguf", progress=False)))
    compare(model, TOKENS)


@pytest.mark.parametrize("n", [1, 4])
def test_fused_norms_take_mean_squares_from_the_post_norm_tail(tiny, n):
    """A decode step's QKV and gate/up norms read the mean squares that the previous op's post-norm tail
    wrote (MS_IN) except where their input has no tail (the embedding), with the oracle's logits."""
    ev = compare(tiny, TOKENS[:n], decode=2)
    prog = next(
        p for p in ev.backend.programs.values() if any("POST_NORM_ADD" in d.defines for d in p.dispatches)
    )
    norms = [d for d in prog.dispatches if "NORM" in d.defines]
    with_ms = [d for d in norms if "MS_IN" in d.defines]
    assert with_ms and len(with_ms) < len(norms)
    assert all(d.push["ms_off"] != d.push["x_off"] for d in with_ms)
    assert all("MS_IN" not in d.defines for d in norms if d.op.startswith("blk.0.attn"))
    off = compare(tiny, TOKENS[:n], decode=1, tune="matvec.norm_ms=0")  # the switch: every norm sums x
    assert not any("MS_IN" in d.defines for p in off.backend.programs.values() for d in p.dispatches)


@pytest.mark.parametrize(
    "spec",
    ["int8", "int4-g32", "int4-g64-asym", "int4-g128,ffn_down=int8,attn_q=bf16,attn_k=fp16,attn_v=fp32"],
)
def test_requantized_planar_formats_match_numpy(spec, tmp_path):
    """int8 per-channel and int4 group-wise (sym/asym, each group size) matvec/GEMM shaders, mixed precision."""
    from workbench.quant.requant import requantize

    base = wb.load(str(write_synthetic(SMALL, "q8_0", tmp_path / "q8.gguf", progress=False)))
    model = requantize(base, spec, progress=False)
    ev = compare(model, TOKENS)
    fmts = {w.fmt for w in ev.backend._weights.values()}
    assert fmts >= {spec.split(",")[0]}


def test_dynamic_activation_formats_are_a_clear_error(tmp_path):
    from workbench.backends.base import UnsupportedOpError
    from workbench.quant.requant import requantize

    base = wb.load(str(write_synthetic(SMALL, "q8_0", tmp_path / "q8.gguf", progress=False)))
    with pytest.raises(UnsupportedOpError, match=r"\+a8"):
        vulkan_engine(requantize(base, "int8+a8", progress=False))


def test_bf16_hf_weights_match_numpy(tmp_path):
    model = wb.load(str(write_tiny_hf(tmp_path / "hf", dtype="bfloat16")))
    assert any(t.type.name == "BF16" for t in model.weights.values())
    compare(model, TOKENS[:9])


@pytest.mark.parametrize("n", [1, 2, 5, 8, 9, 12])
def test_step_sizes_and_odd_shapes(tiny, n):
    """The tiny model's odd sizes (vocab 300, ffn 96, rows not multiples of any workgroup)."""
    compare(tiny, TOKENS[:n], decode=2)


def test_batched_steps_equal_sequences_alone(tiny):
    """Ragged steps (prefill chunks mixed with decode; GEMM path) and batched decode (matvec path), each
    sequence with its own cache, against the numpy reference run sequence by sequence."""
    from workbench.runtime.batch import SeqChunk, forward_batch, greedy_batch

    en, ev = wb.Engine(tiny, "numpy"), vulkan_engine(tiny)
    history = [TOKENS[:5], TOKENS[:1], TOKENS[:12], TOKENS[3:12], TOKENS[:3]]
    new = [[40], [41, 42, 43, 44], [45], [46, 47, 48, 49, 50, 51], [52]]
    seqs, refs = [ev.new_sequence(64) for _ in history], [en.new_sequence(64) for _ in history]
    for s, r, h in zip(seqs, refs, history, strict=True):
        ev.forward(s, h)
        en.forward(r, h)
    got = forward_batch(ev, [SeqChunk(s, n, "all") for s, n in zip(seqs, new, strict=True)])
    for g, r, n in zip(got, refs, new, strict=True):
        assert_close(g, en.forward(r, n, logits="all"))
    for step in range(12):  # batched decode, past the sliding window of the tiny model
        toks = [60 + step + i for i in range(len(seqs))]
        got = forward_batch(ev, [SeqChunk(s, [t]) for s, t in zip(seqs, toks, strict=True)])
        for g, r, t in zip(got, refs, toks, strict=True):
            assert_close(g.reshape(-1), en.forward(r, [t]).reshape(-1))
    toks = greedy_batch(ev, [SeqChunk(s, [70 + i]) for i, s in enumerate(seqs)])  # argmax on the device
    assert toks == [int(np.argmax(en.forward(r, [70 + i]))) for i, r in enumerate(refs)]
    ev.backend.dev.check_validation()


def test_batched_decode_groups_caches_per_dispatch(tiny):
    """One attention dispatch serves up to KV_SEQS sequences whose caches have the same shape: more sequences
    than that, and caches of different shapes in between, split into several groups; all equal numpy."""
    from workbench.backends.vulkan.kernels import KV_SEQS
    from workbench.backends.vulkan.program import group_sequences
    from workbench.runtime.batch import SeqChunk, forward_batch

    en, ev = wb.Engine(tiny, "numpy"), vulkan_engine(tiny)
    lens = [64] * (KV_SEQS + 1) + [48, 64]
    seqs, refs = [ev.new_sequence(n) for n in lens], [en.new_sequence(n) for n in lens]
    for i, (s, r) in enumerate(zip(seqs, refs, strict=True)):
        ev.forward(s, TOKENS[: 2 + i % 5])
        en.forward(r, TOKENS[: 2 + i % 5])
    groups = group_sequences([(s.cache.device_kv, i, 1) for i, s in enumerate(seqs)])
    assert [len(g.seqs) for g in groups] == [KV_SEQS, 1, 1, 1]
    for step in range(3):
        toks = [80 + step + i for i in range(len(seqs))]
        got = forward_batch(ev, [SeqChunk(s, [t]) for s, t in zip(seqs, toks, strict=True)])
        for g, r, t in zip(got, refs, toks, strict=True):
            assert_close(g.reshape(-1), en.forward(r, [t]).reshape(-1))
    ev.backend.dev.check_validation()


def test_sliding_ring_wraps(tiny, monkeypatch):
    """A ring just larger than the window: decoding far past it reuses slots correctly."""
    from workbench.backends.vulkan import kv_cache

    monkeypatch.setattr(kv_cache, "MAX_RING_STEP", 4)
    en, ev = wb.Engine(tiny, "numpy"), vulkan_engine(tiny)
    sn, sv = en.new_sequence(), ev.new_sequence()
    assert_close(ev.forward(sv, TOKENS[:4]), en.forward(sn, TOKENS[:4]))
    ring = [la.slots for la in sv.cache.device_kv.layers if la.wraps]
    assert ring and max(ring) < 30
    for t in range(30):
        assert_close(ev.forward(sv, [t + 20]), en.forward(sn, [t + 20]))
    ev.backend.dev.check_validation()


def test_tensors_split_by_storage_buffer_range(tiny, monkeypatch):
    from workbench.backends.vulkan import backend as vb
    from workbench.backends.vulkan import weights as vw

    monkeypatch.setattr(vb, "upload_weight", lambda t, tr, limit, role: vw.upload_weight(t, tr, 4096, role))
    ev = compare(tiny, TOKENS[:10])
    assert max(len(w.parts) for w in ev.backend._weights.values()) > 1


@pytest.mark.parametrize(
    "tune",
    [
        "matvec.row_threads=4,matvec.wg=64",
        "matvec.row_threads=32,matvec.wg=256,matvec.norm_rows=1",
        "matmul.wg=64,matmul.wg_m=8,matmul.tm=2,matmul.tn=8",
        "attention.split_keys=2,attention.tile=8,attention.wg=64",
        "fused=0,timestamps=0",
        "attention.fused_combine=0,attention.kv_in_rope=0,matmul.coop=0,matvec.post_norm=0",
        "attention.fused_combine=1,attention.split_keys=16",
        "matvec.row_block_tall=3,matvec.row_threads_tall=4,matvec.norm_rows=64",
        "matvec.row_block_tall=1",
    ],
)
def test_tunables_keep_results(tiny, tune):
    compare(tiny, TOKENS[:10], tune=tune)


@pytest.mark.parametrize(
    "tune, rt, rb",
    [
        ("matvec.row_block_batch=3,matvec.row_threads_batch=4", 4, 3),  # fewer lanes than tokens: butterflies
        ("matvec.row_block_batch=8,matvec.wg=64", 8, 8),  # threads per row from K (64 columns: 8)
        ("matvec.row_threads_batch=32", 32, 2),  # rows wider than a subgroup: sums meet in shared memory
        ("matvec.batch_chunks=4", 2, 2),
        ("matvec.wg=8", 8, 2),
        ("matvec.row_block_batch=1", 8, 1),
        (
            "matvec.wg_tall=32,matvec.norm_rows=64",
            8,
            2,
        ),  # the LM head in smaller workgroups  # one workgroup smaller than the rows (the post-norm tail loops)
    ],
)
@pytest.mark.parametrize("n", [2, 5, 8])
def test_batched_matvec_layouts_keep_results(tiny, tune, rt, rb, n):
    """Steps of 2..8 tokens (the matvec path): threads per row, rows per thread group (rows past the end
    included) and the token sums (halving across lanes, or per token) all equal the reference."""
    ev = compare(tiny, TOKENS[:n], decode=1, tune=tune)
    specs = [dict(d.spec) for p in ev.backend.programs.values() for d in p.dispatches if "NORM" in d.defines]
    assert any(sp[1] == rt and sp[2] == n and sp[4] == rb for sp in specs)


def test_fp16_matvec_variant(tmp_path):
    """fp16 products in the decode matvec (shaderFloat16): logits within fp16 rounding of the reference."""
    from workbench.backends.vulkan.device import list_devices

    if not list_devices()[0].fp16:
        pytest.skip("the device has no shaderFloat16")
    model = wb.load(str(write_synthetic(SMALL, "q4_k_m", tmp_path / "q4.gguf", progress=False)))
    ev = compare(model, TOKENS[:6], decode=4, rel=2e-2, tune="matvec.fp16=1")
    assert any("F16_MATH" in d.defines for p in ev.backend.programs.values() for d in p.dispatches)


@pytest.mark.parametrize(
    "tune, words",
    [
        ("matvec.wg=100", "not a multiple of the subgroup size"),
        ("matvec.wg_tall=64,matvec.row_threads_tall=128", "must divide matvec.wg_tall"),
        ("matvec.row_threads=3", "power of two"),
        ("matmul.tm=9", "exceeds 8"),
        ("matvec.wg=100000", "invocations"),
        ("matmul.wg=abc", "not an integer"),
        ("attention.fused_combine=2", "must be 0 or 1"),
        ("nonsense.wg=4", "unknown"),
    ],
)
def test_invalid_tunables_are_rejected_before_dispatch(tiny, tune, words):
    with pytest.raises(ValueError, match=words):
        vulkan_engine(tiny, tune=tune)


def test_greedy_on_device_equals_numpy(tiny):
    prompt = TOKENS[:6]
    want = wb.Engine(tiny, "numpy").generate(prompt, max_tokens=12).output_ids
    ev = vulkan_engine(tiny)
    assert ev.generate(prompt, max_tokens=12).output_ids == want
    ev.backend.dev.check_validation()


def test_default_model_greedy_tokens_equal_numpy(default_model, numpy_engine):
    prompt = "The capital of France is"
    want = numpy_engine.generate(prompt, max_tokens=3).output_ids
    assert vulkan_engine(default_model).generate(prompt, max_tokens=3).output_ids == want


def test_profile_has_device_time_per_op(tiny):
    from workbench.instrument.profiler import Profiler

    prof = Profiler()
    ev = vulkan_engine(tiny)
    ev.observer = prof
    ev.generate(TOKENS[:5], max_tokens=3)
    df = prof.dataframe()
    assert set(df["phase"]) >= {"prefill", "decode"}
    assert len(df) and df["device_s"].notna().all() and (df["device_s"] >= 0).all()
    details = ev.backend.device.details
    assert details["prefill_gemm"].startswith(("matmul_coop", "matmul"))


def test_auto_never_picks_a_cpu_driver(tiny):
    from workbench.backends.vulkan.device import list_devices

    if any(not d.is_cpu for d in list_devices()):
        pytest.skip("a real GPU is present; auto may pick it")
    assert wb.Engine(tiny, "auto").backend.name != "vulkan"


def test_device_selection_errors(tiny):
    with pytest.raises(ValueError, match="no Vulkan device matches"):
        wb.Engine(tiny, "vulkan", device_id="no-such-gpu")
    with pytest.raises(ValueError, match="out of range"):
        wb.Engine(tiny, "vulkan", device_id=99)


def test_out_of_device_memory_is_clear(tiny, monkeypatch):
    from workbench.backends.vulkan.device import DeviceOutOfMemoryError
    from workbench.backends.vulkan.memory import Buffer

    ev = vulkan_engine(tiny)
    dev = ev.backend.dev
    with pytest.raises(ValueError, match="maxStorageBufferRange"):
        Buffer(dev, 1 << 50, name="huge")

    def oom(*_a, **_k):  # what the driver answers when the heap is exhausted
        raise dev.vk.VkErrorOutOfDeviceMemory()

    monkeypatch.setattr(dev.vk, "vkAllocateMemory", oom)
    with pytest.raises(DeviceOutOfMemoryError, match="out of device memory allocating kv"):
        Buffer(dev, 1 << 20, name="kv")
    with pytest.raises(DeviceOutOfMemoryError, match="no room in device-local or host-visible memory for kv"):
        ev.new_sequence(max_len=100)  # the KV cache tries both


def test_device_lost_is_clear_and_engine_recreatable(tiny, monkeypatch):
    from workbench.backends.vulkan.device import DeviceLostError

    ev = vulkan_engine(tiny)
    vk = ev.backend.dev.vk

    def lost(*_a, **_k):
        raise vk.VkErrorDeviceLost()

    monkeypatch.setattr(vk, "vkQueueSubmit", lost)
    with pytest.raises(DeviceLostError):
        ev.generate(TOKENS[:3], max_tokens=2)
    monkeypatch.undo()
    assert vulkan_engine(tiny).generate(TOKENS[:3], max_tokens=2).output_ids


def test_unsupported_op_names_the_op():
    from workbench.backends.base import UnsupportedOpError
    from workbench.backends.vulkan.program import Builder

    with pytest.raises(UnsupportedOpError, match="mystery"):
        Builder.emit(Builder.__new__(Builder), Op("x.mystery", "mystery", (), ()))


def test_shader_compile_error_names_shader_and_line(tmp_path, monkeypatch):
    from workbench.backends.vulkan import shaders

    (tmp_path / "broken.comp").write_text(
        "#version 450\nlayout(local_size_x = 1) in;\nvoid main() { nope; }\n"
    )
    monkeypatch.setattr(shaders, "SHADER_DIR", tmp_path)
    monkeypatch.setenv("WORKBENCH_SPIRV_CACHE", str(tmp_path / "cache"))
    with pytest.raises(shaders.ShaderCompileError, match=r"broken.*broken\.comp line 3"):
        shaders.compile_shader("broken")


def test_spirv_cache_is_reused(tmp_path, monkeypatch):
    from workbench.backends.vulkan import shaders

    monkeypatch.setenv("WORKBENCH_SPIRV_CACHE", str(tmp_path))
    a = shaders.compile_shader("eltwise", ["OP_ADD"])
    files = list(Path(tmp_path).glob("*.spv"))
    assert len(files) == 1 and files[0].read_bytes() == a
    assert shaders.compile_shader("eltwise", ["OP_ADD"]) == a


@pytest.mark.parametrize("tune", ["", "attention.fused_combine=1"])
def test_attention_splits_past_the_context(tiny, tune):
    """The attention grid is recorded once per step shape (attention.splits wide, or fewer where the cache
    holds fewer split_keys runs): decoding at positions below one split's keys, every split of a global
    layer but the first holds no keys (returns at once without partials; with the fused merge it still
    counts itself in). Logits equal numpy's."""
    ev = compare(tiny, TOKENS[:3], decode=4, tune=tune)
    splits = [
        d.push["n_split"]
        for p in ev.backend.programs.values()
        for d in p.dispatches
        if d.kernel == "attention" and not d.push["window"]
    ]
    split_keys, most = ev.backend.tuning["attention.split_keys"], ev.backend.tuning["attention.splits"]
    assert max(splits) == min(most, tiny.config.context_length // split_keys) > 1 and split_keys > 3 + 4


@pytest.mark.parametrize("tune", ["attention.wg=8,attention.tile=8", "attention.wg=48,attention.tile=48"])
def test_attention_value_columns_past_the_workgroup_and_idle_threads(tune, tmp_path):
    """attention.comp's value phase at head_dim 128 (32 vec4 columns): an 8-wide workgroup holds 4 columns a
    thread (CPT = 4, one key group); a 48-wide one has one key group of 32 threads and 16 threads without
    values (vlive). Logits equal numpy's, prefill and decode (splits merged)."""
    model = wb.load(str(write_synthetic(SMALL, "q8_0", tmp_path / "q8.gguf", progress=False)))
    compare(model, TOKENS, decode=3, tune=tune + ",attention.split_keys=4")


@pytest.mark.parametrize("tune", ["", ",attention.fused_combine=1"])
def test_attention_split_length_grows_with_the_context(tiny, tune):
    """Past splits x split_keys keys a split's length grows with the query's position (split_len in
    attn_merge.glsl: 4 splits, 2 keys at least, 10-12 keys each here), in the combine dispatch and the fused
    merge alike; the grid stays 4 wide. Logits equal numpy's."""
    prompt = [(5 * i + 1) % tiny.config.vocab_size for i in range(40)]
    ev = compare(
        tiny,
        prompt,
        decode=3,
        tune="attention.splits=4,attention.split_keys=2,attention.tile=8,attention.wg=64" + tune,
    )
    splits = {
        d.push["n_split"]
        for p in ev.backend.programs.values()
        for d in p.dispatches
        if d.kernel == "attention"
    }
    assert 4 in splits and max(splits) == 4


@pytest.mark.parametrize("tune", ["", ",attention.fused_combine=1"])
def test_attention_merge_of_many_splits(tiny, tune):
    """One key a split: a decode step past 150 tokens merges over 150 splits (attn_merge.glsl), in the
    combine dispatch and in the fused merge alike."""
    prompt = [(7 * i + 3) % tiny.config.vocab_size for i in range(150)]
    tune = "attention.split_keys=1,attention.splits=256,attention.tile=8,attention.wg=64" + tune
    compare(tiny, prompt, decode=3, tune=tune)


def test_run_record_names_the_driver(tiny):
    from workbench.instrument import environment

    e = vulkan_engine(tiny)
    try:
        drv = environment.capture(e.backend)["driver"]
        assert drv["api"] == "vulkan" and drv["device"] == e.backend.device.name
        assert drv["driver_name"] and drv["driver_info"] and drv["driver_version"] and drv["api_version"]
    finally:
        e.close()
