"""The Vulkan backend's integer decode matvec (int8 activations, ``matvec.q8``) and its per-shape tuning:
each weight format and fused variant against numpy on the same int8-rounded activations (so the kernel's
arithmetic is checked exactly, not within quantization noise), the tuning database's rules (other driver,
invalid entries), and ``workbench tune`` end to end on a tiny model. Lavapipe runs all of it (with the
validation layer); it has no cooperative matrices, so GEMM tiles are tuned only on GPUs.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from test_vulkan import REASON, SMALL, TOKENS, compare, vulkan_engine
from tiny import write_tiny_gguf

import workbench as wb
from workbench.models.synth import write_synthetic

pytestmark = pytest.mark.skipif(bool(REASON), reason=f"VULKAN TESTS SKIPPED: {REASON}")

# 512 columns: two Q4_K / Q6_K superblocks a row (one superblock hides unit-indexing errors)
WIDE = dataclasses.replace(SMALL, name="wide", hidden=512, ffn=768, n_heads=4, head_dim=128)


def q8_blocks(x: np.ndarray) -> np.ndarray:
    """x as the integer matvec sees it: per 32 values, d = max|x| / 127 and round(x / d) * d (ties to even)."""
    b = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(b).max(axis=1, keepdims=True)
    scale = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.clip(np.round(b * scale), -127, 127)
    return (q * (amax / np.float32(127))).astype(np.float32).reshape(x.shape)


def one_projection(engine, call: dict, tokens: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(device output, numpy output on int8-rounded inputs) of one projection on random inputs."""
    from workbench.backends.vulkan.autotune import Tuner
    from workbench.ops import reference as ref

    b, m = engine.backend, engine.model
    tuner = Tuner(b, log=lambda s: None)
    call = {"eps": 1e-6, "kind": "matvec", **call, "tokens": tokens}
    w = m.weights[call["wname"]]
    call["cols"] = w.shape[1]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, w.shape[1])).astype(np.float32) * 3
    res = rng.standard_normal((tokens, w.shape[0])).astype(np.float32) if call.get("post") else None
    prog, offsets, _ = tuner.program("test", call, None)
    try:
        b.transfers.upload(prog.arena, x, 4 * offsets["x"])
        if res is not None:
            b.transfers.upload(prog.arena, res, 4 * offsets["res"])
        zeros = np.zeros(tokens, np.int64)
        prog.run(zeros, zeros, np.zeros(1, np.int64))
        got = prog.readback.view(np.float32).reshape(tokens, -1).copy()
        assert any("Q8_ACT" in d.defines for d in prog.dispatches)
    finally:
        prog.destroy()
    xin = ref.rmsnorm(x, m.weights[call["norm"]].dequantize(), call["eps"]) if call.get("norm") else x
    y = ref.matmul(q8_blocks(xin), w.dequantize())
    if call.get("up"):
        y = ref.gelu_mul(y, ref.matmul(q8_blocks(xin), m.weights[call["up"]].dequantize()))
    if call.get("post"):
        y = res + ref.rmsnorm(y, m.weights[call["post"][0]].dequantize(), call["post"][1])
    b.dev.check_validation()
    return got, y


@pytest.fixture(scope="module")
def wide_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("q8")
    return {q: wb.load(str(write_synthetic(WIDE, q, d / f"{q}.gguf", progress=False))) for q in
            ("q8_0", "q5_0", "q6_k", "q4_k_m")}  # fmt: skip


