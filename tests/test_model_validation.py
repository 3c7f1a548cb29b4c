"""Every value a loader reads is checked: a bad one is a ModelFormatError naming file, key and value
(an unsupported but well-formed one an UnsupportedModelError); ``info`` needs no tokenizer, generation
says when it lacks one; a vocabulary without byte pieces loads (issue 29)."""

from __future__ import annotations

import json
import math
import shutil
import struct

import numpy as np
import pytest
import safetensors_edit
from gguf_edit import ARRAY, BOOL, F32, I32, STRING, U8, U32, U64, encode_value, read_parts
from tiny import TINY, tiny_vocab, tiny_weights, write_tiny_gguf, write_tiny_hf
from tiny_variants import vocab_without_bytes, write_gguf_without_bytes, write_tokenizer_json

import workbench as wb
from workbench.cli import main
from workbench.models.errors import ModelFormatError, UnsupportedModelError
from workbench.models.gguf import GGUFError
from workbench.models.safetensors_dir import SafetensorsError
from workbench.models.tokenizer import Tokenizer, TokenizerDataError, TokenizerError


@pytest.fixture(scope="module")
def gguf_parts(tmp_path_factory):
    return read_parts(write_tiny_gguf(tmp_path_factory.mktemp("g") / "tiny.gguf"))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return write_tiny_hf(tmp_path_factory.mktemp("h") / "tiny")


@pytest.fixture
def hf_copy(hf_dir, tmp_path):
    return shutil.copytree(hf_dir, tmp_path / "hf")


def _with_value(parts, tmp_path, key, value):
    """The tiny GGUF with ``key`` set to ``value`` ((type id, value), or None to remove it), written."""
    vtype, payload = (None, b"") if value is None else (value[0], encode_value(*value))
    path = tmp_path / "m.gguf"
    path.write_bytes(parts.with_entry(key, vtype, payload).to_bytes())
    return path


def _edit_json(path, **changes):
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc))


# -- the four reports ----------------------------------------------------------------------
def test_zero_heads_is_a_clear_error_not_a_traceback(gguf_parts, tmp_path, capsys):
    path = _with_value(gguf_parts, tmp_path, "gemma3.attention.head_count", (U32, 0))
    with pytest.raises(
        ModelFormatError, match=r"m\.gguf: gemma3\.attention\.head_count is 0: not a positive"
    ):
        wb.load(path)
    assert main(["info", str(path), "--json"]) == 1
    err = capsys.readouterr().err
    assert "head_count is 0" in err and "Traceback" not in err


@pytest.mark.parametrize("doc", [[1, 2], 3, "gemma3", None, True, 1.5])
def test_config_json_of_another_type(hf_copy, doc, capsys):
    (hf_copy / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ModelFormatError, match=r"config\.json: is .*, not a JSON object"):
        wb.load(hf_copy)
    assert main(["info", str(hf_copy)]) == 1
    assert "not a JSON object" in capsys.readouterr().err


def test_vocabulary_without_byte_pieces_loads_and_encodes(tmp_path):
    """As llama.cpp: no byte fallback where the byte pieces are missing; unknown text becomes <unk>."""
    model = wb.load(write_gguf_without_bytes(tmp_path / "nobytes.gguf"))
    tok = model.tokenizer
    assert tok.vocab_size == model.config.vocab_size == 300 - 256
    ids = tok.encode(" the a", add_bos=False)
    assert tok.unk_id not in ids and tok.decode(ids) == " the a"
    ids = tok.encode("<start_of_turn>the é", add_bos=True)
    assert ids[:2] == [2, 4] and ids[-1] == tok.unk_id == 3  # é: no byte pieces, so <unk>
    e = wb.Engine(model, "numpy")
    assert len(e.generate(ids, 2).output_ids) == 2


