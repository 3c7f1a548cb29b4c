"""Gemma 3n on the cpu backend against the numpy reference (docs/gemma3n.md, docs/backend-cpu.md#gemma-3n).

The three tiny checkpoints of tests/fixtures/gemma3n/ (float16 weights: the float path), the GGUF llama.cpp's
converter wrote of ``e2b_pattern``, and ``e2b_pattern`` with its matrices as Q8_0 blocks (the quantized
decode kernels, the sparse layers' up rows read in place). Prefill, prefill in chunks and token by token,
with the sparse layers' skipping on and off (``sparse_skip``).
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from tiny import tiny_vocab

import workbench as wb
from workbench.models.gguf_writer import write_gguf
from workbench.quant.formats import GGMLType

FIXTURES = Path(__file__).parent / "fixtures"
# max |logit difference| against numpy that docs/backend-cpu.md states per act_quant; float weights run
# float products whatever act_quant says
TOLERANCE = {"int16": 5e-3, "none": 1e-4}
SOURCES = ("e2b_pattern", "gqa_softcap", "shared_alternating", "e2b_pattern.gguf", "e2b_pattern-q8_0")


def _q8_0(folder: Path) -> Path:
    """``e2b_pattern`` with every matrix whose rows are whole 32-value blocks stored as Q8_0."""
    model = wb.load(FIXTURES / "gemma3n" / "e2b_pattern")
    tensors = {}
    for name, t in model.weights.items():
        w = t.dequantize()
        if w.ndim >= 2 and w.shape[-1] % 32 == 0:
            tensors[name] = (GGMLType.Q8_0, gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0))
        else:
            tensors[name] = (GGMLType.F32, w)
    return write_gguf(folder / "e2b_pattern-q8_0.gguf", model.config, tensors, tiny_vocab())


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = {n: wb.load(FIXTURES / "gemma3n" / n) for n in SOURCES[:4]}
    out["e2b_pattern-q8_0"] = wb.load(_q8_0(tmp_path_factory.mktemp("q8")))
    return out


@pytest.fixture(scope="module")
def prompts():
    ref = json.loads((FIXTURES / "gemma3n_transformers.json").read_text())["models"]
    return {n: ref[n.split(".")[0].split("-")[0]]["prompts"]["long"]["ids"] for n in SOURCES}


@pytest.fixture(scope="module")
def numpy_logits(models, prompts):
    """Per model: numpy's logits of every prompt row by prefill, and token by token."""
    out = {}
    for name, model in models.items():
        ids = prompts[name]
        e = wb.Engine(model, "numpy")
        prefill = e.forward(e.new_sequence(), ids, logits=list(range(len(ids))))
        seq = e.new_sequence()
        out[name] = prefill, np.stack([e.forward(seq, [t]) for t in ids])
    return out


def _worst(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max())


def _check(got: np.ndarray, want: np.ndarray, tol: float) -> None:
    assert _worst(got, want) < tol, f"max |logit difference| {_worst(got, want):.3g} (tolerance {tol})"
    assert (got.argmax(-1) == want.argmax(-1)).all(), "greedy tokens differ"


CASES = [(n, "int16", skip, 1) for n in SOURCES for skip in (1, 0)] + [
    ("e2b_pattern-q8_0", "none", 1, 1),
    ("e2b_pattern-q8_0", "none", 0, 1),
    ("e2b_pattern-q8_0", "int16", 1, 0),  # fused=0: the plain graph, every kind by its own handler
]