@pytest.mark.parametrize(
    ("quant", "wide"), [("q8_0", 0), ("q5_0", 0), ("q6_k", 0), ("q4_k_m", 0), ("q4_k_m", 2)]
)
@pytest.mark.parametrize("tokens", [1, 3])
def test_integer_matvec_is_exact_on_int8_activations(wide_models, quant, wide, tokens):
    """Every fused variant (plain, input norm, gate/up + GELU, post-norm + residual) of each GGUF format;
    Q4_K also in 64-column units (matvec.q4k_wide=2: every Q4_K projection)."""
    model = wide_models[quant]
    ev = vulkan_engine(model, tune=f"matvec.q8=1,matvec.q4k_wide={wide}")
    calls = [
        {"wname": "blk.0.attn_q.weight"},
        {"wname": "blk.0.attn_k.weight", "norm": "blk.0.attn_norm.weight"},
        {"wname": "blk.0.ffn_gate.weight", "norm": "blk.0.ffn_norm.weight", "up": "blk.0.ffn_up.weight"},
        {"wname": "blk.0.ffn_down.weight", "post": ("blk.0.post_ffw_norm.weight", 1e-6)},
        {"wname": "blk.1.ffn_down.weight"},  # Q6_K in q4_k_m
    ]
    for call in calls:
        got, want = one_projection(ev, call, tokens)
        tol = 1e-4 * float(np.abs(want).max())
        err = float(np.abs(got - want).max())
        assert err <= tol, f"{quant} {call['wname']}: max diff {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("spec", ["int8", "int4-g32", "int4-g64-asym", "int4-g128"])
def test_integer_matvec_requantized_formats(wide_models, spec):
    from workbench.quant.requant import requantize

    model = requantize(wide_models["q8_0"], spec, progress=False)
    ev = vulkan_engine(model, tune="matvec.q8=1")
    for call in ({"wname": "blk.0.attn_q.weight"}, {"wname": "blk.0.ffn_down.weight"}):
        got, want = one_projection(ev, call, 2)
        assert np.abs(got - want).max() <= 1e-4 * float(np.abs(want).max())


def test_integer_matvec_model_logits_and_default(wide_models):
    """A whole model on int8 activations stays near the float reference; the switch shows in the device
    details, and the default follows the device (on where 4x8-bit dot products are accelerated) and the
    model's hidden size (matvec.q8_min_hidden)."""
    ev = compare(wide_models["q4_k_m"], TOKENS[:6], decode=3, rel=8e-2, tune="matvec.q8=1")
    assert ev.backend.device.details["integer_matvec"] is True
    feats = ev.backend.dev.features
    hidden = wide_models["q8_0"].config.hidden
    for least, wanted in ((hidden, feats.int_dot_fast), (hidden + 1, False)):
        ev = vulkan_engine(wide_models["q8_0"], tune=f"matvec.q8_min_hidden={least}")
        assert ev.backend.tuning["matvec.q8"] == int(wanted)


def decode_steps(model, tune: str, tokens=(11, 48, 85)):
    """Logits of one-token decode steps after a 5-token prompt with ``tune``, the one-token step's program
    and the engine."""
    ev = vulkan_engine(model, tune=tune)
    seq = ev.new_sequence()
    ev.forward(seq, TOKENS[:5])
    logits = [ev.forward(seq, [t]) for t in tokens]
    prog = next(p for k, p in ev.backend.programs.items() if k[1][0][2] == 1)
    return logits, prog, ev


def test_post_norm_tail_writes_the_next_int8_input(wide_models):
    """QUANT_OUT: the attn_output / ffn_down tails quantize the next projection's normalized input, so no
    quant_act dispatch precedes gate/up or the next layer's QKV, and the attention merge (attn_combine.comp)
    quantizes the attention output for attn_output; the logits equal those of separate passes."""
    model = wide_models["q4_k_m"]
    runs = {}
    n = model.config.n_layers
    for q in (0, 1):
        runs[q], prog, _ = decode_steps(model, f"matvec.q8=1,matvec.quant_out={q}")
        tails = [d for d in prog.dispatches if "QUANT_OUT" in d.defines and d.kernel == "matvec"]
        merges = [d for d in prog.dispatches if "QUANT_OUT" in d.defines and d.kernel == "attn_combine"]
        quants = [d for d in prog.dispatches if d.kernel == "quant_act"]
        if q:
            assert len(tails) == 2 * n - 1  # the last layer's feeds the LM head's norm
            # every merge (layers whose attention splits: the global ones here) quantizes; the others' outputs,
            # the first QKV input, each GELU output and the LM head's input get a quant_act
            combines = [d for d in prog.dispatches if d.kernel == "attn_combine"]
            assert merges == combines and len(merges) >= 1 and len(quants) == 2 + 2 * n - len(merges)
        else:
            assert not tails and not merges and len(quants) == 1 + 4 * n  # and each layer's QKV and gate/up
    for a, b in zip(runs[0], runs[1]):
        assert np.abs(a - b).max() <= 1e-3 * np.abs(a).max()


