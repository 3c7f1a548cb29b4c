"""Gemma 3 tokenizer (SentencePiece BPE with byte fallback) from GGUF metadata or a Hugging Face directory.

From a GGUF file we build a sentencepiece ``ModelProto`` from the token list, scores and types, with two
fixes that make its ids identical to llama.cpp's: ``<unk>`` is marked UNKNOWN, and user-defined pieces
have their spaces written as '▁' (sentencepiece matches them after escaping whitespace). Special tokens
(control and unknown pieces such as ``<start_of_turn>``) are recognized in text before SentencePiece
runs, longest first, as llama.cpp does with ``parse_special``. The serialized proto is cached on disk,
keyed by a hash of the vocabulary, so later loads take a few tens of milliseconds.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from ..paths import cache_dir
from . import spm_proto as P
from .gguf import GGUFError, GGUFFile, StringArray

CHAT_TEMPLATE_NAME = "gemma3"


class TokenizerError(ValueError):
    """The tokenizer data are missing or invalid."""


class Tokenizer:
    """Encode text to ids and decode ids to text, with Gemma's special tokens and a streaming decoder."""

    def __init__(
        self,
        sp: spm.SentencePieceProcessor,
        *,
        add_bos: bool = True,
        source: str = "",
        special_ids: Sequence[int] | None = None,
    ):
        self.sp = sp
        self.source = source
        self.add_bos = add_bos
        self.vocab_size = sp.get_piece_size()
        self.bos_id = sp.bos_id()
        self.eos_id = sp.eos_id()
        self.pad_id = sp.pad_id()
        self.unk_id = sp.unk_id()
        if special_ids is None:  # control and unknown pieces (GGUF loading passes them from the token types)
            special_ids = [i for i in range(self.vocab_size) if sp.is_control(i) or sp.is_unknown(i)]
        specials = list(special_ids)
        self._special_ids = {sp.id_to_piece(i): i for i in specials}
        pattern = "|".join(re.escape(s) for s in sorted(self._special_ids, key=len, reverse=True) if s)
        self._special_re = re.compile(pattern) if pattern else None
        self._bytes_cache: dict[int, bytes] = {}
        self.end_of_turn_id = self._special_ids.get("<end_of_turn>")
        self.start_of_turn_id = self._special_ids.get("<start_of_turn>")

    # -- encoding --------------------------------------------------------------------------------
    def encode(self, text: str, *, add_bos: bool | None = None, special: bool = True) -> list[int]:
        """Token ids of ``text``; special tokens in the text are recognized when ``special``."""
        ids: list[int] = [self.bos_id] if (self.add_bos if add_bos is None else add_bos) else []
        if not special or self._special_re is None:
            ids.extend(self.sp.encode(text))
            return ids
        pos = 0
        for m in self._special_re.finditer(text):
            if m.start() > pos:
                ids.extend(self.sp.encode(text[pos : m.start()]))
            ids.append(self._special_ids[m.group()])
            pos = m.end()
        if pos < len(text):
            ids.extend(self.sp.encode(text[pos:]))
        return ids

    def special_id(self, piece: str) -> int:
        try:
            return self._special_ids[piece]
        except KeyError:
            raise TokenizerError(f"the vocabulary has no special token {piece!r}") from None

    # -- decoding --------------------------------------------------------------------------------
    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for (control tokens: empty)."""
        b = self._bytes_cache.get(token_id)
        if b is None:
            if not 0 <= token_id < self.vocab_size:
                raise TokenizerError(
                    f"token id {token_id} is outside the vocabulary (0..{self.vocab_size - 1})"
                )
            sp = self.sp
            piece = sp.id_to_piece(token_id)
            if sp.is_byte(token_id):
                b = bytes([int(piece[3:5], 16)])
            elif sp.is_control(token_id) or sp.is_unknown(token_id) or sp.is_unused(token_id):
                b = b""
            else:
                b = piece.replace("\u2581", " ").encode("utf-8")
            self._bytes_cache[token_id] = b
        return b

    def decode(self, ids: Iterable[int]) -> str:
        return b"".join(self.token_bytes(int(i)) for i in ids).decode("utf-8", errors="replace")

    def piece(self, token_id: int) -> str:
        return self.sp.id_to_piece(int(token_id))

    def stream(self) -> StreamDecoder:
        """A decoder that turns tokens into text as they arrive, never splitting a UTF-8 character."""
        return StreamDecoder(self)

    # -- chat ------------------------------------------------------------------------------------
    @staticmethod
    def chat_prompt(messages: Sequence[dict[str, str]] | str, *, add_generation_prompt: bool = True) -> str:
        """Gemma 3 chat template: turns of ``user``/``model``; a system message joins the first user turn."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        out, system = [], ""
        for m in messages:
            role, content = m.get("role"), str(m.get("content", ""))
            if role == "system":
                system += content + "\n\n"
                continue
            if role not in ("user", "assistant", "model"):
                raise TokenizerError(f"chat message role {role!r} is not one of system/user/assistant")
            turn = "model" if role in ("assistant", "model") else "user"
            if turn == "user" and system:
                content, system = system + content, ""
            out.append(f"<start_of_turn>{turn}\n{content.strip()}<end_of_turn>\n")
        if add_generation_prompt:
            out.append("<start_of_turn>model\n")
        return "".join(out)

    @property
    def stop_ids(self) -> frozenset[int]:
        ids = {self.eos_id}
        if self.end_of_turn_id is not None:
            ids.add(self.end_of_turn_id)
        return frozenset(ids)

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> Tokenizer:
        meta = gguf.metadata
        model = meta.get("tokenizer.ggml.model")
        if model != "llama":
            raise TokenizerError(
                f"{gguf.path}: tokenizer model {model!r} is not supported (expected SPM 'llama')"
            )
        tokens = meta.get("tokenizer.ggml.tokens")
        scores = meta.get("tokenizer.ggml.scores")
        types = meta.get("tokenizer.ggml.token_type")
        if tokens is None or scores is None or types is None:
            raise TokenizerError(f"{gguf.path}: tokenizer tokens, scores or token types are missing")
        n = len(tokens)
        if len(scores) != n or len(types) != n:
            raise TokenizerError(
                f"{gguf.path}: tokenizer arrays differ in length ({n}, {len(scores)}, {len(types)})"
            )
        ids = {
            k: int(meta.get(f"tokenizer.ggml.{k}_token_id", d))
            for k, d in (("bos", 2), ("eos", 1), ("unknown", 3), ("padding", 0))
        }
        for k, v in ids.items():
            if not 0 <= v < n:
                raise TokenizerError(f"{gguf.path}: {k} token id {v} is outside the vocabulary of {n}")
        key = _vocab_key(tokens, np.asarray(scores), np.asarray(types), ids)
        cached = cache_dir("tokenizers") / f"{key}.model"
        if cached.exists():
            proto = cached.read_bytes()
        else:
            pieces = tokens.tolist() if isinstance(tokens, StringArray) else list(tokens)
            tlist = [int(t) for t in types]
            tlist[ids["unknown"]] = P.UNKNOWN
            pieces = [p.replace(" ", "\u2581") if t == P.USER_DEFINED else p for p, t in zip(pieces, tlist)]
            proto = P.model_proto(
                pieces,
                np.asarray(scores, dtype=np.float32).tolist(),
                tlist,
                unk_id=ids["unknown"],
                bos_id=ids["bos"],
                eos_id=ids["eos"],
                pad_id=ids["padding"],
                special_pieces={
                    k: pieces[ids[g]]
                    for k, g in (("unk", "unknown"), ("bos", "bos"), ("eos", "eos"), ("pad", "padding"))
                },
                add_dummy_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", False)),
            )
            _atomic_write(cached, proto)
        tarr = np.asarray(types)
        specials = np.flatnonzero((tarr == P.CONTROL) | (tarr == P.UNKNOWN)).tolist()
        if ids["unknown"] not in specials:
            specials.append(ids["unknown"])
        return cls(
            _load_proto(proto, str(gguf.path)),
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", True)),
            source=f"gguf:{gguf.path}",
            special_ids=specials,
        )

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> Tokenizer:
        """From ``tokenizer.model`` (preferred) or ``tokenizer.json`` in a Hugging Face model directory."""
        path = Path(path)
        add_bos = _hf_add_bos(path)
        model_file = path / "tokenizer.model"
        if model_file.exists():
            return cls(
                _load_proto(model_file.read_bytes(), str(model_file)), add_bos=add_bos, source=str(model_file)
            )
        json_file = path / "tokenizer.json"
        if json_file.exists():
            return cls(
                _load_proto(_proto_from_tokenizer_json(json_file), str(json_file)),
                add_bos=add_bos,
                source=str(json_file),
            )
        raise TokenizerError(f"{path}: no tokenizer.model or tokenizer.json")


