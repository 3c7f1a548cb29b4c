"""Tokenizer vocabularies for written GGUF files: read from a GGUF, saved to and read from a small file,
or generated.

A vocabulary file (gzip-compressed JSON, about 2 MB for Gemma 3's 262,144 tokens) carries the tokens,
scores, token types and special ids exactly as GGUF stores them, so a machine without the bundled model
package (e.g. a GPU host without internet) can still write synthetic models whose tokenizer metadata is
Gemma 3's and that llama.cpp loads like the real files. A *generated* vocabulary (special tokens, Gemma
3's chat markers at their ids, the 256 byte tokens, unused control tokens) serves where neither is at
hand: files load and run at the same speed, but text tokenizes byte by byte.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from . import spm_proto as P
from .errors import TokenizerDataError
from .gguf import GGUFFile
from .gguf_writer import VocabSpec
from .validate import Fields

FORMAT = "workbench-vocab"
VERSION = 1
# Gemma 3's chat markers keep their ids in a generated vocabulary
CHAT_MARKERS = {105: "<start_of_turn>", 106: "<end_of_turn>"}
_TYPES = {P.NORMAL, P.UNKNOWN, P.CONTROL, P.USER_DEFINED, P.UNUSED, P.BYTE}


class VocabFileError(ValueError):
    """A vocabulary file is unreadable or inconsistent (the message names the file, key and value)."""


def gguf_vocab(meta: Mapping[str, Any], source: str) -> VocabSpec:
    """The vocabulary in GGUF ``tokenizer.ggml.*`` metadata, every key checked (a SentencePiece
    ``llama`` model; tokens, scores and types of one length; types known; special ids inside the
    vocabulary). A large token array stays undecoded (a :class:`StringArray`)."""
    f = Fields(meta, source, error=TokenizerDataError)
    model = f.text("tokenizer.ggml.model")
    if model != "llama":
        f.unsupported("tokenizer.ggml.model", model, "this engine supports SentencePiece models ('llama')")
    tokens = f.strings("tokenizer.ggml.tokens")
    n = len(tokens)
    if not n:
        f.fail("tokenizer.ggml.tokens", tokens, "empty")
    scores = f.numbers("tokenizer.ggml.scores", n)
    types = f.numbers("tokenizer.ggml.token_type", n, integers=True)
    bad = np.flatnonzero(~np.isin(types, sorted(_TYPES)))
    if len(bad):
        i = int(bad[0])
        f.fail("tokenizer.ggml.token_type", types, f"token {i} has type {types[i]} (types: {sorted(_TYPES)})")
    ids = {
        k: f.integer(f"tokenizer.ggml.{key}_token_id", default, lo=0, hi=n - 1)
        for k, key, default in (
            ("bos_id", "bos", 2),
            ("eos_id", "eos", 1),
            ("unk_id", "unknown", 3),
            ("pad_id", "padding", 0),
        )
    }
    add_bos = f.flag("tokenizer.ggml.add_bos_token", True)
    return VocabSpec(tokens, scores, types, add_bos=add_bos, **ids)


def vocab_from_gguf(gguf: GGUFFile) -> VocabSpec:
    """The vocabulary stored in a GGUF file's ``tokenizer.ggml.*`` metadata, as lists."""
    v = gguf_vocab(gguf.metadata, str(gguf.path))
    return VocabSpec(
        list(v.tokens),
        np.asarray(v.scores, dtype=np.float32).tolist(),
        np.asarray(v.types).astype(int).tolist(),
        v.bos_id,
        v.eos_id,
        v.unk_id,
        v.pad_id,
        v.add_bos,
    )


def write_vocab_file(vocab: VocabSpec, path: str | Path, source: str = "") -> Path:
    """Write ``vocab`` as a vocabulary file (gzip JSON); ``source`` says where it came from."""
    path = Path(path)
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "source": source,
        "bos_id": vocab.bos_id,
        "eos_id": vocab.eos_id,
        "unk_id": vocab.unk_id,
        "pad_id": vocab.pad_id,
        "add_bos": vocab.add_bos,
        "tokens": list(vocab.tokens),
        "scores": [float(s) for s in vocab.scores],
        "types": [int(t) for t in vocab.types],
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(gzip.compress(json.dumps(doc, ensure_ascii=False).encode("utf-8"), 9))
    tmp.replace(path)
    return path


