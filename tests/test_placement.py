"""Placement strategies, transfers at device boundaries, the hybrid timeline, and the projected sweep."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from tiny import TINY, write_tiny_gguf

import workbench as wb
from workbench.backends import BackendUnavailableError
from workbench.cli import main
from workbench.instrument.roofline import weight_specs_for
from workbench.models.config import preset
from workbench.models.gemma3 import build_graph
from workbench.runtime.placement import (
    STRATEGIES,
    assign,
    get_platform,
    project,
    run_placed,
    step_tasks,
    sweep,
    transfer_seconds,
)
from workbench.runtime.timeline import Task, schedule

CFG = preset("gemma3-270m")
SPECS = weight_specs_for(CFG, "q4_k_m")


def _graph(t=1):
    return build_graph(CFG, SPECS, t, 1)


def test_strategies_assign_only_covered_kinds_to_the_npu():
    g = _graph()
    for name in STRATEGIES:
        a = assign(g, name, "decode", first_n=6)
        for op in g.ops:
            if a[op.name] == "npu":
                assert op.kind in ("matmul", "rmsnorm", "attention")
    a = assign(g, "npu-attention")
    assert a["blk.3.attn"] == "npu" and a["blk.3.ffn_down"] == "vulkan" and a["blk.3.rope_q"] == "vulkan"
    a = assign(g, "npu-ffn")
    assert a["blk.3.ffn_gate"] == "npu" and a["blk.3.attn_q"] == "vulkan" and a["blk.3.ffn_act"] == "vulkan"
    a = assign(g, "npu-first-N-layers", first_n=4)
    assert a["blk.3.attn_q"] == "npu" and a["blk.4.attn_q"] == "vulkan" and a["lm_head"] == "vulkan"
    assert set(assign(g, "npu-prefill-igpu-decode", "decode").values()) == {"vulkan"}
    assert "npu" in assign(_graph(8), "npu-prefill-igpu-decode", "prefill").values()
    with pytest.raises(ValueError, match="unknown placement strategy"):
        assign(g, "npu-everything")
    with pytest.raises(ValueError, match="first_n"):
        assign(g, "npu-first-N-layers", first_n=99)


def test_transfers_are_explicit_at_boundaries():
    g = _graph()
    plat = get_platform("phoenix")
    a = assign(g, "npu-attention")
    tasks = step_tasks(g, a, lambda op, dev: (1e-6, "test"), plat)
    xfers = [t for t in tasks if t.kind == "transfer"]
    crossings = sum(
        1
        for op in g.ops
        for t in op.inputs
        if t in g.tensors and any(t in p.outputs and a[p.name] != a[op.name] for p in g.ops)
    )
    assert len(xfers) >= crossings > 0
    assert all(t.device == "link" and t.nbytes > 0 for t in xfers)
    assert not [t for t in step_tasks(g, assign(g, "all-igpu"), lambda o, d: (1e-6, ""), plat) if
                t.kind == "transfer" and t.name.split(":")[1] in g.tensors]  # fmt: skip


def test_prefill_on_npu_hands_the_kv_cache_to_the_decode_device():
    cfg = preset("gemma3-27b")
    specs = weight_specs_for(cfg, "q4_k_m")
    moves = {}
    for plat in ("phoenix", "h100+npu1"):
        r = project(cfg, specs, "npu-prefill-igpu-decode", "prefill", platform=plat, prompt_tokens=2048)
        moves[plat] = [t for t in r.tasks if t.name.startswith("xfer:kv_cache.")]
    kv = moves["phoenix"]
    assert len(kv) == cfg.n_layers and all(t.name.endswith(":npu->vulkan") for t in kv)
    per_token = 2 * cfg.kv_dim * 2
    sizes = sorted({t.nbytes for t in kv})  # sliding-window layers move their window, global layers all 2048
    assert sizes == [cfg.sliding_window * per_token, 2048 * per_token]
    assert "zero-copy" in kv[0].how and "PCIe" in moves["h100+npu1"][0].how
    for strategy in ("npu-attention", "all-igpu"):
        r = project(cfg, specs, strategy, "prefill")
        assert not [t for t in r.tasks if t.name.startswith("xfer:kv_cache.")]


def test_transfer_cost_zero_copy_vs_pcie():
    unified, how_u = transfer_seconds(1 << 20, "vulkan", "npu", get_platform("phoenix"))
    copy, how_c = transfer_seconds(1 << 20, "vulkan", "npu", get_platform("h100+npu1"))
    assert "zero-copy" in how_u and "PCIe" in how_c and copy > unified


def test_timeline_overlaps_devices_across_sequences():
    tasks = [Task("a", "npu", 1.0, "t"), Task("b", "vulkan", 1.0, "t", (0,))]
    one = schedule(tasks, 1)
    two = schedule(tasks, 2)
    assert one.makespan_s == 2.0
    assert two.makespan_s == 3.0  # seq 1 runs on the NPU while seq 0 is on the iGPU
    assert two.busy == {"npu": 2.0, "vulkan": 2.0}
    assert two.energy_j({"npu": 1.5, "vulkan": 15.0}) == pytest.approx(33.0)
    assert two.energy_j({"npu": None, "vulkan": 15.0}) is None


def test_project_labels_how_each_time_was_obtained():
    r = project(CFG, SPECS, "npu-attention", "decode").summary()
    assert any(h.startswith("npu: emulated") for h in r["how"])
    assert any(h.startswith("vulkan: projected") for h in r["how"])
    assert any(h.startswith("link: modeled") for h in r["how"])
    assert r["tokens_per_s"] > 0 and r["j_per_token"] > 0
    assert r["energy_how"].startswith("projected") and "npu 1.5 W" in r["energy_how"]
    seg = project(CFG, SPECS, "npu-attention", "decode", npu_launch="segment")
    assert seg.tokens_per_s > r["tokens_per_s"]


def test_sweep_270m_and_27b_under_a_minute():
    t0 = time.perf_counter()
    rows = sweep(("gemma3-270m", "gemma3-27b"))
    assert time.perf_counter() - t0 < 60
    assert {(r["model"], r["strategy"]) for r in rows} == {
        (m, s) for m in ("gemma3-270m", "gemma3-27b") for s in STRATEGIES if s != "all-cpu"
    }
    for r in rows:
        assert r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0 and r["decode_j_per_token"] > 0
    big = {r["strategy"]: r for r in rows if r["model"] == "gemma3-27b"}
    # the iGPU's bandwidth bounds a 27B Q4_K_M's decode (docs/architecture.md#projections)
    assert big["all-igpu"]["decode_tok_s"] < 5.5


def test_placement_cli_json(capsys):
    assert main(["placement", "--json", "-m", "gemma3-270m", "-s", "all-igpu", "-s", "npu-ffn"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["strategy"] for r in out["rows"]] == ["all-igpu", "npu-ffn"] and "emulated" in out["how"]


def test_run_placed_tokens_equal_reference(tmp_path):
    model = wb.load(str(write_tiny_gguf(tmp_path / "t.gguf")))
    ids = list(range(10, 22))
    ref = wb.Engine(model, "numpy").generate(ids, 3)
    for strategy in ("npu-attention", "npu-prefill-igpu-decode"):
        res = run_placed(model, strategy, ids, decode_tokens=2, npu_dtype="bf16")
        assert res["output_ids"] == ref.output_ids
        assert [s["phase"] for s in res["steps"]] == ["prefill", "decode", "decode"]
        assert all(s["tokens_per_s"] > 0 for s in res["steps"])
    first = res["steps"][0]
    assert first["ops_by_device"].get("npu", 0) > 0 and first["measured_host_copies"]["count"] > 0
    assert first["transfer_bytes"] > 0 and res["steps"][1]["ops_by_device"] == {
        "vulkan": len(model.graph(1).ops)
    }
    assert np.isfinite(first["step_s"]) and TINY.n_layers == 3


def test_single_device_placements_run_on_real_backends_and_say_measured(tmp_path):
    model = wb.load(str(write_tiny_gguf(tmp_path / "t.gguf")))
    ids = list(range(10, 22))
    ref = wb.Engine(model, "numpy").generate(ids, 3)
    cpu = run_placed(model, "all-cpu", ids, decode_tokens=2)
    assert cpu["output_ids"] == ref.output_ids and "this host" in cpu["platform"]
    for s in cpu["steps"]:
        assert s["how"] and all(h.startswith("cpu: measured (cpu backend") for h in s["how"])
        assert s["ops_by_device"].keys() == {"cpu"} and s["transfers"] == 0
    with pytest.raises(ValueError, match="only the all-igpu placement"):
        run_placed(model, "npu-ffn", ids, 1, igpu="vulkan")
    with pytest.raises(ValueError, match="igpu must be"):
        run_placed(model, "all-igpu", ids, 1, igpu="metal")
    try:
        gpu = run_placed(model, "all-igpu", ids, decode_tokens=2, igpu="vulkan")
    except BackendUnavailableError as e:
        pytest.skip(f"no Vulkan device here: {e}")
    assert gpu["output_ids"][:2] == ref.output_ids[:2]  # fp16/fp32 GPU kernels: the first tokens agree
    assert all(h.startswith("vulkan: measured (vulkan backend on") for s in gpu["steps"] for h in s["how"])


def test_custom_rules_reproduce_the_named_strategies():
    g = _graph()
    for phase in ("prefill", "decode"):
        same = [
            ("custom:attn=npu", "npu-attention", None),
            ("custom:ffn=npu", "npu-ffn", None),
            ("custom:layers:0-5=npu", "npu-first-N-layers", 6),
            ("custom:prefill/all=npu", "npu-prefill-igpu-decode", None),
            ("custom:all=cpu", "all-cpu", None),
        ]
        for custom, named, n in same:
            assert assign(g, custom, phase) == assign(g, named, phase, first_n=n), (custom, phase)


def test_custom_rules_override_left_to_right_and_check_their_input():
    g = _graph()
    a = assign(g, "custom:all=cpu,attn=npu,op:blk.2.attn=vulkan")
    assert a["blk.3.attn"] == "npu" and a["blk.2.attn"] == "vulkan" and a["blk.3.ffn_down"] == "cpu"
    assert a["blk.3.rope_q"] == "cpu"  # the NPU has no rope schedule: the op keeps the earlier rule's device
    assert assign(g, "custom:decode/kind:matmul=npu", "prefill") == assign(g, "all-igpu", "prefill")
    for bad, msg in [
        ("custom:", "no rules"),
        ("custom:attn", "SELECTOR=DEVICE"),
        ("custom:attn=gpu", "device must be"),
        ("custom:blocks=npu", "selector must be"),
        ("custom:layers:x=npu", "layers takes"),
        ("custom:layers:5-2=npu", "empty"),
        ("custom:layers:0-99=npu", "has 18 layers"),
        ("custom:kind:add=npu", "NPU schedules cover"),
        ("custom:kind:conv=cpu", "no such kind"),
        ("custom:op:blk.0.ffn_act=npu", "no NPU schedule"),
        ("custom:op:nope=cpu", "no op of that name"),
        ("custom:warmup/all=npu", "phase prefix"),
    ]:
        with pytest.raises(ValueError, match=msg):
            assign(g, bad)


def test_custom_placement_with_cpu_ops_runs_and_measures_them(tmp_path):
    model = wb.load(str(write_tiny_gguf(tmp_path / "t.gguf")))
    ids = list(range(10, 22))
    ref = wb.Engine(model, "numpy").generate(ids, 2)
    res = run_placed(model, "custom:all=cpu,attn=npu", ids, decode_tokens=1)
    assert res["output_ids"] == ref.output_ids
    how = res["steps"][1]["how"]
    assert "cpu: measured (numpy reference, this host)" in how and any(
        h.startswith("npu: emulated") for h in how
    )
    assert main(["placement", "--json", "-m", "gemma3-270m", "-s", "custom:ffn=npu"]) == 0


def test_placed_backend_runs_under_the_engine_and_reports_each_ops_placed_seconds(tmp_path):
    from workbench.runtime.placement import PlacedBackend

    class Seconds:
        def __init__(self):
            self.ops, self.steps = [], 0

        def on_op(self, op, step, start_s, host_s, device_s=None):
            self.ops.append((op.name, device_s))

        def on_step(self, step, graph, backend, start_s, wall_s):
            self.steps += 1

    model = wb.load(str(write_tiny_gguf(tmp_path / "t.gguf")))
    ids = list(range(10, 22))
    ref = wb.Engine(model, "numpy").generate(ids, 2, stop_ids=())
    backend = PlacedBackend(model, "npu-attention", get_platform("phoenix"))
    seen = Seconds()
    res = wb.Engine(model, backend, observer=seen).generate(ids, 2, stop_ids=())
    assert res.output_ids == ref.output_ids and seen.steps == len(backend.steps) == 2
    decode = backend.steps[1].result
    ops = {t.name: t.seconds for t in decode.tasks if t.kind == "op"}
    assert seen.ops[-len(ops) :] == list(ops.items()) and all(s > 0 for s in ops.values())
    assert decode.phase == "decode" and decode.summary()["ops_by_device"].keys() == {"npu", "vulkan"}