def test_a_part_of_the_byte_pieces_is_named(tmp_path):
    model = wb.load(write_gguf_without_bytes(tmp_path / "half.gguf", keep_bytes=128))
    with pytest.raises(
        TokenizerDataError, match=r"half\.gguf: tokenizer\.ggml\.tokens: 128 pieces are typed BYTE"
    ):
        _ = model.tokenizer


def test_info_without_a_tokenizer_and_generate_says_it_needs_one(hf_copy, capsys):
    (hf_copy / "tokenizer.model").unlink()
    assert main(["info", str(hf_copy), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"]["layers"] == TINY.n_layers and out["tokenizer"]["source"] is None
    assert "no tokenizer.model or tokenizer.json" in out["tokenizer"]["error"]
    model = wb.load(hf_copy)
    assert model.describe()["vocab"] == TINY.vocab_size
    with pytest.raises(TokenizerDataError, match="text generation needs a tokenizer"):
        _ = model.tokenizer
    argv = ["generate", "-m", str(hf_copy), "--prompt", "hi", "-n", "1", "--backend", "numpy", "--no-record"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "no tokenizer.model or tokenizer.json (text generation needs a tokenizer" in err
    assert "Traceback" not in err


def test_info_builds_no_tokenizer(gguf_parts, tmp_path, monkeypatch, capsys):
    """info prints the tokenizer's metadata without building it; bad tokenizer data do not stop it."""
    path = _with_value(gguf_parts, tmp_path, "tokenizer.ggml.scores", (ARRAY, (F32, [0.0])))

    def refuse(*_args):
        raise AssertionError("info built the tokenizer")

    monkeypatch.setattr(Tokenizer, "from_gguf", classmethod(refuse))
    monkeypatch.setattr(Tokenizer, "from_hf_dir", classmethod(refuse))
    assert main(["info", str(path), "--json"]) == 0
    tok = json.loads(capsys.readouterr().out)["tokenizer"]
    assert tok["source"] is None and "tokenizer.ggml.scores is an array of 1 float32" in tok["error"]
    assert main(["info", str(write_tiny_gguf(tmp_path / "ok.gguf")), "--json"]) == 0
    tok = json.loads(capsys.readouterr().out)["tokenizer"]
    assert tok == {
        "vocab": 300,
        "bos": 2,
        "eos": 1,
        "add_bos": True,
        "source": f"gguf:{tmp_path / 'ok.gguf'}",
    }


# -- GGUF metadata: every key the loader reads ------------------------------------------------------
@pytest.mark.parametrize(
    "key, value, message",
    [
        ("gemma3.attention.head_count", (STRING, "four"), r"head_count is 'four': not a positive integer"),
        ("gemma3.attention.head_count", (BOOL, True), r"head_count is True: not a positive integer"),
        ("gemma3.embedding_length", None, r"gemma3\.embedding_length is missing"),
        ("gemma3.embedding_length", (I32, -64), r"embedding_length is -64: not a positive integer"),
        ("gemma3.block_count", (U32, 5), r"block_count = 5 but the files hold layers 0\.\.2 only"),
        ("gemma3.block_count", (U64, 2**40), r"block_count is 1099511627776: above 1024"),
        (
            "gemma3.feed_forward_length",
            (ARRAY, (U32, [96] * 3)),
            r"feed_forward_length is an array of 3 uint32",
        ),
        ("gemma3.attention.head_count_kv", (U32, 3), r"head_count_kv is 3: does not divide head_count 4"),
        ("gemma3.attention.key_length", (U32, 15), r"key_length is 15: odd"),
        (
            "gemma3.embedding_length",
            (U32, 128),
            r"'token_embd\.weight' has shape \[300, 64\] but the config gives it \[300, 128\]",
        ),
        ("gemma3.attention.layer_norm_rms_epsilon", (F32, math.nan), r"epsilon is nan: not a finite number"),
        ("gemma3.rope.freq_base", (F32, -1.0), r"freq_base is -1\.0: not positive"),
        ("gemma3.context_length", (U32, 0), r"context_length is 0: not a positive integer"),
        ("gemma3.attention.sliding_window", (STRING, "8"), r"sliding_window is '8'"),
        ("gemma3.attention.sliding_window_pattern", (ARRAY, (BOOL, [1, 0])), r"has 2 flags for 3 layers"),
        ("gemma3.attention.sliding_window_pattern", (F32, 3.0), r"pattern is 3\.0: not a positive integer"),
        ("gemma3.final_logit_softcapping", (F32, 0.0), r"softcapping is 0\.0: not positive"),
        ("gemma3.rope.scaling.type", (U8, 1), r"scaling\.type is 1: not a string"),
        ("gemma3.attention.value_length", (U32, 8), None),  # unsupported: V heads narrower than K heads
        ("gemma3.rope.scaling.type", (STRING, "yarn"), None),
        ("general.architecture", (STRING, "llama"), None),
        ("general.architecture", (U32, 7), r"general\.architecture is 7: not a string"),
        ("general.name", (ARRAY, (STRING, ["a"])), r"general\.name is a list of 1: not a string"),
        (
            "tokenizer.ggml.tokens",
            (ARRAY, (U32, [1, 2])),
            r"tokens is an array of 2 uint32: not a list of str",
        ),
        ("tokenizer.ggml.tokens", (ARRAY, (STRING, [])), r"tokens is a list of 0: empty"),
        (
            "tokenizer.ggml.tokens",
            (ARRAY, (STRING, ["a"] * 299)),
            r"token_embd\.weight' has shape \[300, 64\]",
        ),
        ("workbench.synthetic", (STRING, "yes"), r"workbench\.synthetic is 'yes'"),
        ("general.alignment", (BOOL, True), r"general\.alignment True is not a power of two"),
    ],
)
def test_bad_metadata_value_is_named(gguf_parts, tmp_path, key, value, message):
    path = _with_value(gguf_parts, tmp_path, key, value)
    if message is None:  # well-formed, but not a model this engine runs
        with pytest.raises(UnsupportedModelError) as info:
            wb.load(path)
        assert not isinstance(info.value, ModelFormatError) and key.split(".")[-1] in str(info.value)
        return
    with pytest.raises(ModelFormatError, match=message) as info:
        wb.load(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "key, value, message",
    [
        (
            "tokenizer.ggml.scores",
            (ARRAY, (F32, [0.0])),
            r"scores is an array of 1 float32: has 1 values, expected 300",
        ),
        (
            "tokenizer.ggml.scores",
            (ARRAY, (STRING, ["0"] * 300)),
            r"scores is a list of 300: not an array of numbers",
        ),
        ("tokenizer.ggml.token_type", (ARRAY, (I32, [9] * 300)), r"token_type is .*: token 0 has type 9"),
        ("tokenizer.ggml.bos_token_id", (U32, 300), r"bos_token_id is 300: above 299"),
        ("tokenizer.ggml.unknown_token_id", (I32, -1), r"unknown_token_id is -1: not an integer >= 0"),
        ("tokenizer.ggml.add_bos_token", (U8, 1), r"add_bos_token is 1: not true or false"),
        ("tokenizer.ggml.model", None, r"tokenizer\.ggml\.model is missing"),
    ],
)
def test_bad_tokenizer_metadata_fails_only_when_the_tokenizer_is_needed(
    gguf_parts, tmp_path, key, value, message
):
    path = _with_value(gguf_parts, tmp_path, key, value)
    model = wb.load(path)  # config and tensors need no tokenizer
    assert model.describe()["layers"] == TINY.n_layers
    with pytest.raises(ModelFormatError, match=message) as info:
        _ = model.tokenizer
    assert str(path) in str(info.value) and isinstance(info.value, ModelFormatError)


def test_unsupported_tokenizer_model(gguf_parts, tmp_path):
    model = wb.load(_with_value(gguf_parts, tmp_path, "tokenizer.ggml.model", (STRING, "gpt2")))
    with pytest.raises(UnsupportedModelError, match=r"tokenizer\.ggml\.model is 'gpt2'"):
        _ = model.tokenizer


def test_non_utf8_token_is_named(gguf_parts, tmp_path):
    tokens = [t.encode() for t in tiny_vocab().tokens]
    tokens[100] = b"\xff\xfe"
    payload = struct.pack("<IQ", STRING, len(tokens)) + b"".join(
        struct.pack("<Q", len(t)) + t for t in tokens
    )
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_parts.with_entry("tokenizer.ggml.tokens", ARRAY, payload).to_bytes())
    model = wb.load(path)
    with pytest.raises(
        ModelFormatError, match=r"m\.gguf: metadata 'tokenizer\.ggml\.tokens'\[100\] is not valid UTF-8"
    ):
        _ = model.tokenizer


# -- Hugging Face directories: config fields, safetensors headers, index, tokenizer files -------------
@pytest.mark.parametrize(
    "changes, message",
    [
        ({"num_attention_heads": "4"}, r"num_attention_heads is '4': not a positive integer"),
        ({"num_hidden_layers": 10**30}, r"num_hidden_layers is 1000000000000000000000000000000: above 1024"),
        ({"rope_theta": [1]}, r"rope_theta is a list of 1: not a finite number"),
        ({"rope_theta": 10**400}, r"rope_theta is 1000.*: not a finite number"),
        ({"rope_scaling": 5}, r"rope_scaling is 5: not an object"),
        (
            {"rope_scaling": {"rope_type": "linear", "factor": "8"}},
            r"rope_scaling\.factor is '8': not a finite",
        ),
        ({"rope_parameters": {"full_attention": 3}}, r"rope_parameters\.full_attention is 3: not an object"),
        ({"layer_types": ["full_attention", "moe", "x"]}, r"layer_types is a list of 3: holds 'moe'"),
        ({"layer_types": "sliding_attention"}, r"layer_types is 'sliding_attention': not a list"),
        (
            {"layer_types": ["full_attention"]},
            r"layer_types is a list of 1: names 1 layers, the model runs 3",
        ),
        ({"model_type": 3}, r"model_type is 3: not a string"),
        ({"model_type": "gemma3", "text_config": []}, r"text_config is a list of 0: not an object"),
        ({"model_type": "gemma3", "text_config": {"rms_norm_eps": -1}}, r"text_config\.rms_norm_eps is -1"),
        ({"tie_word_embeddings": "yes"}, r"tie_word_embeddings is 'yes': not true or false"),
        ({"sliding_window": 0}, r"sliding_window is 0: not a positive integer"),
        ({"final_logit_softcapping": "30"}, r"final_logit_softcapping is '30': not a finite number"),
        ({"head_dim": 15}, r"head_dim = 15 but tensor"),
        ({"_name_or_path": 5}, r"_name_or_path is 5: not a string"),
    ],
)
def test_bad_config_field_is_named(hf_copy, changes, message):
    _edit_json(hf_copy / "config.json", **changes)
    with pytest.raises(ModelFormatError, match=message) as info:
        wb.load(hf_copy) if "_name_or_path" not in changes else _load_unnamed(hf_copy)
    assert str(hf_copy / "config.json") in str(info.value)


def _load_unnamed(folder):
    """config_from_hf reads _name_or_path only when the caller gives no name (the loader gives the
    directory's)."""
    from workbench.models.hf_config import config_from_hf

    return config_from_hf(json.loads((folder / "config.json").read_text()), {}, str(folder / "config.json"))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda h: h["model.norm.weight"].update(dtype=["F32"]), r"'model\.norm\.weight' is malformed"),
        (lambda h: h["model.norm.weight"].update(shape=[2**32, 2**32]), r"header lies"),
        (lambda h: h["model.norm.weight"].update(shape=[64.0]), r"non-integer shape"),
        (lambda h: h["model.norm.weight"].update(data_offsets=[0]), r"1 data_offsets"),
        (
            lambda h: h.update({"model.norm.weight": "F32"}),
            r"'model\.norm\.weight' is malformed \(not an object\)",
        ),
        (
            lambda h: h.update(
                {"model.embed_tokens.weight": {"dtype": "F32", "shape": [0, 64], "data_offsets": [0, 0]}}
            ),
            r"has shape \[0, 64\]",
        ),
    ],
)
def test_bad_safetensors_entry_is_named(hf_copy, mutate, message):
    st = hf_copy / "model.safetensors"
    header, data = safetensors_edit.split(st.read_bytes())
    mutate(header)
    st.write_bytes(safetensors_edit.join(header, data))
    with pytest.raises(ModelFormatError, match=message):
        wb.load(hf_copy)


