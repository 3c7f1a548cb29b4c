"""The npu backend (emulator) on Gemma 3n: the new kinds on the host, matmuls, norms and attention on NPU
designs where one fits, the shapes no design covers (the tiny checkpoints' short rows) on the host and
named in the device details; greedy tokens equal the numpy reference's wherever bf16 allows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import workbench as wb

FIXTURES = Path(__file__).parent / "fixtures"
MODELS = ("e2b_pattern", "gqa_softcap", "shared_alternating")
STEPS = 12
LOGIT_TOLERANCE = 0.1  # bf16 matmuls, norms and attention: measured up to 0.051 on these models
MARGIN = 2 * LOGIT_TOLERANCE  # where numpy's top-2 margin exceeds this, the tokens must agree


@pytest.mark.parametrize("name", MODELS)
def test_npu_greedy_equals_numpy(name):
    """Teacher-forced on numpy's greedy tokens (prefill of the long prompt, then token by token)."""
    ref = json.loads((FIXTURES / "gemma3n_transformers.json").read_text())["models"][name]
    prompt = ref["prompts"]["long"]["ids"]
    model = wb.load(FIXTURES / "gemma3n" / name)
    npu, numpy = wb.Engine(model, "npu"), wb.Engine(model, "numpy")
    sn, sr = npu.new_sequence(), numpy.new_sequence()
    ln, lr = npu.forward(sn, prompt), numpy.forward(sr, prompt)
    checked = 0
    for _ in range(STEPS):
        assert np.abs(ln - lr).max() < LOGIT_TOLERANCE
        token = int(np.argmax(lr))
        top2 = np.sort(lr)[-2:]
        if top2[1] - top2[0] > MARGIN:
            assert int(np.argmax(ln)) == token
            checked += 1
        ln, lr = npu.forward(sn, [token]), numpy.forward(sr, [token])
    assert checked >= 4  # the margin condition held often enough for the comparison to mean something
    details = npu.backend.device.details
    assert details["npu_launches"] > 0  # some matmuls, norms and attention ran on NPU designs
    for key, why in details["host_fallbacks"].items():
        assert key.split()[0] in ("matmul", "rmsnorm", "attention") and "no NPU design" in why


def test_fallback_ops_are_labelled_host():
    """The graph the backend runs says which NPU-kind ops ran on the host, and why."""
    model = wb.load(FIXTURES / "gemma3n" / "e2b_pattern")
    backend = wb.Engine(model, "npu").backend
    graph = backend.prepare_graph(model.graph(1, 1))
    fell = [op for op in graph.ops if "npu_fallback" in op.attrs]
    assert fell and all(op.attrs["device"] == "numpy:host" for op in fell)
    assert {op.name.split(".")[-1] for op in fell} >= {"laurel_r"}  # rank 4: no GEMV design has so short rows
    assert any(op.attrs["device"].startswith("npu:") and op.kind == "matmul" for op in graph.ops)
