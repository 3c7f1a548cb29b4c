"""Hugging Face directories: tiny random checkpoints, shards, lazy loading, lying headers, GGUF round trip."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from tiny import TINY, tiny_weights, write_tiny_gguf, write_tiny_hf

import workbench as wb
from workbench.models.config import UnsupportedModelError
from workbench.models.safetensors_dir import SafetensorsError
from workbench.models.weights import MissingTensorError

IDS = list(range(2, 42))  # 40 tokens: crosses the tiny model's 8-token sliding window many times


def _logits(model, ids=IDS):
    e = wb.Engine(model, "numpy")
    return e.forward(e.new_sequence(), ids, logits="all")


@pytest.fixture(scope="module")
def weights():
    return tiny_weights()


@pytest.fixture(scope="module")
def gguf_logits(tmp_path_factory, weights):
    return _logits(wb.load(write_tiny_gguf(tmp_path_factory.mktemp("g") / "tiny.gguf", weights)))


def test_hf_dir_matches_gguf_with_same_weights(tmp_path, weights, gguf_logits):
    model = wb.load(write_tiny_hf(tmp_path / "hf", weights))
    assert model.kind == "hf" and model.config.layer_types == TINY.layer_types
    np.testing.assert_allclose(_logits(model), gguf_logits, atol=1e-4)


def test_sharded_bf16_and_f16(tmp_path, weights):
    one = _logits(wb.load(write_tiny_hf(tmp_path / "one", weights, dtype="bfloat16")))
    three = _logits(wb.load(write_tiny_hf(tmp_path / "three", weights, dtype="bfloat16", shards=3)))
    np.testing.assert_array_equal(one, three)
    f16 = _logits(wb.load(write_tiny_hf(tmp_path / "f16", weights, dtype="float16")))
    assert np.abs(f16 - one).max() < 0.1  # both are roundings of the same weights


def test_tensors_are_read_lazily(tmp_path, weights):
    model = wb.load(write_tiny_hf(tmp_path / "hf", weights))
    assert all(t._raw is None for t in model.weights.values())
    model.weights["blk.0.attn_q.weight"].dequantize()
    assert sum(t._raw is not None for t in model.weights.values()) == 1


def test_missing_tensor_is_named(tmp_path, weights):
    partial = {k: v for k, v in weights.items() if k != "blk.1.ffn_up.weight"}
    model = wb.load(write_tiny_hf(tmp_path / "hf", partial))
    with pytest.raises(MissingTensorError, match=r"blk\.1\.ffn_up\.weight"):
        model.graph(4)


def test_unsupported_architecture(tmp_path, weights):
    folder = write_tiny_hf(tmp_path / "hf", weights)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = "llama"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="llama"):
        wb.load(folder)


def _rewrite_header(path, mutate):
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    mutate(header)
    new = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(new)) + new + blob[8 + n :])


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda h: h["model.norm.weight"].update(data_offsets=[0, 10**12]), "header lies"),
        (lambda h: h["model.norm.weight"].update(shape=[10**6]), "header lies"),
        (lambda h: h["model.norm.weight"].update(dtype="I64"), "dtype I64"),
        (lambda h: h["model.norm.weight"].update(shape=[-64]), "negative"),
        (lambda h: h["model.norm.weight"].pop("dtype"), "malformed"),
    ],
)
def test_lying_safetensors_header(tmp_path, weights, mutate, message):
    folder = write_tiny_hf(tmp_path / "hf", weights)
    _rewrite_header(folder / "model.safetensors", mutate)
    with pytest.raises(SafetensorsError, match=message):
        wb.load(folder)


def test_overlapping_and_truncated_safetensors(tmp_path, weights):
    folder = write_tiny_hf(tmp_path / "hf", weights)
    st = folder / "model.safetensors"

    def overlap(h):
        a, b = h["model.norm.weight"], h["model.layers.0.input_layernorm.weight"]
        b["data_offsets"] = a["data_offsets"]

    _rewrite_header(st, overlap)
    with pytest.raises(SafetensorsError, match="overlap"):
        wb.load(folder)
    st.write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(SafetensorsError, match="impossible"):
        wb.load(folder)
    st.write_bytes(struct.pack("<Q", 5) + b"{oops")
    with pytest.raises(SafetensorsError, match="JSON"):
        wb.load(folder)
    st.write_bytes(b"abc")
    with pytest.raises(SafetensorsError, match="too short"):
        wb.load(folder)


def test_sharded_index_errors(tmp_path, weights):
    folder = write_tiny_hf(tmp_path / "hf", weights, shards=2)
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["model.norm.weight"] = "../../etc/passwd"
    index.write_text(json.dumps(data))
    with pytest.raises(SafetensorsError, match="outside"):
        wb.load(folder)
    data["weight_map"]["model.norm.weight"] = "missing.safetensors"
    index.write_text(json.dumps(data))
    with pytest.raises(SafetensorsError, match="missing"):
        wb.load(folder)


@pytest.mark.slow
def test_default_model_round_trip_through_safetensors(default_model, numpy_engine, tmp_path):
    """The bundled GGUF exported (dequantized, HF norm convention w) gives the same logits as the GGUF."""
    from workbench.models.export import export_hf

    folder = export_hf(default_model, tmp_path / "gemma3-270m-hf")
    hf = wb.load(folder)
    assert hf.config.layer_types == default_model.config.layer_types
    ids = default_model.tokenizer.encode("The capital of France is")
    assert hf.tokenizer.encode("The capital of France is") == ids
    ours = numpy_engine.forward(numpy_engine.new_sequence(), ids)
    e = wb.Engine(hf, "numpy")
    np.testing.assert_allclose(e.forward(e.new_sequence(), ids), ours, atol=1e-4)