def test_bad_shard_index_is_named(tmp_path):
    folder = write_tiny_hf(tmp_path / "hf", shards=2)
    index = folder / "model.safetensors.index.json"
    for weight_map, message in [
        ([1], r"weight_map is a list of 1: not an object"),
        ({"model.norm.weight": 7}, r"shard 7 is not a file name"),
        ({"model.norm.weight": "a\0b"}, r"is not a file name"),
        ({"model.norm.weight": ""}, r"shard '' is not a file name"),
    ]:
        index.write_text(json.dumps({"weight_map": weight_map}))
        with pytest.raises(SafetensorsError, match=message):
            wb.load(folder)
    index.write_bytes(b"\xff\xfe{")
    with pytest.raises(SafetensorsError, match="not valid JSON"):
        wb.load(folder)


def test_config_json_that_is_not_json(hf_copy):
    for blob in (b"\xff\xfe\x00", b"[" * 100_000, b'{"vocab_size": ' + b"9" * 5000 + b"}", b""):
        (hf_copy / "config.json").write_bytes(blob)
        with pytest.raises(ModelFormatError, match=r"config\.json: not valid JSON"):
            wb.load(hf_copy)


@pytest.mark.parametrize(
    "doc, message",
    [
        ([], r"tokenizer_config\.json: is a list of 0, not a JSON object"),
        ({"add_bos_token": "no"}, r"add_bos_token is 'no': not true or false"),
    ],
)
def test_bad_tokenizer_config_fails_only_the_tokenizer(hf_copy, doc, message):
    (hf_copy / "tokenizer_config.json").write_text(json.dumps(doc))
    model = wb.load(hf_copy)
    with pytest.raises(TokenizerDataError, match=message):
        _ = model.tokenizer


