"""Variants of the tiny model (tests/tiny.py) for the loader tests: a smaller one for fuzzing, one whose
vocabulary lacks the byte pieces, and a ``tokenizer.json`` in place of ``tokenizer.model``."""

from __future__ import annotations

import json
from pathlib import Path

from tiny import TINY, tiny_vocab, tiny_weights

from workbench.models import spm_proto as P
from workbench.models.gguf_writer import VocabSpec, write_gguf
from workbench.quant.formats import GGMLType

# the tiny model made smaller still (2 layers, hidden 32): a file of about 60 KB, loaded in milliseconds
FUZZ = TINY.with_(name="fuzz", n_layers=2, hidden=32, ffn=64, n_heads=2, n_kv_heads=1, head_dim=16)


def vocab_without_bytes(keep_bytes: int = 0) -> VocabSpec:
    """The tiny vocabulary holding only the byte pieces ``<0x00>`` to ``keep_bytes - 1``."""
    v = tiny_vocab()
    keep = [
        i for i, (p, t) in enumerate(zip(v.tokens, v.types)) if t != P.BYTE or int(p[3:5], 16) < keep_bytes
    ]
    return VocabSpec([v.tokens[i] for i in keep], [v.scores[i] for i in keep], [v.types[i] for i in keep])


def write_gguf_without_bytes(path: Path, keep_bytes: int = 0, config=TINY) -> Path:
    """A tiny GGUF whose vocabulary lacks (some of) the 256 byte pieces, as llama.cpp still loads."""
    vocab = vocab_without_bytes(keep_bytes)
    config = config.with_(vocab_size=len(vocab.tokens))
    weights = {n: (GGMLType.F32, w) for n, w in tiny_weights(config).items()}
    return write_gguf(path, config, weights, vocab)


def tokenizer_json(vocab: VocabSpec) -> dict:
    """A Hugging Face BPE ``tokenizer.json`` of a vocabulary (ids renumbered densely), control pieces
    as special added tokens."""
    vocab_ids = {p: i for i, p in enumerate(vocab.tokens)}
    added = [
        {"id": i, "content": p, "special": True}
        for i, (p, t) in enumerate(zip(vocab.tokens, vocab.types))
        if t == P.CONTROL
    ]
    model = {"type": "BPE", "vocab": vocab_ids, "merges": [], "unk_token": "<unk>", "byte_fallback": True}
    return {"model": model, "added_tokens": added}


def write_tokenizer_json(folder: Path, vocab: VocabSpec) -> Path:
    """Replace a directory's ``tokenizer.model`` by the ``tokenizer.json`` of ``vocab``."""
    (folder / "tokenizer.model").unlink(missing_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(vocab)))
    return folder


__all__ = [
    "FUZZ",
    "tokenizer_json",
    "vocab_without_bytes",
    "write_gguf_without_bytes",
    "write_tokenizer_json",
]