def read_vocab_file(path: str | Path) -> VocabSpec:
    """Read and check a vocabulary file written by :func:`write_vocab_file`."""
    path = Path(path)
    try:
        doc = json.loads(gzip.decompress(path.read_bytes()).decode("utf-8"))
    except FileNotFoundError:
        raise VocabFileError(f"{path}: no such vocabulary file") from None
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VocabFileError(f"{path}: not a gzip-compressed JSON vocabulary file ({e})") from None
    if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, Mapping) else type(doc).__name__
        raise VocabFileError(f"{path}: 'format' is {got!r}, expected {FORMAT!r}")
    if doc.get("version") != VERSION:
        raise VocabFileError(f"{path}: 'version' is {doc.get('version')!r}, this reader knows {VERSION}")
    tokens, scores, types = (_list(doc, k, path) for k in ("tokens", "scores", "types"))
    n = len(tokens)
    if len(scores) != n or len(types) != n:
        raise VocabFileError(
            f"{path}: 'tokens', 'scores' and 'types' differ in length ({n}, {len(scores)}, {len(types)})"
        )
    for i, t in enumerate(tokens):
        if not isinstance(t, str):
            raise VocabFileError(f"{path}: 'tokens'[{i}] is {t!r}, not a string")
    for i, s in enumerate(scores):
        if isinstance(s, bool) or not isinstance(s, (int, float)):
            raise VocabFileError(f"{path}: 'scores'[{i}] is {s!r}, not a number")
    for i, t in enumerate(types):
        if isinstance(t, bool) or t not in _TYPES:
            raise VocabFileError(f"{path}: 'types'[{i}] is {t!r} (token types are {sorted(_TYPES)})")
    if len(set(tokens)) != n:
        raise VocabFileError(f"{path}: 'tokens' has duplicate entries")
    ids = {}
    for key in ("bos_id", "eos_id", "unk_id", "pad_id"):
        v = doc.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
            raise VocabFileError(f"{path}: {key!r} is {v!r}, not a token id below {n}")
        ids[key] = v
    add_bos = doc.get("add_bos", True)
    if not isinstance(add_bos, bool):
        raise VocabFileError(f"{path}: 'add_bos' is {add_bos!r}, not true or false")
    return VocabSpec(tokens, [float(s) for s in scores], types, add_bos=add_bos, **ids)


def _list(doc: Mapping[str, Any], key: str, path: Path) -> list:
    v = doc.get(key)
    if not isinstance(v, list) or not v:
        raise VocabFileError(f"{path}: {key!r} is missing or not a non-empty list")
    return v


def generated_vocab() -> VocabSpec:
    """A stand-in vocabulary: pad/eos/bos/unk at Gemma 3's ids, its chat markers, 256 byte tokens, '▁'."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"]
    types = [P.CONTROL, P.CONTROL, P.CONTROL, P.UNKNOWN]
    while len(tokens) <= max(CHAT_MARKERS):
        i = len(tokens)
        tokens.append(CHAT_MARKERS.get(i, f"<unused_generated_{i}>"))
        types.append(P.CONTROL)
    tokens += [f"<0x{b:02X}>" for b in range(256)] + ["\u2581"]
    types += [P.BYTE] * 256 + [P.NORMAL]
    scores = [0.0 if t in (P.BYTE, P.NORMAL) else -1000.0 for t in types]
    return VocabSpec(tokens, scores, types)


def fit_vocab(vocab: VocabSpec, size: int) -> VocabSpec:
    """``vocab`` cut or padded (with unused control tokens) to exactly ``size`` tokens."""
    if size <= max(vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.pad_id):
        raise VocabFileError(f"a vocabulary of {size} tokens cannot hold the special token ids")
    tokens, scores, types = list(vocab.tokens[:size]), list(vocab.scores[:size]), list(vocab.types[:size])
    for i in range(len(tokens), size):
        tokens.append(f"<unused_synthetic_{i}>")
        scores.append(-1000.0)
        types.append(P.CONTROL)
    return VocabSpec(
        tokens, scores, types, vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.pad_id, vocab.add_bos
    )


__all__ = [
    "VocabFileError",
    "fit_vocab",
    "generated_vocab",
    "gguf_vocab",
    "read_vocab_file",
    "vocab_from_gguf",
    "write_vocab_file",
]