def _tokenizer_json(folder, vocab, added=()):
    (folder / "tokenizer.model").unlink(missing_ok=True)
    doc = {"model": {"type": "BPE", "vocab": vocab, "merges": []}, "added_tokens": list(added)}
    (folder / "tokenizer.json").write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "vocab, added, message",
    [
        ({"<pad>": 0, "a": 10**12}, (), r"model\.vocab\['a'\] is 1000000000000: not a token id in 0\.\.1"),
        ({"<pad>": 0, "a": "1"}, (), r"model\.vocab\['a'\] is '1': not a token id"),
        ({"<pad>": 0}, [5], r"added_tokens is a list of 1: not a list of objects"),
        ({"<pad>": 0}, [{"id": 9, "content": "x"}], r"added_tokens\[0\]\.id is 9: above 1"),
        ({"<pad>": 0}, [{"id": 1, "content": 2}], r"added_tokens\[0\]\.content is 2: not a string"),
        ({}, (), r"model\.vocab is .*: empty"),
    ],
)
def test_bad_tokenizer_json_is_named(hf_copy, vocab, added, message):
    _tokenizer_json(hf_copy, vocab, added)
    model = wb.load(hf_copy)
    with pytest.raises(ModelFormatError, match=message):
        _ = model.tokenizer


