"""The npu backend: covered ops on the AIE emulator, the rest on the host, each op saying where it ran."""

from __future__ import annotations

import numpy as np
import pytest
from tiny import write_tiny_gguf

import workbench as wb
from workbench.backends import auto_candidates, probe_backends
from workbench.instrument.profiler import Profiler, by_placement


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return wb.load(str(write_tiny_gguf(tmp_path_factory.mktemp("npu") / "tiny.gguf")))


def test_logits_close_to_reference_and_ops_labeled(tiny_model):
    ref = wb.Engine(tiny_model, "numpy")
    prof = Profiler()
    npu = wb.Engine(tiny_model, "npu", observer=prof)
    ids = list(range(10, 30))
    for e in (ref, npu):
        e.seq = e.new_sequence()
    want = ref.forward(ref.seq, ids, logits="all")
    got = npu.forward(npu.seq, ids, logits="all")
    assert np.abs(got - want).max() < 0.1 and np.abs(got - want).max() > 0  # bf16, not a copy of fp32
    want1, got1 = ref.forward(ref.seq, [7]), npu.forward(npu.seq, [7])
    assert np.abs(got1 - want1).max() < 0.1
    df = prof.dataframe()
    on_npu = df[df.device.str.startswith("npu:emulator")]
    on_host = df[df.device == "numpy:host"]
    assert set(on_npu.kind) == {"matmul", "rmsnorm", "attention"}
    assert set(on_host.kind) == {"embed", "rope", "gelu_mul", "add", "gather_rows"}
    assert (on_npu.timing == "emulated").all() and on_npu.device_s.gt(0).all()
    assert on_host.device_s.isna().all() and on_host.timing.str.startswith("measured").all()
    det = npu.backend.device
    assert det.kind == "emulator" and det.details["emulated_npu_s"] > 0
    assert det.details["npu_launches"] == len(on_npu)
    view = by_placement(df)
    assert {("matmul", "emulated"), ("add", "measured (host)")} <= {(k, t) for k, _, t in view.index}


def test_int8_and_npu2_run(tiny_model):
    ref = wb.Engine(tiny_model, "numpy").generate(list(range(10, 20)), 4)
    for tune in ("dtype=int8", "device=npu2", "device=hawkpoint,dtype=int8"):
        out = wb.Engine(tiny_model, "npu", tune=tune).generate(list(range(10, 20)), 4)
        assert len(out.output_ids) == 4 and out.backend == "npu"
        assert out.device.startswith("npu:AIE emulator")
    assert ref.output_ids  # the reference ran


def test_bad_tunables_are_clear_errors(tiny_model):
    with pytest.raises(ValueError, match="dtype must be"):
        wb.Engine(tiny_model, "npu", tune="dtype=fp8")
    with pytest.raises(ValueError, match="device must be"):
        wb.Engine(tiny_model, "npu", tune="device=npu9")
    with pytest.raises(ValueError, match="unknown tunables"):
        wb.Engine(tiny_model, "npu", tune="colums=4")


def test_auto_never_picks_the_emulator():
    assert "npu" not in auto_candidates()
    row = next(r for r in probe_backends() if r["backend"] == "npu")
    assert row["available"] and all(d["kind"] in ("emulator", "npu") for d in row["devices"])
    if not any(d["kind"] == "npu" for d in row["devices"]):
        assert row["reason"].startswith("emulator only")


@pytest.mark.slow
def test_greedy_tokens_match_reference_on_270m(default_model, numpy_engine):
    """Greedy tokens through the emulator (bf16) equal the reference wherever its top-2 margin > 0.5."""
    npu = wb.Engine(default_model, "npu")
    checked = 0
    for prompt in ("The capital of France is", "def fibonacci(n):"):
        ids = numpy_engine.encode_prompt(prompt)
        seq_r, seq_n = numpy_engine.new_sequence(), npu.new_sequence()
        lr, ln = numpy_engine.forward(seq_r, ids), npu.forward(seq_n, ids)
        for _ in range(4):
            top2 = np.sort(lr)[-2:]
            tok_r, tok_n = int(np.argmax(lr)), int(np.argmax(ln))
            if top2[1] - top2[0] > 0.5:
                assert tok_n == tok_r, (prompt, tok_n, tok_r)
                checked += 1
            lr, ln = numpy_engine.forward(seq_r, [tok_r]), npu.forward(seq_n, [tok_r])
    assert checked >= 4  # the margin condition held often enough for the comparison to mean something
    assert npu.backend.emulated_s > 0