class StreamDecoder:
    """Incremental detokenizer: ``push(id)`` returns the text that is now complete."""

    def __init__(self, tok: Tokenizer):
        self._tok = tok
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._dec.decode(self._tok.token_bytes(int(token_id)))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


def _load_proto(proto: bytes, where: str) -> spm.SentencePieceProcessor:
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(proto)
    except (RuntimeError, OSError) as e:
        raise TokenizerError(f"{where}: invalid sentencepiece model ({e})") from None
    return sp


def _vocab_key(tokens, scores: np.ndarray, types: np.ndarray, ids: dict[str, int]) -> str:
    h = hashlib.blake2b(digest_size=16)
    if isinstance(tokens, StringArray) and len(tokens):
        first, last = int(tokens._offsets[0]), int(tokens._offsets[-1] + tokens._lengths[-1])
        h.update(tokens._buf[first:last])
    else:
        h.update("\0".join(tokens).encode("utf-8", "surrogatepass"))
    h.update(np.ascontiguousarray(scores, dtype="<f4").tobytes())
    h.update(np.ascontiguousarray(types, dtype="<i4").tobytes())
    h.update(json.dumps(ids, sort_keys=True).encode())
    h.update(b"v2")
    return h.hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + f".tmp{id(data)}")
    tmp.write_bytes(data)
    tmp.replace(path)