def test_tokenizer_json_without_byte_pieces_needs_no_byte_fallback(hf_copy):
    """byte_fallback: true in the file, but no byte pieces: loaded without it, as llama.cpp does."""
    tok = wb.load(write_tokenizer_json(hf_copy, vocab_without_bytes())).tokenizer
    assert tok.vocab_size == 300 - 256 and tok.encode("é", add_bos=False)[-1] == tok.unk_id
    assert wb.load(write_tokenizer_json(hf_copy, tiny_vocab())).tokenizer.encode("é", add_bos=False) == [
        201,
        175,
    ]


def test_tokenizer_errors_stay_tokenizer_errors():
    """The data errors are ModelFormatErrors and TokenizerErrors both (callers may catch either)."""
    assert issubclass(TokenizerDataError, ModelFormatError) and issubclass(TokenizerDataError, TokenizerError)
    assert issubclass(SafetensorsError, ModelFormatError) and issubclass(
        ModelFormatError, UnsupportedModelError
    )


def test_numbers_array_rejects_infinite_scores(gguf_parts, tmp_path):
    scores = np.zeros(300, dtype=np.float32)
    scores[7] = np.inf
    path = _with_value(gguf_parts, tmp_path, "tokenizer.ggml.scores", (ARRAY, (F32, scores.tolist())))
    with pytest.raises(ModelFormatError, match="not finite"):
        _ = wb.load(path).tokenizer


