"""Run records: atomic, concurrent writers, corrupted records skipped, queries in one call."""

from __future__ import annotations

import json
import multiprocessing as mp

import pandas as pd
import pytest

from workbench.experiments.records import iter_records, load_runs, load_table, query, write_record


def _writer(root, i):
    write_record({"kind": "test", "results": {"i": i}}, {"ops": pd.DataFrame({"x": [i, i]})}, root=root)


def test_concurrent_writers(tmp_path):
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(tmp_path, i)) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    runs = load_runs(tmp_path)
    assert sorted(runs["results.i"]) == list(range(8))
    assert not list((tmp_path / "runs").glob(".tmp-*"))
    ops = load_table("ops", tmp_path)
    assert len(ops) == 16 and ops["run_id"].nunique() == 8


def test_corrupted_record_is_skipped_with_warning(tmp_path):
    good = write_record({"kind": "test", "results": {"v": 1}}, root=tmp_path)
    bad = write_record({"kind": "test", "results": {"v": 2}}, root=tmp_path)
    (bad / "run.json").write_text("{ truncated")
    (tmp_path / "runs" / "empty-dir").mkdir()
    with pytest.warns(UserWarning, match="skipping corrupted run record"):
        runs = load_runs(tmp_path)
    assert list(runs["path"]) == [str(good)]


def test_filters_and_sql(tmp_path):
    for b, tok in (("numpy", 10.0), ("cpu", 100.0), ("cpu", 120.0)):
        write_record(
            {"kind": "bench", "backend": b, "results": {"decode_tok_s": tok}},
            {"ops": pd.DataFrame({"kind": ["matmul"], "time_s": [tok]})},
            root=tmp_path,
        )
    assert len(load_runs(tmp_path, backend="cpu")) == 2
    assert len(load_runs(tmp_path, nope="x")) == 0
    df = query(
        'SELECT backend, max("results.decode_tok_s") AS best FROM runs GROUP BY backend ORDER BY backend',
        root=tmp_path,
    )
    assert df.to_dict("records") == [{"backend": "cpu", "best": 120.0}, {"backend": "numpy", "best": 10.0}]
    assert query("SELECT count(*) AS n FROM ops", root=tmp_path)["n"][0] == 3


def test_record_is_self_describing(tmp_path):
    path = write_record({"kind": "bench", "results": {}}, root=tmp_path)
    rec = json.loads((path / "run.json").read_text())
    assert rec["schema"] == "workbench.run/1" and rec["run_id"] == path.name and "created" in rec
    assert [p for p, _ in iter_records(tmp_path)] == [path]


X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC 9005
stepping\t: 1
microcode\t: 0xb002116
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw avx512_vnni

processor\t: 1
vendor_id\t: GenuineIntel
"""
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd asimddp sve i8mm
CPU implementer\t: 0x41
CPU architecture: 8
CPU part\t: 0xd40
"""


def test_cpu_info_names_family_and_isa():
    from workbench.hostinfo import cpu_info, host_cpu_info, parse_cpuinfo

    x86 = cpu_info(parse_cpuinfo(X86_CPUINFO))  # the first processor's block only
    assert x86 == {"vendor": "AuthenticAMD", "family": 26, "model": 2, "stepping": 1, "microcode": "0xb002116",
                   "isa": ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni"]}  # fmt: skip
    arm = cpu_info(parse_cpuinfo(ARM_CPUINFO))
    assert arm == {
        "implementer": "0x41",
        "architecture": 8,
        "part": "0xd40",
        "isa": ["asimd", "asimddp", "sve", "i8mm"],
    }
    host = host_cpu_info()
    assert host["model_name"] and host["machine"] and isinstance(host["isa"], list)


def test_environment_names_commit_packages_cpu_and_driver():
    from types import SimpleNamespace

    from workbench.instrument import environment

    env = environment.capture(threads=1)
    assert set(env["git"]) == {"commit", "dirty"} and len(env["git"]["commit"]) == 40
    assert isinstance(env["git"]["dirty"], bool)
    assert env["packages"]["numpy"] and env["packages"]["numba"] and env["packages"]["llvmlite"]
    assert env["cpu_info"]["model_name"] == env["cpu"] and "isa" in env["cpu_info"]

    def backend(name, details):
        return SimpleNamespace(name=name, device=SimpleNamespace(name="d", kind="k", details=details))

    assert environment.capture(backend("cpu", {"threads": 2}))["driver"] is None
    vk = {"api": "vulkan", "driver_name": "NVIDIA", "driver_info": "580.159.04"}
    assert environment.capture(backend("vulkan", {"driver": vk}))["driver"] == vk
    emulated = environment.capture(backend("npu", {"mode": "emulator", "xrt": {}}))["driver"]
    assert emulated["api"] == "none"
    xrt = environment.capture(
        backend(
            "npu", {"mode": "xrt", "xrt": {"amdxdna_driver": True, "xrt_devices": ["[0000:c5:00.1] NPU"]}}
        )
    )
    assert xrt["driver"]["api"] == "xrt" and xrt["driver"]["xrt_devices"] == ["[0000:c5:00.1] NPU"]


def test_vulkan_driver_version_decoded_as_the_vendor_packs_it():
    import dataclasses

    from workbench.backends.vulkan.device import DeviceFeatures

    zero = {f.name: 0 for f in dataclasses.fields(DeviceFeatures) if f.default is dataclasses.MISSING}
    nvidia = DeviceFeatures(**{**zero, "name": "NVIDIA H100 80GB HBM3", "vendor_id": 0x10DE,
                               "driver_version": 2435301632, "api_version": "1.4.312"},
                            driver_name="NVIDIA", driver_info="580.159.04", device_id=0x2330)  # fmt: skip
    assert nvidia.driver_version_text == "580.159.4.0"
    drv = nvidia.driver()
    assert drv == {"api": "vulkan", "device": "NVIDIA H100 80GB HBM3", "vendor_id": "0x10de", "device_id": "0x2330",
                   "driver_name": "NVIDIA", "driver_info": "580.159.04", "driver_version": "580.159.4.0",
                   "api_version": "1.4.312"}  # fmt: skip
    mesa = dataclasses.replace(nvidia, vendor_id=0x1002, driver_version=(24 << 22) | (1 << 12) | 3)
    assert mesa.driver_version_text == "24.1.3"


def test_snapshot_names_its_own_commit_not_the_checkout_around_it(tmp_path):
    """A `git archive` snapshot unpacked inside another git checkout records the snapshot's commit (the
    COMMIT file export-subst fills), never the enclosing checkout's."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "other.txt").write_text("another project\n")
    subprocess.run([*git, "-C", str(tmp_path), "add", "other.txt"], check=True)
    subprocess.run([*git, "-C", str(tmp_path), "commit", "-qm", "other"], check=True)
    other = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True)
    snap = tmp_path / "snap"
    snap.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "HEAD", "workbench"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(snap)], input=archive.stdout, check=True)
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout
    code = "import json; from workbench.instrument.environment import git_commit; print(json.dumps(git_commit()))"
    out = subprocess.run([sys.executable, "-c", code], cwd=snap, capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(snap)})  # fmt: skip
    got = json.loads(out.stdout)
    assert got["commit"] == head.strip() != other.stdout.strip()
    assert got["dirty"] is False