def _hf_add_bos(path: Path) -> bool:
    cfg = path / "tokenizer_config.json"
    if cfg.exists():
        try:
            return bool(json.loads(cfg.read_text()).get("add_bos_token", True))
        except json.JSONDecodeError as e:
            raise TokenizerError(f"{cfg}: invalid JSON ({e})") from None
    return True


_BYTE_PIECE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


def _proto_from_tokenizer_json(path: Path) -> bytes:
    """Convert a Hugging Face BPE ``tokenizer.json`` (SentencePiece-derived, as Gemma's) to a ModelProto.

    Scores are ``-id`` for normal pieces: Gemma's SentencePiece scores decrease with id, so merge
    priorities are preserved.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        model = data["model"]
        vocab: dict[str, int] = model["vocab"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise TokenizerError(f"{path}: not a tokenizer.json with a BPE vocabulary ({e})") from None
    if model.get("type") != "BPE":
        raise TokenizerError(
            f"{path}: tokenizer model type {model.get('type')!r} is not supported (BPE only)"
        )
    n = max(vocab.values()) + 1
    pieces = [""] * n
    for piece, i in vocab.items():
        pieces[i] = piece
    types = [P.NORMAL] * n
    for i, p in enumerate(pieces):
        if _BYTE_PIECE.match(p):
            types[i] = P.BYTE
        elif p == "":
            pieces[i], types[i] = f"<unused_empty_{i}>", P.UNUSED
    for added in data.get("added_tokens", []):
        i = int(added["id"])
        if i >= n:
            raise TokenizerError(f"{path}: added token id {i} is outside the vocabulary")
        pieces[i] = added["content"]
        types[i] = P.CONTROL if added.get("special") else P.USER_DEFINED
    unk = vocab.get(model.get("unk_token") or "<unk>", 3)
    types[unk] = P.UNKNOWN
    pieces = [p.replace(" ", "\u2581") if t == P.USER_DEFINED else p for p, t in zip(pieces, types)]
    scores = [0.0 if t == P.BYTE else (-float(i) if t == P.NORMAL else -1000.0) for i, t in enumerate(types)]
    get = {p: vocab.get(p) for p in ("<bos>", "<eos>", "<pad>")}
    return P.model_proto(
        pieces,
        scores,
        types,
        unk_id=unk,
        bos_id=get["<bos>"] if get["<bos>"] is not None else 2,
        eos_id=get["<eos>"] if get["<eos>"] is not None else 1,
        pad_id=get["<pad>"] if get["<pad>"] is not None else 0,
        special_pieces={"unk": pieces[unk], "bos": "<bos>", "eos": "<eos>", "pad": "<pad>"},
        byte_fallback=bool(model.get("byte_fallback", True)),
    )


__all__ = ["GGUFError", "StreamDecoder", "Tokenizer", "TokenizerError"]