# -- the tensor index against the config -------------------------------------------------------------
def _write(parts, tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(parts.to_bytes())
    return path


def test_overlapping_tensors_are_named(gguf_parts, tmp_path):
    i = next(i for i, t in enumerate(gguf_parts.tensors) if t.name == "blk.0.attn_k.weight")
    j = next(i for i, t in enumerate(gguf_parts.tensors) if t.name == "blk.0.attn_v.weight")
    parts = gguf_parts.with_tensor(j, offset=gguf_parts.tensors[i].offset)
    with pytest.raises(GGUFError, match=r"m\.gguf: tensors 'blk\.0\.attn_(k|v)\.weight' and .* overlap"):
        wb.load(_write(parts, tmp_path))


def test_tensor_the_config_has_no_place_for(gguf_parts, tmp_path):
    """As llama.cpp: a GGUF tensor outside the config (here a fourth layer's) is refused."""
    i = next(i for i, t in enumerate(gguf_parts.tensors) if t.name == "blk.2.ffn_up.weight")
    parts = gguf_parts.with_tensor(i, name="blk.3.ffn_up.weight")
    with pytest.raises(
        ModelFormatError, match=r"tensor 'blk\.3\.ffn_up\.weight' is not one of the \d+ tensors"
    ):
        wb.load(_write(parts, tmp_path))


def test_an_lm_head_in_the_file_unties_the_embedding(tmp_path):
    config = TINY.with_(tie_embeddings=False)
    model = wb.load(write_tiny_gguf(tmp_path / "untied.gguf", tiny_weights(config), config))
    assert not model.config.tie_embeddings and "output.weight" in model.weights
    assert wb.load(write_tiny_gguf(tmp_path / "tied.gguf")).config.tie_embeddings


def test_nested_arrays_are_capped(gguf_parts, tmp_path):
    payload = struct.pack("<IQ", ARRAY, 5000) + struct.pack("<IQ", U8, 0) * 5000
    with pytest.raises(GGUFError, match="at most 4096 arrays in arrays"):
        wb.load(_write(gguf_parts.with_entry("junk", ARRAY, payload), tmp_path))


def test_config_json_past_its_cap(hf_copy):
    (hf_copy / "config.json").write_bytes(b" " * 2**20 + (hf_copy / "config.json").read_bytes())
    with pytest.raises(ModelFormatError, match=r"config\.json: \d+ bytes, more than the 1048576"):
        wb.load(hf_copy)
