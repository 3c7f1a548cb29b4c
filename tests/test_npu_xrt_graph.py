"""Whole graphs through ``--backend npu --tune mode=xrt`` on a stand-in for pyxrt (tests/fake_pyxrt.py: no
NPU here). The designs are "built" by mlir/build.py itself with its compile step replaced by one that
writes placeholder artifacts, following the command the backend prints for the missing designs. The
stand-in runs each design by reading its buffers as the design lays them out and running the emulator's
kernel, so a greedy decode through XRT must give the emulator's tokens: that checks the schedule ->
design selection, the artifact paths, the host packing and unpacking, and the per-design kernel cache."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
from fake_pyxrt import FakeXrt
from npu_helpers import build_module
from tiny import write_tiny_gguf

import workbench as wb
from workbench.backends.base import BackendUnavailableError, Step
from workbench.backends.npu import designs, xrt
from workbench.backends.npu.designs import MissingDesignsError
from workbench.instrument.profiler import Profiler

PROMPT = list(range(10, 20))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return wb.load(str(write_tiny_gguf(tmp_path_factory.mktemp("xrt") / "tiny.gguf")))


@pytest.fixture
def fake(monkeypatch) -> FakeXrt:
    """pyxrt replaced by the stand-in, and an NPU "detected" (an accel node, pyxrt importable)."""
    f = FakeXrt()
    monkeypatch.setitem(sys.modules, "pyxrt", f.module())
    npu = xrt.NpuDetection(accel_nodes=["/dev/accel/accel0"], driver_loaded=True, pyxrt=True)
    monkeypatch.setattr(xrt, "detect", lambda *a, **k: npu)
    return f


def run_build_command(command: str, fake: FakeXrt, monkeypatch) -> list[str]:
    """Run ``mlir/build.py`` with the arguments of ``command``, its toolchain present and its compile step
    writing placeholder artifacts (an xclbin header, a few instruction words) that ``fake`` runs."""
    argv = shlex.split(command)
    assert argv[0] == "python" and Path(argv[1]) == designs.DEFAULT_ROOT.parent / "build.py"
    build = build_module()
    built = []

    def compile_design(folder, schedule, tools, config):
        (folder / designs.XCLBIN).write_bytes(designs.XCLBIN_MAGIC + b"\0" * 8)
        (folder / designs.INSTS).write_bytes(np.arange(1, 5, dtype="<u4").tobytes())
        fake.register(folder / designs.XCLBIN, schedule, config.rms_eps, config.attn_scale)
        built.append(folder.name)
        return "compiled (test placeholder)"

    tools = dict.fromkeys(build.toolchain(), "present")
    monkeypatch.setattr(build, "toolchain", lambda: tools)
    monkeypatch.setattr(build, "compile_design", compile_design)
    assert build.main(argv[2:]) == 0
    return built


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_greedy_decode_through_xrt_equals_the_emulator(tiny_model, fake, monkeypatch, tmp_path, dtype):
    root = tmp_path / "designs"
    tune = f"mode=xrt,dtype={dtype},designs={root}"
    with pytest.raises(MissingDesignsError) as missing:
        wb.Engine(tiny_model, "npu", tune=tune).generate(PROMPT, 6)
    err = missing.value
    assert (
        "mlir/build.py" in str(err) and err.command in str(err) and all(n in str(err) for n in err.problems)
    )
    assert all(why.startswith("missing final.xclbin") for why in err.problems.values())
    built = run_build_command(err.command, fake, monkeypatch)
    assert set(err.problems) <= set(built)  # the printed command builds every missing design

    prof = Profiler()
    through_xrt = wb.Engine(tiny_model, "npu", tune=tune, observer=prof)
    got = through_xrt.generate(PROMPT, 6)
    want = wb.Engine(tiny_model, "npu", tune=f"dtype={dtype}").generate(PROMPT, 6)
    assert got.output_ids == want.output_ids  # token for token
    backend = through_xrt.backend
    launches = [c for c in fake.calls if c[0] == "launch"]
    assert len(launches) == backend.npu_launches > 0 and {c[1] for c in launches} == {3}
    assert {c[4] for c in launches} == ({"gemv", "gemm"} if dtype == "bf16" else {"gemm"}) | {
        "rmsnorm",
        "attention",
    }
    loaded = [c[1] for c in fake.calls if c[0] == "register_xclbin"]
    assert len(loaded) == len(set(loaded)) == len(backend.xrt_ops.kernels)  # each design loaded once
    df = prof.dataframe()
    on_npu = df[df.device.str.startswith("npu:xrt")]
    assert set(on_npu.kind) == {"matmul", "rmsnorm", "attention"}
    assert (on_npu.timing == "measured (npu, XRT)").all() and not df.timing.eq("emulated").any()
    info = backend.device
    assert info.kind == "npu" and info.details["timing"].startswith("NPU ops measured (npu, XRT)")


def test_logits_through_xrt_equal_the_emulators(tiny_model, fake, monkeypatch, tmp_path):
    """Prefill rows padded to a 16-row design, keys to 64 slots: the same values as the emulator's."""
    root = tmp_path / "designs"
    run_build_command(
        designs.build_command(tiny_model.source, "npu1", "bf16", [16], 256, root), fake, monkeypatch
    )
    engines = [wb.Engine(tiny_model, "npu", tune=t) for t in (f"mode=xrt,designs={root}", "mode=emulator")]
    seqs = [e.new_sequence() for e in engines]
    first = [e.forward(s, PROMPT, logits="all") for e, s in zip(engines, seqs)]
    assert np.allclose(first[0], first[1], atol=1e-4)
    nxt = [e.forward(s, [7]) for e, s in zip(engines, seqs)]
    assert np.allclose(nxt[0], nxt[1], atol=1e-4)