def test_q4k_wide_units_follow_the_tunable(wide_models):
    """matvec.q4k_wide: 1 gives the single Q4_K projections 64-column units and leaves the gate/up pairs at 32,
    2 gives them to every Q4_K projection; the logits equal those of 32-column units."""
    model = wide_models["q4_k_m"]
    runs = {}
    for wide in (0, 1, 2):
        runs[wide], prog, _ = decode_steps(model, f"matvec.q8=1,matvec.q4k_wide={wide}")
        q4 = [d for d in prog.dispatches if d.kernel == "matvec" and "FMT_Q4_K" in d.defines]
        wide_ones = [d for d in q4 if "Q4K_WIDE" in d.defines]
        pairs = [d for d in q4 if "GELU_PAIR" in d.defines]
        assert q4 and pairs
        assert wide_ones == ([] if wide == 0 else [d for d in q4 if wide == 2 or d not in pairs])
    for wide in (1, 2):
        for a, b in zip(runs[0], runs[wide]):
            assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()
    with pytest.raises(ValueError, match="q4k_wide"):
        vulkan_engine(model, tune="matvec.q4k_wide=3")


def test_fused_merge_writes_the_attention_outputs_int8_blocks(wide_models):
    """QUANT_OUT of attention.comp: with attention.fused_combine=1 the last split of each KV head merges and
    quantizes its heads' outputs for attn_output, as the separate merge does (the same quant_act dispatches
    remain); the logits equal the separate merge's."""
    model = wide_models["q4_k_m"]
    runs, quants = {}, {}
    for fused in (0, 1):
        runs[fused], prog, _ = decode_steps(model, f"matvec.q8=1,attention.fused_combine={fused}")
        merging = [d for d in prog.dispatches if d.kernel == ("attention" if fused else "attn_combine")]
        merging = [d for d in merging if not fused or "FUSED_COMBINE" in d.defines]
        assert merging and all("QUANT_OUT" in d.defines for d in merging)
        assert fused or not any(d.kernel == "attention" and "QUANT_OUT" in d.defines for d in prog.dispatches)
        quants[fused] = sum(d.kernel == "quant_act" for d in prog.dispatches)
    assert quants[0] == quants[1]
    for a, b in zip(runs[0], runs[1]):
        assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()