@pytest.mark.parametrize("name, act_quant, skip, fused", CASES)
def test_cpu_matches_numpy(models, prompts, numpy_logits, name, act_quant, skip, fused):
    """Prefill (every row), prefill in chunks of 5 and token by token equal numpy's greedy tokens, with the
    logits within the stated tolerance, skipping on and off."""
    ids = prompts[name]
    want_prefill, want_tokens = numpy_logits[name]
    tune = f"sparse_skip={skip},act_quant={act_quant},fused={fused}"
    e = wb.Engine(models[name], "cpu", tune=tune)
    tol = TOLERANCE[act_quant]
    _check(e.forward(e.new_sequence(), ids, logits=list(range(len(ids)))), want_prefill, tol)
    seq = e.new_sequence()
    _check(np.stack([e.forward(seq, [t]) for t in ids]), want_tokens, tol)
    chunked = wb.Engine(models[name], "cpu", tune=tune, prefill_chunk=5)
    _check(chunked.forward(chunked.new_sequence(), ids, logits=list(range(len(ids)))), want_prefill, tol)


@pytest.mark.parametrize("name", ["e2b_pattern", "e2b_pattern-q8_0"])
def test_sparse_layers_skip_units(models, prompts, name):
    """Decode computes only the up rows and down columns of the units the Gaussian top-k kept (about 5 % at
    sparsity 0.95); the dense twin has no skipping op at all."""
    ids = prompts[name]
    e = wb.Engine(models[name], "cpu")
    b = e.backend
    graph = b.prepare_graph(models[name].graph(1))
    assert [op.layer for op in graph.ops if op.kind == "rmsnorm_topk_ffn"] == [0, 1, 2, 3, 4]
    assert not any(op.kind == "gaussian_topk" for op in graph.ops)
    b.topk_units[:] = 0
    seq = e.new_sequence()
    for t in ids:
        e.forward(seq, [t])
    kept, ranked = b.topk_units
    assert ranked == len(ids) * 5 * models[name].config.ffn
    assert 0 < kept < 0.12 * ranked, (kept, ranked)
    dense = wb.Engine(models[name], "cpu", tune="sparse_skip=0").backend
    assert not any(op.kind == "rmsnorm_topk_ffn" for op in dense.prepare_graph(models[name].graph(1)).ops)
    assert not dense.topk_down  # no transposed down copies either


def test_device_details_say_how_steps_run(models):
    """Gemma 3n runs op by op (the one-token program covers none of its kinds) and the details say so."""
    d = wb.Engine(models["e2b_pattern-q8_0"], "cpu").backend.device.details
    assert d["decode_program"].startswith("op by op") and "altup_predict" in d["decode_program"]
    assert d["sparse_skip"] is True or d["sparse_skip"] == 1


def test_per_layer_table_gathered_by_row(models):
    """The per-layer embedding table is read only by row: never converted to float32 whole."""
    b = wb.Engine(models["e2b_pattern"], "cpu").backend
    table = b.weights["per_layer_token_embd.weight"]
    assert not hasattr(table, "data")
    rows = table.gather(np.array([3, 7]))
    want = models["e2b_pattern"].weights["per_layer_token_embd.weight"].dequantize()[[3, 7]]
    assert np.array_equal(rows, want)


@pytest.mark.parametrize("skip", [1, 0])
def test_ragged_batch_equals_numpy(models, skip):
    """Sequences sharing one step (decode rows beside prefill chunks) each read their own owners' caches,
    in place for a decode row, through the owner's append for a chunk."""
    from workbench.runtime.batch import SeqChunk, forward_batch

    rng = np.random.default_rng(0)
    history = [rng.integers(6, 300, n).tolist() for n in (5, 1, 12, 9)]
    new = [[17], rng.integers(6, 300, 4).tolist(), [7], rng.integers(6, 300, 10).tolist()]
    got = {}
    for backend, tune in (("numpy", None), ("cpu", f"sparse_skip={skip}")):
        e = wb.Engine(models["e2b_pattern-q8_0"], backend, tune=tune)
        seqs = [e.new_sequence(64) for _ in history]
        for s, h in zip(seqs, history, strict=True):
            e.forward(s, h)
        got[backend] = forward_batch(e, [SeqChunk(s, n, "all") for s, n in zip(seqs, new, strict=True)])
    for c, n in zip(got["cpu"], got["numpy"], strict=True):
        _check(c, n, TOLERANCE["int16"])
