"""Profiler rows, traces, device profiles, roofline limits and synthetic models."""

from __future__ import annotations

import json

import numpy as np
import pytest

import workbench as wb
from workbench.instrument.devices import PUBLISHED, get_profile, host_profile
from workbench.instrument.profiler import Profiler, by_device, by_kind, by_layer, overhead_summary, top
from workbench.instrument.roofline import limits, roofline_figure, weight_specs_for
from workbench.instrument.trace import write_trace
from workbench.models.config import preset
from workbench.ops.kinds import distinct_keys, visible_keys


@pytest.fixture(scope="module")
def profiled(default_model):
    prof = Profiler()
    e = wb.Engine(default_model, "numpy", observer=prof)
    e.generate("The capital of France is", max_tokens=4)
    return prof


def test_one_row_per_op_execution(profiled, default_model):
    df = profiled.dataframe()
    n_ops = len(default_model.graph(1).ops)
    assert len(df) == len(profiled.steps) * n_ops
    row = df[(df["phase"] == "decode") & (df["op"] == "blk.0.attn_q")].iloc[0]
    assert row["kind"] == "matmul" and row["layer"] == 0 and row["weights"] == "Q5_0"
    assert row["flops"] == 2 * 1024 * 640
    assert row["bytes_read"] == default_model.weights["blk.0.attn_q.weight"].nbytes + 640 * 4
    assert row["gbps"] > 0 and 0 < row["peak_frac"] < 1
    for col in (
        "run_id",
        "step",
        "backend",
        "device",
        "shapes",
        "host_s",
        "device_s",
        "bytes_written",
        "gflops",
    ):
        assert col in df.columns


def test_op_times_add_up_to_step_wall_time(profiled):
    steps = profiled.step_frame()
    assert ((steps["ops_host_s"] / steps["wall_s"]) > 0.9).all(), steps[["wall_s", "ops_host_s"]]
    s = overhead_summary(steps)
    assert 0 <= s["decode_overhead_share"] < 0.1


def test_views(profiled):
    df = profiled.dataframe()
    kinds = by_kind(df)
    assert kinds.index[0] == "matmul" and abs(kinds["share"].sum() - 1) < 1e-9
    assert list(by_layer(df).index)[:2] == [-1, 0]
    assert len(by_device(df)) == 1
    assert len(top(df, 5)) == 5


