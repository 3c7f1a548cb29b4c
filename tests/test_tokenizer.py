"""Tokenizer: llama.cpp's ids on varied text, special tokens, streaming decode, chat template, HF sources."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workbench.models.gguf import GGUFFile
from workbench.models.tokenizer import Tokenizer, TokenizerError


@pytest.fixture(scope="module")
def tok(default_model):
    return default_model.tokenizer


@pytest.mark.parametrize("name", ["english", "code", "unicode_emoji", "numbers", "whitespace"])
def test_ids_equal_llama_cpp(tok, llama_reference, name):
    text = llama_reference["test_strings"][name]
    assert tok.encode(text, add_bos=False) == llama_reference["tokenize_no_bos"][name]
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("name", ["plain", "chat"])
def test_prompts_with_bos_and_specials(tok, llama_reference, name):
    p = llama_reference["prompts"][name]
    assert tok.encode(p["text"]) == p["ids"]


def test_special_tokens_recognized_only_when_asked(tok):
    ids = tok.encode("<start_of_turn>user\nhi<end_of_turn>", add_bos=False)
    assert ids[0] == 105 and 106 in ids
    plain = tok.encode("<start_of_turn>", add_bos=False, special=False)
    assert 105 not in plain and len(plain) > 1


def test_control_tokens_decode_to_nothing(tok):
    assert tok.decode([2, 818, 106]) == "The"
    assert tok.stop_ids == {1, 106}


def test_streaming_decode_never_splits_characters(tok):
    text = "Café 東京 🚀👨‍👩‍👧 𓀀ꙮ done"
    ids = tok.encode(text, add_bos=False)
    assert any(tok.sp.is_byte(i) for i in ids), "the text should exercise byte-fallback tokens"
    dec = tok.stream()
    pieces = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_chat_template(tok):
    prompt = Tokenizer.chat_prompt("What is 2+2?")
    assert prompt == "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"},
    ]
    text = Tokenizer.chat_prompt(msgs)
    assert text.startswith("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello")
    with pytest.raises(TokenizerError, match="role"):
        Tokenizer.chat_prompt([{"role": "robot", "content": "x"}])


def test_out_of_range_id(tok):
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.token_bytes(10**7)


def test_from_tokenizer_model_and_json(default_model, tok, tmp_path, llama_reference):
    """A tokenizer.model written from the GGUF, and a tokenizer.json, give the same ids."""
    (tmp_path / "tokenizer.model").write_bytes(tok.sp.serialized_model_proto())
    from_model = Tokenizer.from_hf_dir(tmp_path)
    # a tokenizer.json in Hugging Face's format, built from the same vocabulary
    vocab = {tok.sp.id_to_piece(i): i for i in range(tok.vocab_size)}
    added = [
        {"id": i, "content": tok.sp.id_to_piece(i), "special": bool(tok.sp.is_control(i))}
        for i in range(tok.vocab_size)
        if tok.sp.is_control(i)
    ]
    types = GGUFFile(default_model.source).metadata["tokenizer.ggml.token_type"]
    added += [
        {"id": int(i), "content": tok.sp.id_to_piece(int(i)).replace("\u2581", " "), "special": False}
        for i in np.flatnonzero(types == 4)
    ]  # user-defined pieces
    json_dir = tmp_path / "j"
    json_dir.mkdir()
    (json_dir / "tokenizer.json").write_text(
        json.dumps(
            {
                "model": {
                    "type": "BPE",
                    "vocab": vocab,
                    "merges": [],
                    "unk_token": "<unk>",
                    "byte_fallback": True,
                },
                "added_tokens": added,
            }
        )
    )
    from_json = Tokenizer.from_hf_dir(json_dir)
    for name, text in llama_reference["test_strings"].items():
        expected = llama_reference["tokenize_no_bos"][name]
        assert from_model.encode(text, add_bos=False) == expected, name
        assert from_json.encode(text, add_bos=False) == expected, name
    assert from_json.encode("<start_of_turn>user\n")[:2] == [2, 105]


def test_missing_tokenizer(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer"):
        Tokenizer.from_hf_dir(tmp_path)
    (tmp_path / "tokenizer.model").write_bytes(b"not a proto")
    with pytest.raises(TokenizerError, match="invalid sentencepiece"):
        Tokenizer.from_hf_dir(tmp_path)
