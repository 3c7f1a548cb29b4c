"""Accuracy metrics, the evaluation text, and ``workbench eval`` on the tiny model."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from quant_models import tiny_model

from workbench.eval.metrics import TokenMetrics, greedy_agreement, log_softmax
from workbench.eval.run import EvalConfig, evaluate
from workbench.eval.text import DATA, TEXTS, eval_tokens, load_text, prompts_from_text

RNG = np.random.default_rng(2)
FAST = {"tokens": 40, "window": 24, "chunk": 8, "prompts": 2, "continuation": 4, "speed_tokens": 0}


def test_identical_distributions_agree_fully():
    logits = RNG.standard_normal((6, 50)).astype(np.float32)
    tm = TokenMetrics()
    tm.add(logits, logits.copy(), RNG.integers(0, 50, 6))
    s = tm.summary()
    assert s["kl_mean"] == pytest.approx(0, abs=1e-12) and s["top1_agreement"] == 1.0
    assert s["perplexity"] == s["perplexity_ref"] and s["perplexity_rel"] == 0


def test_known_values():
    uniform = np.zeros((4, 8), np.float32)
    peaked = np.zeros((4, 8), np.float32)
    peaked[:, 3] = 5.0
    tm = TokenMetrics()
    tm.add(uniform, peaked, np.array([3, 3, 3, 3]))
    s = tm.summary()
    assert s["perplexity_ref"] == pytest.approx(8.0)
    lp = log_softmax(peaked[0])
    assert s["perplexity"] == pytest.approx(math.exp(-lp[3]))
    assert s["kl_mean"] == pytest.approx(float((np.log(1 / 8) - lp).mean()))
    with pytest.raises(ValueError, match="disagree"):
        tm.add(uniform, peaked[:, :4], np.array([0, 0, 0, 0]))


def test_greedy_agreement():
    r = greedy_agreement([[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 2, 9, 4], [5, 6, 7, 8]])
    assert r == {
        "greedy_prefix": pytest.approx((0.5 + 1.0) / 2),
        "greedy_same": pytest.approx((0.75 + 1.0) / 2),
    }


def test_shipped_text_is_long_public_domain_english_with_provenance():
    text, label = load_text()
    assert label == "kjv" and len(text.split()) > 4000 and text.startswith("Now it came to pass")
    notes = (DATA / "kjv_ruth_joseph.md").read_text()
    assert "bible-kjv-text" in notes and "1611" in notes
    assert set(TEXTS) >= {"kjv", "declaration"}
    assert len(prompts_from_text(text, 3)) == 3


def test_bad_text_and_lengths(tmp_path):
    with pytest.raises(ValueError, match="no such bundled text"):
        load_text(str(tmp_path / "missing.txt"))
    tok = tiny_model(tmp_path).tokenizer
    with pytest.raises(ValueError, match="fewer than"):
        eval_tokens(tok, "short text", 500)
    with pytest.raises(ValueError, match="at least 2"):
        eval_tokens(tok, "short text", 1)
    with pytest.raises(ValueError, match="tokens must be >= 1"):
        EvalConfig(tokens=0)


def test_unmodified_variant_scores_as_the_reference(tmp_path):
    res = evaluate(EvalConfig(backend="numpy", **FAST), model=tiny_model(tmp_path), progress=False)
    a = res["accuracy"]
    assert a["tokens_scored"] == 40 and a["kl_mean"] == pytest.approx(0, abs=1e-9)
    assert a["perplexity"] == pytest.approx(a["perplexity_ref"]) and a["top1_agreement"] == 1.0
    assert a["greedy_prefix"] == 1.0 and res["speed"] == {}


def test_quantized_sparse_variant_on_cpu_with_speed(tmp_path):
    cfg = EvalConfig(
        quant="int4-g32",
        sparsity="ffn-topk=0.5",
        **{**FAST, "speed_tokens": 4, "repeats": 1},
        ffn_layer_repeats=2,
    )
    res = evaluate(cfg, model=tiny_model(tmp_path, "Q8_0"), progress=False)
    a, s = res["accuracy"], res["speed"]
    assert a["kl_mean"] > 0 and a["perplexity"] != a["perplexity_ref"]
    assert "itself quantized" in res["variant"]["source_note"]
    assert s["decode_tok_s"] > 0 and s["ffn_ms_per_token"] > 0 and s["ffn_ms_per_token_ref"] > 0
    assert res["weight_bytes"] < res["weight_bytes_ref"] and res["how"].startswith("measured on cpu")
    assert s["ffn_layer"] == 1 and s["ffn_layer_us"] > 0 and s["ffn_layer_speedup"] > 0


def test_nm_variant_is_timed_against_its_dense_twin(tmp_path):
    from workbench.sparsity.apply import build_variant
    from workbench.sparsity.nm import dense_twin, nm_weight_count

    cfg = EvalConfig(quant="fp16", sparsity="nm=2:4@ffn", **{**FAST, "speed_tokens": 4, "repeats": 1})
    model = tiny_model(tmp_path, "Q8_0")
    s = evaluate(cfg, model=model, progress=False)["speed"]
    assert s["nm_ops"] > 0 and s["nm_ops_ms_per_token"] > 0 and s["nm_dense_twin_ops_ms_per_token"] > 0
    assert s["nm_decode_tok_s"] > 0 and s["nm_decode_ratio"] > 0
    variant = build_variant(model, "fp16", "nm=2:4@ffn", progress=False)
    twin = dense_twin(variant)
    assert nm_weight_count(variant) == 3 * model.config.n_layers and nm_weight_count(twin) == 0
    name = "blk.0.ffn_down.weight"
    assert twin.weights[name].type.name == "fp16"
    np.testing.assert_array_equal(twin.weights[name].dequantize(), variant.weights[name].dequantize())


def test_cli_eval_json(tmp_path):
    path = tiny_model(tmp_path).source
    args = ["--tokens", "30", "--window", "16", "--chunk", "8", "--prompts", "1", "--continuation", "3",
            "--speed-tokens", "0", "--no-progress"]  # fmt: skip
    cmd = [
        str(Path(sys.executable).parent / "workbench"),
        "eval",
        "--model",
        path,
        "--quant",
        "int8",
        "--backend",
        "numpy",
    ]
    out = subprocess.run(cmd + args + ["--json"], capture_output=True, text=True, timeout=300, check=True)
    res = json.loads(out.stdout)
    assert res["quant"] == "int8" and 0 < res["accuracy"]["top1_agreement"] <= 1
    rec = json.loads((Path(res["record"]) / "run.json").read_text())  # a run record, with its environment
    assert rec["kind"] == "eval" and rec["environment"]["git"]["commit"] and rec["results"]["accuracy"]


@pytest.mark.parametrize("flag, message", [("--quant=int4-g48", "invalid group size 48"),
                                           ("--sparsity=ffn-topk=1.5", "outside [0, 1)")])  # fmt: skip
def test_cli_eval_bad_input(tmp_path, capsys, flag, message):
    from workbench.cli import main

    assert main(["eval", "--model", tiny_model(tmp_path).source, flag, "--tokens", "8", "--no-progress"]) == 1
    assert message in capsys.readouterr().err