def test_trace_json(profiled, tmp_path):
    path = write_trace(profiled, tmp_path / "t.json")
    doc = json.loads(path.read_text())
    ev = doc["traceEvents"]
    slices = [e for e in ev if e["ph"] == "X"]
    assert any(e["cat"] == "step" for e in slices) and any(e["cat"] == "matmul" for e in slices)
    names = [e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"]
    assert names == ["numpy:" + profiled.steps[0].device.split(":", 1)[1]]
    op = next(e for e in slices if e["cat"] == "matmul")
    assert {"bytes", "flops", "gbps", "shapes"} <= set(op["args"])


def test_device_profiles_have_sources():
    for key in ("780m", "npu1", "hawkpoint", "890m", "npu2", "h100", "h200"):
        p = get_profile(key)
        assert p.mem_bw > 0 and p.peak("fp32") > 0 and p.how == "published"
        assert p.sources.get("peak_flops") and p.sources.get("mem_bw")
    assert get_profile("phoenix") is PUBLISHED["npu1"]
    with pytest.raises(ValueError, match="unknown device"):
        get_profile("tpu")


def test_a_device_without_figures_profiles_without_fractions(default_model):
    """A GPU the table lacks (the Vulkan backend names it ``unknown``): profiler rows with times, bytes and
    FLOPs and NaN fractions of peak, no error at the end of a finished bench; asked for by name (``limits``,
    the batching bounds), such a device is still refused."""
    import dataclasses

    from workbench.backends.vulkan.backend import profile_key
    from workbench.instrument.devices import profile_or_unknown

    assert profile_key("NVIDIA H200") == "h200" and profile_key("NVIDIA H100 80GB HBM3") == "h100"
    assert profile_key("NVIDIA B200") == "unknown"
    with pytest.raises(ValueError, match="unknown device"):
        get_profile("unknown")
    unknown = profile_or_unknown("unknown")
    assert np.isnan(unknown.mem_bw) and unknown.how.startswith("unknown")
    prof = Profiler()
    e = wb.Engine(default_model, "numpy", observer=prof)
    e.generate("Hi", max_tokens=1)
    prof.steps = [dataclasses.replace(s, profile_key="unknown") for s in prof.steps]
    df = prof.dataframe()
    assert len(df) > 0 and df["time_s"].gt(0).all() and df["bw_frac"].isna().all()


def test_host_profile_is_measured_and_cached(tmp_path, monkeypatch):
    from workbench.instrument import devices

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(devices, "_load_per_core", lambda cores: 0.1)
    p = host_profile()
    assert p.how.startswith("measured") and p.mem_bw > 1e9 and p.peak("fp32") > 1e9
    assert "busy" not in p.how
    assert host_profile().mem_bw == p.mem_bw  # cached


def test_host_profile_taken_on_a_busy_machine_is_taken_again_when_quieter(tmp_path, monkeypatch):
    from workbench.instrument import devices

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    load = {"now": 1.5}
    monkeypatch.setattr(devices, "_load_per_core", lambda cores: load["now"])
    busy = host_profile()
    assert "busy" in busy.how
    load["now"] = 1.4
    assert host_profile().how == busy.how  # not clearly quieter: the cached one stays
    load["now"] = 0.2
    again = host_profile()
    assert "busy" not in again.how and again.how != busy.how


def test_key_counts():
    assert visible_keys(np.arange(10), 0) == 55 and visible_keys(np.arange(10), 4) == 1 + 2 + 3 + 4 * 7
    assert distinct_keys(np.array([100]), 8) == 8 and distinct_keys(np.arange(0, 5), 0) == 5
    assert distinct_keys(np.array([5, 6, 0, 1]), 0) == 7 + 2  # two sequences in one step


def test_limits_for_the_default_model(default_model):
    lim = limits(default_model.config, default_model.weight_specs(), "780m", context=512)
    assert lim.decode_bound_by == "memory bandwidth"
    # every weight byte is read once per token, except the embedding rows (the LM head reads it in full)
    assert (
        default_model.weights.nbytes * 0.99 < lim.decode_bytes_per_token < default_model.weights.nbytes * 1.2
    )
    assert lim.decode_tok_s == pytest.approx(89.6e9 / lim.decode_bytes_per_token)
    assert lim.how.startswith("projected")


def test_limits_27b_config_only():
    cfg = preset("gemma3-27b")
    specs = weight_specs_for(cfg, "q4_k_m")
    gib = sum(w.nbytes for w in specs.values()) / 2**30
    assert 14.5 < gib < 17  # a Q4_K_M 27B GGUF is ~15.4 GiB
    lim = limits(cfg, specs, "780m")
    assert 4 < lim.decode_tok_s < 6  # "cannot exceed ~5 tokens/s at batch 1"


def test_roofline_figure_with_points():
    fig = roofline_figure(get_profile("780m"), [{"label": "decode", "intensity": 2.0, "gflops": 50.0}])
    assert len(fig.data) == 2


def test_synthetic_270m_matches_real_quant_plan(default_model, tmp_path):
    from workbench.models.synth import quant_plan, write_synthetic

    plan = quant_plan(default_model.config, "q4_k_m")
    assert {n: t.name for n, t in plan.items()} == {n: t.type.name for n, t in default_model.weights.items()}
    path = write_synthetic(preset("gemma3-270m"), "q8_0", tmp_path / "s.gguf", progress=False)
    m = wb.load(str(path))
    assert m.kind == "synthetic"  # a synthetic file loaded by path still says so
    assert {t.type.name for t in m.weights.values()} == {"Q8_0", "F32"}
    r = wb.Engine(m, "numpy").generate([2, 100, 200], max_tokens=3, stop_ids=[])
    assert len(r.output_ids) == 3


def test_synthetic_spec_in_load(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    m = wb.load("synthetic:gemma3-270m:q4_0")
    assert m.synthetic and m.kind == "synthetic" and m.config.n_layers == 18
    with pytest.raises(ValueError, match="unknown quantization"):
        wb.load("synthetic:gemma3-270m:q3_xx")
    with pytest.raises(ValueError, match="unknown model config"):
        wb.load("synthetic:gemma9")


def test_synthetic_loads_in_llama_cpp(tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (extra 'bench') is not installed")
    from workbench.models.synth import write_synthetic

    path = write_synthetic(preset("gemma3-270m"), "q4_k_m", tmp_path / "s.gguf", progress=False)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, verbose=False)
    llm.eval([2, 100, 200])
    assert llm.n_tokens == 3
