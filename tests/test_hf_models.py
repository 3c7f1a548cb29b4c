"""Hugging Face directories: tiny random checkpoints, shards, lazy loading, lying headers, GGUF round trip;
Gemma3ForConditionalGeneration directories as the Hub ships 4B-27B; configs that leave fields to
transformers' defaults or contradict their tensors."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from layouts import LAYOUT_4B, layout_weights, write_conditional_hf
from tiny import TINY, tiny_weights, write_tiny_gguf, write_tiny_hf

import workbench as wb
from workbench.models.config import UnsupportedModelError, preset
from workbench.models.gemma3 import weight_shapes
from workbench.models.hf_config import TEXT_DEFAULTS, config_from_hf
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


# -- Gemma3ForConditionalGeneration directories, as the Hub ships 4B to 27B -----------------------------
@pytest.fixture(scope="module")
def layout_4b(tmp_path_factory):
    """The Hub-4B-layout weights and their logits loaded from a complete Gemma3ForCausalLM directory."""
    w = layout_weights("4b")
    causal = wb.load(write_tiny_hf(tmp_path_factory.mktemp("causal") / "causal", w, config=LAYOUT_4B))
    return w, _logits(causal)


@pytest.mark.parametrize("style", ["hub", "transformers5"])
def test_conditional_generation_dir_equals_causal_lm(tmp_path, layout_4b, style):
    """A text_config with five fields: heads, KV heads, head_dim, vocabulary and query_pre_attn_scalar
    come from transformers' defaults and the tensors; text weights under ``language_model``; the vision
    tower (one of its tensors named like a text layer's q_proj) and the projector are ignored."""
    weights, want = layout_4b
    model = wb.load(write_conditional_hf(tmp_path / style, weights, style))
    assert model.config.with_(name=LAYOUT_4B.name) == LAYOUT_4B
    assert set(model.weights) == set(weights)
    np.testing.assert_array_equal(_logits(model), want)


def _shapes(config, names=None):
    """(name in the file, shape) per GGUF name, as safetensors_dir passes them to config_from_hf."""
    shapes = weight_shapes(config)
    return {n: (f"hf.{n}", s) for n, s in shapes.items() if names is None or n in names}


# text_config of the Hub's google/gemma-3-{4b,12b,27b}-pt config.json files
HUB_TEXT_CONFIGS = {
    "gemma3-4b": {"hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34},
    "gemma3-12b": {
        "hidden_size": 3840,
        "intermediate_size": 15360,
        "num_attention_heads": 16,
        "num_hidden_layers": 48,
        "num_key_value_heads": 8,
    },
    "gemma3-27b": {
        "head_dim": 128,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "num_attention_heads": 32,
        "num_hidden_layers": 62,
        "num_key_value_heads": 16,
        "query_pre_attn_scalar": 168,
    },
}


@pytest.mark.parametrize("size", sorted(HUB_TEXT_CONFIGS))
@pytest.mark.parametrize("with_tensors", [True, False])
def test_hub_configs_of_the_large_sizes(size, with_tensors):
    """The Hub's text configs give the published shapes, with or without tensors to read sizes from."""
    text = {
        **HUB_TEXT_CONFIGS[size],
        "model_type": "gemma3_text",
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    }
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "text_config": text}
    want = preset(size)
    shapes = _shapes(want) if with_tensors else {}
    assert config_from_hf(cfg, shapes, "config.json", name=size) == want


def test_text_config_defaults_are_transformers():
    transformers = pytest.importorskip("transformers")
    t = transformers.Gemma3TextConfig()
    for key, value in TEXT_DEFAULTS.items():
        if key == "sliding_window_pattern":
            assert (
                t.layer_types[value - 1] == "full_attention" and t.layer_types[value - 2] != "full_attention"
            )
        elif key in ("rope_theta", "rope_local_base_freq"):
            which = "full_attention" if key == "rope_theta" else "sliding_attention"
            assert t.rope_parameters[which]["rope_theta"] == value
        else:
            assert getattr(t, key) == value, key


def test_sizes_come_from_the_tensors_over_the_defaults():
    """Only the model type given: every size is read from the tensors (none is transformers' default)."""
    cfg = {"model_type": "gemma3", "text_config": {"query_pre_attn_scalar": 16}}
    got = config_from_hf(cfg, _shapes(TINY), "config.json", name="tiny")
    assert got == TINY.with_(context_length=131072, sliding_window=4096, sliding_window_pattern=6)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"num_attention_heads": 8}, r"num_attention_heads = 8 but tensor 'hf\.blk\.0\.attn_q\.weight'"),
        ({"num_key_value_heads": 4}, r"num_key_value_heads = 4 but tensor 'hf\.blk\.0\.attn_k\.weight'"),
        ({"head_dim": 32}, r"head_dim = 32 but tensor 'hf\.blk\.0\.attn_q_norm\.weight'"),
        (
            {"vocab_size": 262208},
            r"vocab_size = 262208 but tensor 'hf\.token_embd\.weight' has shape \[300, 64\]",
        ),
        ({"num_hidden_layers": 5}, r"num_hidden_layers = 5 but the files hold layers 0\.\.2"),
        ({"num_attention_heads": True}, "not a positive integer"),
        ({"hidden_activation": "gelu"}, "hidden_activation is 'gelu'"),
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 8.0}}, "rope_type 'yarn'"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 8.0}}, "one per layer type"),
    ],
)
def test_config_contradicting_the_tensors_is_named(change, message):
    cfg = {"model_type": "gemma3", "text_config": {**TINY.to_hf_config(), **change}}
    with pytest.raises(UnsupportedModelError, match=message):
        config_from_hf(cfg, _shapes(TINY), "config.json")