@pytest.mark.parametrize("quant", ["q4_k_m", "q8_0"])
def test_gate_up_rows_write_the_down_projections_int8_input(wide_models, quant):
    """QUANT_ROWS: a one-token gate/up matvec whose workgroups hold whole 32-row blocks (32 rows of one row
    group, or 8 rows x 4 row blocks) quantizes its own output for ffn_down, so that one quant_act a layer is
    spared; 16 rows a workgroup keeps the dispatch. The logits equal those of the separate pass."""
    from workbench.backends.vulkan.autotune import Tuner

    model = wide_models[quant]
    n = model.config.n_layers
    ev = vulkan_engine(model, tune="matvec.q8=1,tuned=0")
    key = next(
        k for k in Tuner(ev.backend, log=lambda s: None).shapes(9) if "gelu_pair" in k and k.endswith("/t1")
    )
    runs = {}
    for params in ({"wg": 128, "row_threads": 8, "rows": 1}, {"wg": 256, "row_threads": 8, "rows": 1},
                   {"wg": 64, "row_threads": 8, "rows": 4}):  # fmt: skip
        ev.backend.try_params({key: params})
        seq = ev.new_sequence()
        ev.forward(seq, TOKENS[:5])
        runs[params["wg"]] = [ev.forward(seq, [t]) for t in (11, 48, 85)]
        prog = next(p for k, p in ev.backend.programs.items() if k[1][0][2] == 1)
        fused = [d for d in prog.dispatches if "QUANT_ROWS" in d.defines]
        quants = [
            d
            for d in prog.dispatches
            if d.kernel == "quant_act" and d.op.endswith("ffn_down+matmul_rmsnorm_add")
        ]
        assert (len(fused), len(quants)) == ((0, n) if params["wg"] == 128 else (n, 0))
    for wg in (256, 64):
        for a, b in zip(runs[128], runs[wg]):
            assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()
    ev.close()


# 64- and 32-column units (the loop is the same for every format)
@pytest.mark.parametrize("quant", ["q6_k", "q4_k_m"])
def test_integer_matvec_units_ahead_keep_the_bits(wide_models, quant):
    """matvec.q8_ahead=2 (two units' weights loaded before either is used) sums the same units in the same
    order as one at a time: one- and three-token steps give identical logits."""
    model = wide_models[quant]
    runs = {}
    for ahead in (1, 2):
        ev = vulkan_engine(model, tune=f"matvec.q8=1,matvec.q8_ahead={ahead}")
        seq = ev.new_sequence()
        ev.forward(seq, TOKENS[:5])
        runs[ahead] = [ev.forward(seq, [11]), ev.forward(seq, [48, 85, 3], logits="all")]
        specs = [
            dict(d.spec) for p in ev.backend.programs.values() for d in p.dispatches if "Q8_ACT" in d.defines
        ]
        assert specs and all(sp[5] == ahead for sp in specs)
        ev.backend.dev.check_validation()
    for a, b in zip(runs[1], runs[2]):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("q8", [0, 1])
def test_post_norm_tail_in_registers_equals_the_loop(wide_models, q8):
    """TAIL_REGS (matvec.tail_regs): the one-token post-norm tail with its row in registers (and, on int8
    activations, the next input's blocks packed by 8 threads each) gives the loop tail's logits up to float
    summation order; steps of several tokens keep the loop."""
    model = wide_models["q6_k"]
    runs = {}
    for regs in (0, 1):
        runs[regs], prog, ev = decode_steps(
            model, f"matvec.q8={q8},matvec.tail_regs={regs}", (11, 48, 85, 3, 17)
        )
        tails = [d for d in prog.dispatches if "POST_NORM_ADD" in d.defines]
        assert len(tails) == 2 * model.config.n_layers
        assert all(("TAIL_REGS" in d.defines) == bool(regs) for d in tails)
        assert all(("QUANT_OUT" in d.defines) == bool(q8) for d in tails[:-1])
        ev.backend.dev.check_validation()
    for a, b in zip(runs[0], runs[1]):
        assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()
    en = wb.Engine(model, "numpy")
    sn = en.new_sequence()
    en.forward(sn, TOKENS[:5])
    want = [en.forward(sn, [t]) for t in (11, 48, 85, 3, 17)]
    for a, b in zip(runs[1], want):
        assert np.abs(a - b).max() <= (8e-2 if q8 else 2e-4) * np.abs(b).max()


@pytest.mark.slow
def test_default_model_greedy_tokens_on_int8_activations(default_model, numpy_engine):
    prompt = "The capital of France is"
    want = numpy_engine.generate(prompt, max_tokens=6).output_ids
    got = vulkan_engine(default_model, tune="matvec.q8=1").generate(prompt, max_tokens=6).output_ids
    assert got == want


