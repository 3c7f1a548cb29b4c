"""``workbench bench``: the JSON contract, the run record, bad input, and the llama.cpp comparison."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from test_cli import WORKBENCH, run


def test_bench_json_and_record():
    p = run(
        "bench",
        "--backend",
        "numpy",
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "3",
        "--repeats",
        "2",
        "--warmups",
        "0",
        "--json",
    )
    out = json.loads(p.stdout)
    assert isinstance(out["prefill_tok_s"], float) and isinstance(out["decode_tok_s"], float)
    assert out["prefill_tok_s"] > 0 and out["decode_tok_s"] > 0
    rec = json.loads(Path(out["record"], "run.json").read_text())
    assert rec["kind"] == "bench" and rec["environment"]["git"] and rec["environment"]["cpu"]
    assert rec["results"]["ours"]["decode_tok_s"]["n"] == 2
    assert os.path.exists(os.path.join(out["record"], "ops.parquet"))
    assert "decode_overhead_share" in out["profile"]["steps"]
    bb = out["ours"]["bandwidth_bound"]  # host backends: decode against the bandwidth of each repeat
    assert bb["bytes_per_token"] > 0 and len(bb["samples"]["stream_read_gbs"]) == 2
    assert len(bb["samples"]["thread_round_trip_us"]) == 2 and bb["thread_round_trip_us"]["median"] > 0
    want = [
        d * bb["bytes_per_token"] / (g * 1e9)
        for d, g in zip(out["ours"]["samples"]["decode_tok_s"], bb["samples"]["stream_read_gbs"], strict=True)
    ]
    assert bb["samples"]["fraction"] == pytest.approx(want)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt-tokens", "0"], "must be >= 1"),
        (["--repeats", "-2"], "must be >= 1"),
        (["--gen-tokens", "x"], "invalid"),
        (["--threads", "0"], "must be >= 1"),
    ],
)
def test_invalid_arguments(args, message):
    p = run("bench", "--backend", "numpy", *args, check=False)
    assert p.returncode == 2 and message in p.stderr


def test_threads_out_of_range():
    p = run(
        "bench", "--backend", "numpy", "--threads", "100000", "-p", "4", "-g", "1", "-r", "1", check=False
    )
    assert p.returncode == 1 and "threads must be" in p.stderr


def test_missing_llama_cpp_says_how_to_install(tmp_path):
    (tmp_path / "llama_cpp.py").write_text("raise ImportError('simulated: not installed')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    p = subprocess.run(
        [WORKBENCH, "bench", "--backend", "numpy", "-p", "4", "-g", "1", "-r", "1", "--vs", "llama.cpp"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert p.returncode == 1
    assert "pip install -e '.[bench]'" in p.stderr and "Traceback" not in p.stderr


def test_vs_llama_cpp_ratios():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (extra 'bench') is not installed")
    p = run(
        "bench",
        "--backend",
        "numpy",
        "-p",
        "16",
        "-g",
        "4",
        "-r",
        "2",
        "--threads",
        "2",
        "--vs",
        "llama.cpp",
        "--no-profile",
        "--json",
    )
    out = json.loads(p.stdout)
    v = out["vs_llama_cpp"]
    assert v["prefill_ratio"] > 0 and v["decode_ratio"] > 0
    assert out["llama_cpp"]["decode_tok_s"]["n"] == 2