def test_tensor_of_the_wrong_shape_is_named():
    shapes = _shapes(TINY)
    shapes["blk.2.ffn_up.weight"] = ("model.layers.2.mlp.up_proj.weight", (97, 64))
    with pytest.raises(
        UnsupportedModelError, match=r"'model\.layers\.2\.mlp\.up_proj\.weight' has shape \[97, 64\]"
    ):
        config_from_hf(TINY.to_hf_config(), shapes, "config.json")


def test_config_may_run_fewer_layers_than_the_files_hold(tmp_path, weights):
    folder = write_tiny_hf(tmp_path / "hf", weights)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_hidden_layers"], cfg["layer_types"] = 2, cfg["layer_types"][:2]
    (folder / "config.json").write_text(json.dumps(cfg))
    model = wb.load(folder)
    assert model.config.n_layers == 2 and not any(n.startswith("blk.2.") for n in model.weights)
    two = {k: v for k, v in weights.items() if not k.startswith("blk.2.")}
    want = _logits(
        wb.load(
            write_tiny_hf(
                tmp_path / "two", two, config=TINY.with_(n_layers=2, layer_types=TINY.layer_types[:2])
            )
        )
    )
    np.testing.assert_array_equal(_logits(model), want)


def test_text_tensor_named_twice_is_an_error(tmp_path, weights):
    """The final norm under both the causal-LM and the Hub's multimodal name, in two files."""
    from workbench.models.export import write_safetensors

    folder = write_tiny_hf(tmp_path / "hf", weights)
    norm = weights["output_norm.weight"] - np.float32(1.0)
    write_safetensors(
        folder / "extra.safetensors",
        {"language_model.model.norm.weight": (norm.shape, lambda: norm)},
        "float32",
    )
    (folder / "model.safetensors").rename(folder / "a.safetensors")
    message = (
        r"'language_model\.model\.norm\.weight' is .*, and so is 'model\.norm\.weight' in a\.safetensors"
    )
    with pytest.raises(SafetensorsError, match=message):
        wb.load(folder)