# -- tuning database and the tuner --------------------------------------------------------------------
@pytest.fixture
def tiny_q4(tmp_path):
    return wb.load(str(write_synthetic(WIDE, "q4_k_m", tmp_path / "q4.gguf", progress=False)))


def test_tune_stores_checked_winners_that_the_backend_uses(tiny_q4, tmp_path, monkeypatch):
    from workbench.cli import main

    db = tmp_path / "db.json"
    monkeypatch.setenv("WORKBENCH_TUNING_DB", str(db))
    assert (
        main(["tune", "--model", tiny_q4.source, "--budget", "20", "--beam", "2", "-p", "9", "--json"]) == 0
    )
    entries = json.loads(db.read_text())["entries"]
    ev = compare(tiny_q4, TOKENS[:9], decode=2)
    used = ev.backend.device.details["tuned_shapes"]
    assert used["entries"] == len(entries) and used["used"] == len(entries)
    for e in entries:
        assert e["us"] < e["default_us"] and e["driver"] == str(ev.backend.dev.features.driver_version)
        # the decode step's shapes are timed in whole steps (the default objective), the others alone
        assert e["objective"] == (
            "step" if e["key"].startswith("matvec/") and e["key"].endswith("/t1") else "op"
        )


def test_tuner_rejects_a_candidate_whose_output_is_wrong(tiny_q4):
    from workbench.backends.vulkan.autotune import Tuner

    ev = vulkan_engine(tiny_q4)
    tuner = Tuner(ev.backend, log=lambda s: None)
    key, call = next(iter(tuner.shapes(9).items()))
    x, res, rows, want, tol = tuner.check_data(key, call)
    assert tuner.measure(key, call, None, (x, res, rows, want, tol)) > 0
    with pytest.raises(ValueError, match="differs from numpy"):
        tuner.measure(key, call, None, (x, res, rows, want + 10 * tol + 1, tol))


def test_a_winner_must_beat_the_default_timed_again(tiny_q4, monkeypatch):
    """The first timing of a shape can read slow (a cold device): the default is timed again after the search,
    and a candidate that beat only that first reading is not a winner."""
    import time

    from workbench.backends.vulkan.autotune import Tuner

    ev = vulkan_engine(tiny_q4)
    tuner = Tuner(ev.backend, log=lambda s: None)
    key, call = next(iter(tuner.shapes(9).items()))
    defaults = iter([1.0, 0.1])
    monkeypatch.setattr(tuner, "check_data", lambda key, call: ())
    monkeypatch.setattr(
        tuner, "cost", lambda key, call, params, check: next(defaults) if params is None else 0.5
    )
    r = tuner.tune_shape(key, call, time.monotonic() + 5)
    assert r.best == r.default and r.default_s == 0.1 and r.best_s == 0.1
    ev.close()


def test_step_objective_times_checked_candidates_in_whole_decode_steps(tiny_q4):
    """The step objective: a one-token matvec shape's candidate is checked against numpy first (a wrong one
    is refused before any step runs), then timed as whole decode steps with it in force (the step's program
    is rebuilt with its parameters), the sequence truncated back to the same context for every candidate."""
    from workbench.backends.vulkan.autotune import Tuner

    ev = vulkan_engine(tiny_q4, tune="tuned=0")
    tuner = Tuner(ev.backend, log=lambda s: None, objective="step", engine=ev, depth=6)
    key, call = next(
        (k, c) for k, c in tuner.shapes(9).items() if k.startswith("matvec/") and k.endswith("/t1")
    )
    assert tuner.in_step(key, call) and not tuner.in_step(key, {**call, "tokens": 2})
    check = tuner.check_data(key, call)
    x, res, rows, want, tol = check
    with pytest.raises(ValueError, match="differs from numpy"):
        tuner.cost(key, call, None, (x, res, rows, want + 10 * tol + 1, tol))
    assert tuner.clock is None  # refused before a step ran
    assert tuner.cost(key, call, None, check) > 0 and ev.backend.trial_params == {}
    params = {"wg": 64, "row_threads": 8, "rows": 2}
    assert tuner.cost(key, call, params, check) > 0
    assert ev.backend.trial_params == {key: params}
    assert tuner.clock.seq.cache.length == 6 and len(tuner.clock.seq.tokens) == 6
    specs = [dict(d.spec) for p in ev.backend.programs.values() for d in p.dispatches if d.kernel == "matvec"]
    assert any(s[0] == 64 and s[1] == 8 and s[4] == 2 for s in specs)
    with pytest.raises(ValueError, match="objective"):
        Tuner(ev.backend, objective="steps")
    with pytest.raises(ValueError, match="engine"):
        Tuner(ev.backend, objective="step")
    ev.close()