def test_stale_or_broken_artifacts_are_named(tiny_model, fake, monkeypatch, tmp_path):
    root = tmp_path / "designs"
    run_build_command(
        designs.build_command(tiny_model.source, "npu1", "bf16", [16], 256, root), fake, monkeypatch
    )
    engine = wb.Engine(tiny_model, "npu", tune=f"mode=xrt,designs={root}")
    prefill = Step.single(engine.new_sequence().cache, PROMPT, 0)
    step = engine.backend.step_schedules(tiny_model.graph(len(PROMPT)), prefill)
    gemm, norm = (designs.artifacts(next(s for s in step if s.op == op), root) for op in ("gemm", "rmsnorm"))
    gemm.xclbin.write_bytes(b"not an xclbin")
    norm.schedule_json.write_text(gemm.schedule_json.read_text())  # a design built for another schedule
    with pytest.raises(MissingDesignsError) as err:
        engine.generate(PROMPT, 2)
    problems = err.value.problems
    assert set(problems) == {gemm.name, norm.name}
    assert "no xclbin2 header" in problems[gemm.name] and "another schedule" in problems[norm.name]
    assert "--max-keys 256" in err.value.command


def test_bad_instruction_file_is_a_clear_error(tiny_model, fake, monkeypatch, tmp_path):
    root = tmp_path / "designs"
    run_build_command(
        designs.build_command(tiny_model.source, "npu1", "bf16", [16], 256, root), fake, monkeypatch
    )
    for insts in root.glob("*/insts.bin"):
        insts.write_bytes(b"\x01\x02\x03")  # not whole 32-bit words
    with pytest.raises(ValueError, match="not a whole number of 32-bit instruction words"):
        wb.Engine(tiny_model, "npu", tune=f"mode=xrt,designs={root}").generate(PROMPT, 2)


def test_detection_messages(tiny_model, monkeypatch, tmp_path):
    """mode=xrt without an NPU or without pyxrt says which is missing and how to get it."""
    no_npu = xrt.NpuDetection(pyxrt=True)
    monkeypatch.setattr(xrt, "detect", lambda *a, **k: no_npu)
    with pytest.raises(BackendUnavailableError, match=r"mode=xrt\): no NPU found \(no /dev/accel"):
        wb.Engine(tiny_model, "npu", tune="mode=xrt")
    no_pyxrt = xrt.NpuDetection(accel_nodes=["/dev/accel/accel0"])
    monkeypatch.setattr(xrt, "detect", lambda *a, **k: no_pyxrt)
    with pytest.raises(BackendUnavailableError, match=r"pyxrt is not importable.*xdna-driver"):
        wb.Engine(tiny_model, "npu", tune="mode=xrt")
