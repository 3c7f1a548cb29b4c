"""The command line, run as a user runs it (a subprocess of the installed entry point)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

WORKBENCH = shutil.which("workbench", path=os.path.dirname(sys.executable)) or "workbench"


def run(*args, check=True, input_text=None):
    proc = subprocess.run([WORKBENCH, *args], capture_output=True, text=True, timeout=600, input=input_text)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {proc.stderr}")
    return proc


def test_generate_json_contract(hf_reference):
    p = run(
        "generate",
        "--model",
        "gemma3-270m",
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "5",
        "--temperature",
        "0",
        "--backend",
        "numpy",
        "--json",
        "--top-logits",
        "5",
    )
    out = json.loads(p.stdout)
    for key in (
        "input_ids",
        "output_ids",
        "text",
        "backend",
        "device",
        "prefill_tok_s",
        "decode_tok_s",
        "top_logits",
    ):
        assert key in out, key
    ref = hf_reference["prompts"]["plain"]
    assert out["input_ids"] == ref["ids"]
    assert out["output_ids"] == ref["greedy"][:5]
    assert out["backend"] == "numpy"
    assert out["top_logits"]["ids"] == ref["positions"][str(len(ref["ids"]) - 1)]["top_ids"][:5]
    assert (
        abs(out["top_logits"]["logits"][0] - ref["positions"][str(len(ref["ids"]) - 1)]["top_logits"][0])
        < 1e-3
    )


def test_generate_prompt_file_and_streaming(tmp_path):
    f = tmp_path / "prompt.txt"
    f.write_text("<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n")
    p = run("generate", "--prompt-file", str(f), "-n", "3", "--backend", "numpy")
    assert p.stdout.strip().startswith("What is the")
    assert "tok/s" in p.stderr and "measured" in p.stderr


def test_generate_errors_are_clear(tmp_path):
    p = run("generate", "--backend", "numpy", check=False)
    assert p.returncode == 1 and "prompt is needed" in p.stderr
    p = run("generate", "--prompt", "hi " * 40, "--max-context", "16", "--backend", "numpy", check=False)
    assert p.returncode == 1 and "context limit" in p.stderr
    p = run("generate", "--prompt", "hi", "--backend", "tpu", check=False)
    assert p.returncode == 1 and "unknown or unavailable backend 'tpu'" in p.stderr
    p = run("generate", "--prompt", "hi", "--model", str(tmp_path / "nope.gguf"), check=False)
    assert p.returncode == 1 and "not found" in p.stderr
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\0\0\0" + b"\xff" * 16)
    p = run("generate", "--prompt", "hi", "--model", str(bad), check=False)
    assert p.returncode == 1 and "count" in p.stderr and "Traceback" not in p.stderr


def test_info_json():
    out = json.loads(run("info", "gemma3-270m", "--json").stdout)
    assert out["model"]["layers"] == 18 and out["config"]["sliding_window"] == 512
    assert set(out["types"]) == {"F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"}
    assert out["tokenizer"]["vocab"] == 262144
    text = run("info").stdout
    assert "tensors by type" in text and "Q4_K" in text


def test_devices_json():
    out = json.loads(run("devices", "--json").stdout)
    names = {b["backend"]: b for b in out["backends"]}
    assert {"numpy", "cpu", "vulkan", "npu"} <= set(names)
    assert names["numpy"]["available"] is True


@pytest.mark.parametrize("argv", [["generate", "--max-tokens", "-3", "--prompt", "x"], ["nonsense"]])
def test_argument_errors(argv):
    p = run(*argv, check=False)
    assert p.returncode == 2 and "usage" in p.stderr