def test_database_entries_of_another_driver_or_invalid_are_reported_not_applied(
    tiny_q4, tmp_path, monkeypatch
):
    from workbench.backends.vulkan.autotune import Tuner

    ev = vulkan_engine(tiny_q4)
    f = ev.backend.dev.features
    key = next(k for k in Tuner(ev.backend, log=lambda s: None).shapes(9) if k.startswith("matvec"))
    entries = [
        {"device": f.name, "driver": "other", "key": key, "params": {"wg": 64, "row_threads": 8, "rows": 1}},
        {"device": f.name, "driver": str(f.driver_version), "key": key, "params": {"wg": 96, "row_threads": 3, "rows": 1}},
        {"device": "another GPU", "driver": "1", "key": key, "params": {"wg": 64, "row_threads": 8, "rows": 1}},
    ]  # fmt: skip
    db = tmp_path / "db.json"
    db.write_text(json.dumps({"version": 1, "entries": entries}))
    monkeypatch.setenv("WORKBENCH_TUNING_DB", str(db))
    ev = compare(tiny_q4, TOKENS[:4], decode=1)
    info = ev.backend.device.details["tuned_shapes"]
    assert info["entries"] == 0 and info["ignored_other_driver"] == 1 and info["ignored_invalid"] == 1
    assert "row_threads=3" in info["invalid"][0]
    db.write_text("{not json")
    with pytest.raises(ValueError, match="unreadable"):
        vulkan_engine(tiny_q4)
    assert compare(tiny_q4, TOKENS[:4], decode=1, tune="tuned=0")


def test_tune_rejects_bad_arguments(tmp_path):
    from workbench.cli import main

    model = str(write_tiny_gguf(tmp_path / "t.gguf"))
    assert main(["tune", "--model", model, "--backend", "cpu"]) == 1
    assert main(["tune", "--model", model, "--budget", "0"]) == 1
    assert main(["tune", "--model", model, "--kernels", "attention"]) == 1


def test_tune_takes_only_the_kernels_asked(tiny_q4, tmp_path, monkeypatch, capsys):
    """`--kernels matmul_coop` tunes the prefill GEMM alone; where the device has no cooperative matrices
    (lavapipe) there is nothing to tune, and tune says why instead of storing nothing silently."""
    from workbench.cli import main

    db = tmp_path / "db.json"
    monkeypatch.setenv("WORKBENCH_TUNING_DB", str(db))
    args = ["tune", "--model", tiny_q4.source, "--budget", "10", "--beam", "1", "-p", "9", "--json"]
    assert main([*args, "--kernels", "matmul_coop"]) == 0
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    assert all(s["key"].startswith("matmul_coop/") for s in out["shapes"])
    if not out["shapes"]:
        assert "no matmul_coop shapes: fp32 tiled GEMM" in cap.err
    assert main([*args, "--kernels", "matvec", "--objective", "op"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["shapes"] and all(s["key"].startswith("matvec/") for s in out["shapes"])
    assert out["objective"] == "op" and all(s["objective"] == "op" for s in out["shapes"])
