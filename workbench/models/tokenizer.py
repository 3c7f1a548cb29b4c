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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from ..paths import cache_dir
from . import spm_proto as P
from .errors import TokenizerDataError, TokenizerError
from .gguf import GGUFError, GGUFFile, StringArray
from .gguf_writer import VocabSpec
from .validate import Fields, is_int, read_json, show
from .vocab import gguf_vocab

CHAT_TEMPLATE_NAME = "gemma3"
# caps on the JSON files read whole (Gemma 3's tokenizer_config.json is 1.2 MB, its tokenizer.json 33 MB)
MAX_TOKENIZER_CONFIG_BYTES = 16 * 2**20
MAX_TOKENIZER_JSON_BYTES = 128 * 2**20


class SpecialFinder:
    """Finds special-token pieces in text: leftmost first, the longest piece at a position, non-overlapping
    (what a regex alternation of the pieces, longest first, finds).

    A lookup by first character and length instead of that regex: Gemma's ~6k control pieces make the regex
    take most of a second to compile, paid by every process that encodes text."""

    def __init__(self, pieces: Iterable[str]):
        self._by_first: dict[str, tuple[list[int], set[str]]] = {}
        for piece in pieces:
            if piece:
                lengths, members = self._by_first.setdefault(piece[0], ([], set()))
                members.add(piece)
                if len(piece) not in lengths:
                    lengths.append(len(piece))
        for lengths, _ in self._by_first.values():
            lengths.sort(reverse=True)
        firsts = "".join(sorted(self._by_first))
        self._first_re = re.compile("[" + "".join(re.escape(c) for c in firsts) + "]") if firsts else None

    def finditer(self, text: str) -> Iterator[tuple[int, str]]:
        """(start, piece) of each special piece in ``text``."""
        if self._first_re is None:
            return
        pos = 0
        while (m := self._first_re.search(text, pos)) is not None:
            start = m.start()
            lengths, members = self._by_first[text[start]]
            piece = next(
                (text[start : start + n] for n in lengths if text[start : start + n] in members), None
            )
            if piece is None:
                pos = start + 1
            else:
                yield start, piece
                pos = start + len(piece)


class Tokenizer:
    """Encode text to ids and decode ids to text, with Gemma's special tokens and a streaming decoder."""

    def __init__(
        self,
        sp: spm.SentencePieceProcessor,
        *,
        add_bos: bool = True,
        source: str = "",
        special_ids: Sequence[int] | None = None,
        token_ids: Mapping[str, int] | None = None,
    ):
        """``token_ids`` gives the bos/eos/pad/unk ids where the source states them (GGUF), which
        SentencePiece cannot report when two share a piece; otherwise SentencePiece's are used."""
        self.sp = sp
        self.source = source
        self.add_bos = add_bos
        self.vocab_size = sp.get_piece_size()
        given = token_ids or {}
        self.bos_id = given.get("bos", sp.bos_id())
        self.eos_id = given.get("eos", sp.eos_id())
        self.pad_id = given.get("pad", sp.pad_id())
        self.unk_id = given.get("unk", sp.unk_id())
        if special_ids is None:  # control and unknown pieces (GGUF loading passes them from the token types)
            special_ids = [i for i in range(self.vocab_size) if sp.is_control(i) or sp.is_unknown(i)]
        specials = list(special_ids)
        self._special_ids = {sp.id_to_piece(i): i for i in specials}
        self._special_finder = SpecialFinder(self._special_ids)
        self._bytes_cache: dict[int, bytes] = {}
        self.end_of_turn_id = self._special_ids.get("<end_of_turn>")
        self.start_of_turn_id = self._special_ids.get("<start_of_turn>")

    # -- encoding --------------------------------------------------------------------------------
    def encode(self, text: str, *, add_bos: bool | None = None, special: bool = True) -> list[int]:
        """Token ids of ``text``; special tokens in the text are recognized when ``special``."""
        bos = self.add_bos if add_bos is None else add_bos
        ids: list[int] = [self.bos_id] if bos and self.bos_id >= 0 else []  # -1: the model has no bos
        if not special:
            ids.extend(self.sp.encode(text))
            return ids
        pos = 0
        for start, piece in self._special_finder.finditer(text):
            if start > pos:
                ids.extend(self.sp.encode(text[pos:start]))
            ids.append(self._special_ids[piece])
            pos = start + len(piece)
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
        """From a GGUF file's ``tokenizer.ggml.*`` metadata (the serialized model cached on disk)."""
        source = str(gguf.path)
        vocab = gguf_vocab(gguf.metadata, source)
        space = Fields(gguf.metadata, source, error=TokenizerDataError).flag(
            "tokenizer.ggml.add_space_prefix", False
        )
        types = np.asarray(vocab.types)
        ids = {"bos": vocab.bos_id, "eos": vocab.eos_id, "pad": vocab.pad_id, "unk": vocab.unk_id}
        key = _vocab_key(vocab.tokens, np.asarray(vocab.scores), types, {**ids, "space": space})
        cached = cache_dir("tokenizers") / f"{key}.model"
        if cached.exists():
            sp = _load_proto(cached.read_bytes(), str(cached))
        else:
            proto = _gguf_proto(vocab, space, source)
            sp = _load_proto(proto, source)
            _atomic_write(cached, proto)  # only a model SentencePiece accepts is cached
        specials = np.flatnonzero((types == P.CONTROL) | (types == P.UNKNOWN)).tolist()
        if vocab.unk_id not in specials:
            specials.append(vocab.unk_id)
        return cls(sp, add_bos=vocab.add_bos, source=f"gguf:{gguf.path}", special_ids=specials, token_ids=ids)

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> Tokenizer:
        """From ``tokenizer.model`` (preferred) or ``tokenizer.json`` in a Hugging Face model directory."""
        path = Path(path)
        add_bos = _hf_add_bos(path)
        model_file = path / "tokenizer.model"
        if model_file.exists():
            try:
                proto = model_file.read_bytes()
            except OSError as e:
                raise TokenizerDataError(f"{model_file}: cannot be read ({e.strerror or e})") from None
            sp = _load_proto(proto, str(model_file), check_pieces=True)
            return cls(sp, add_bos=add_bos, source=str(model_file))
        json_file = path / "tokenizer.json"
        if json_file.exists():
            return cls(
                _load_proto(_proto_from_tokenizer_json(json_file), str(json_file)),
                add_bos=add_bos,
                source=str(json_file),
            )
        raise TokenizerDataError(
            f"{path}: no tokenizer.model or tokenizer.json (text generation needs a tokenizer; "
            f"describing the model does not)"
        )


def hf_tokenizer_file(path: str | Path) -> Path | None:
    """The tokenizer file :meth:`Tokenizer.from_hf_dir` would read in ``path``, or None."""
    for name in ("tokenizer.model", "tokenizer.json"):
        if (Path(path) / name).exists():
            return Path(path) / name
    return None


BYTE_PIECES = frozenset(f"<0x{b:02X}>" for b in range(256))


def byte_fallback(pieces: Sequence[str], types: Sequence[int], where: str) -> bool:
    """Whether the vocabulary can fall back to bytes: it holds all 256 byte pieces ``<0x00>``..``<0xFF>``
    (as llama.cpp, a vocabulary without them encodes unknown text as ``<unk>``; a part of them is an
    error: SentencePiece takes all or none)."""
    found = {p for p, t in zip(pieces, types) if t == P.BYTE}
    n_typed = sum(1 for t in types if t == P.BYTE)
    if not n_typed:
        return False
    if found != BYTE_PIECES or n_typed != 256:
        odd = sorted(found - BYTE_PIECES)[:1] or sorted(BYTE_PIECES - found)[:1] or ["a repeated one"]
        raise TokenizerDataError(
            f"{where}: {n_typed} pieces are typed BYTE (byte fallback takes exactly <0x00>..<0xFF>, "
            f"or none); {odd[0]!r} is not as expected"
        )
    return True


class StreamDecoder:
    """Incremental detokenizer: ``push(id)`` returns the text that is now complete."""

    def __init__(self, tok: Tokenizer):
        self._tok = tok
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._dec.decode(self._tok.token_bytes(int(token_id)))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


def _gguf_proto(vocab: VocabSpec, add_space_prefix: bool, source: str) -> bytes:
    """The serialized SentencePiece model of a GGUF vocabulary, with llama.cpp's conventions: the
    unknown piece typed UNKNOWN, spaces of user-defined pieces written as '▁', byte fallback only
    where the 256 byte pieces exist."""
    types = [int(t) for t in vocab.types]
    types[vocab.unk_id] = P.UNKNOWN
    pieces = [p.replace(" ", "\u2581") if t == P.USER_DEFINED else p for p, t in zip(vocab.tokens, types)]
    ids = {"unk": vocab.unk_id, "bos": vocab.bos_id, "eos": vocab.eos_id, "pad": vocab.pad_id}
    return P.model_proto(
        pieces,
        np.asarray(vocab.scores, dtype=np.float32).tolist(),
        types,
        unk_id=vocab.unk_id,
        bos_id=vocab.bos_id,
        eos_id=vocab.eos_id,
        pad_id=vocab.pad_id,
        special_pieces={k: pieces[i] for k, i in ids.items()},
        byte_fallback=byte_fallback(pieces, types, f"{source}: tokenizer.ggml.tokens"),
        add_dummy_prefix=add_space_prefix,
    )


def _load_proto(proto: bytes, where: str, *, check_pieces: bool = False) -> spm.SentencePieceProcessor:
    """A SentencePiece processor of a serialized model. ``check_pieces``: every piece must be UTF-8
    (a model file not written here may hold others, which SentencePiece loads but cannot return)."""
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(proto)
        if check_pieces:
            sp.id_to_piece(list(range(sp.get_piece_size())))
    except (RuntimeError, OSError, UnicodeDecodeError) as e:
        raise TokenizerDataError(f"{where}: invalid sentencepiece model ({e})") from None
    return sp


def _vocab_key(tokens, scores: np.ndarray, types: np.ndarray, ids: dict[str, int]) -> str:
    """The cache key of a GGUF vocabulary's serialized model (``ids`` holds every other setting)."""
    h = hashlib.blake2b(digest_size=16)
    if isinstance(tokens, StringArray):
        h.update(tokens.packed())
    else:
        h.update("\0".join(tokens).encode("utf-8", "surrogatepass"))
    h.update(np.ascontiguousarray(scores, dtype="<f4").tobytes())
    h.update(np.ascontiguousarray(types, dtype="<i4").tobytes())
    h.update(json.dumps(ids, sort_keys=True).encode())
    h.update(b"v3")  # v3: byte fallback only with the byte pieces
    return h.hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + f".tmp{id(data)}")
    tmp.write_bytes(data)
    tmp.replace(path)


def _hf_add_bos(path: Path) -> bool:
    cfg = path / "tokenizer_config.json"
    if not cfg.exists():
        return True
    doc = read_json(cfg, MAX_TOKENIZER_CONFIG_BYTES, TokenizerDataError)
    if not isinstance(doc, dict):
        raise TokenizerDataError(f"{cfg}: is {show(doc)}, not a JSON object")
    return Fields(doc, str(cfg), error=TokenizerDataError).flag("add_bos_token", True)


_BYTE_PIECE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


def _tokenizer_json(path: Path) -> tuple[Fields, dict[str, int], list[Fields]]:
    """(the BPE model's fields, its vocabulary, the added tokens) of a ``tokenizer.json``, checked: ids
    are integers below the number of pieces it names."""
    data = read_json(path, MAX_TOKENIZER_JSON_BYTES, TokenizerDataError)
    if not isinstance(data, dict):
        raise TokenizerDataError(f"{path}: is {show(data)}, not a JSON object")
    top = Fields(data, str(path), error=TokenizerDataError)
    model = top.section("model")
    if model.text("type", "") != "BPE":
        model.unsupported("type", model.values.get("type"), "this engine reads BPE tokenizers only")
    vocab = model.section("vocab").values
    added_raw = top.sequence("added_tokens", [])
    added = [
        Fields(a, str(path), f"added_tokens[{i}].", TokenizerDataError)
        for i, a in enumerate(added_raw)
        if isinstance(a, dict)
    ]
    if len(added) != len(added_raw):
        top.fail("added_tokens", added_raw, "not a list of objects")
    n = len(vocab) + len(added)  # no id may reach past the pieces named: it bounds the table
    if not vocab:
        model.fail("vocab", vocab, "empty")
    for piece, i in vocab.items():
        if not is_int(i) or not 0 <= i < n:
            model.fail(f"vocab[{piece[:40]!r}]", i, f"not a token id in 0..{n - 1}")
    for a in added:
        a.integer("id", lo=0, hi=n - 1)
        a.text("content")
        a.flag("special", False)
    return model, vocab, added


def _proto_from_tokenizer_json(path: Path) -> bytes:
    """Convert a Hugging Face BPE ``tokenizer.json`` (SentencePiece-derived, as Gemma's) to a ModelProto.

    Scores are ``-id`` for normal pieces: Gemma's SentencePiece scores decrease with id, so merge
    priorities are preserved.
    """
    model, vocab, added = _tokenizer_json(path)
    n = max([*vocab.values(), *(a.values["id"] for a in added)]) + 1
    pieces = [""] * n
    for piece, i in vocab.items():
        pieces[i] = piece
    types = [P.NORMAL] * n
    for i, p in enumerate(pieces):
        if _BYTE_PIECE.match(p):
            types[i] = P.BYTE
        elif p == "":
            pieces[i], types[i] = f"<unused_empty_{i}>", P.UNUSED
    for a in added:
        i = a.values["id"]
        pieces[i] = a.values["content"]
        types[i] = P.CONTROL if a.flag("special", False) else P.USER_DEFINED
    unk = vocab.get(model.text("unk_token", "") or "<unk>", 3)
    if unk >= n:
        model.fail("unk_token", model.values.get("unk_token"), f"no piece of it, and id 3 is past {n} pieces")
    types[unk] = P.UNKNOWN
    pieces = [p.replace(" ", "\u2581") if t == P.USER_DEFINED else p for p, t in zip(pieces, types)]
    scores = [0.0 if t == P.BYTE else (-float(i) if t == P.NORMAL else -1000.0) for i, t in enumerate(types)]
    get = {p: vocab.get(p) for p in ("<bos>", "<eos>", "<pad>")}
    fallback = model.flag("byte_fallback", True) and byte_fallback(pieces, types, f"{path}: model.vocab")
    return P.model_proto(
        pieces,
        scores,
        types,
        unk_id=unk,
        bos_id=get["<bos>"] if get["<bos>"] is not None else min(2, n - 1),
        eos_id=get["<eos>"] if get["<eos>"] is not None else min(1, n - 1),
        pad_id=get["<pad>"] if get["<pad>"] is not None else 0,
        special_pieces={"unk": pieces[unk], "bos": "<bos>", "eos": "<eos>", "pad": "<pad>"},
        byte_fallback=fallback,
    )


__all__ = [
    "BYTE_PIECES",
    "GGUFError",
    "StreamDecoder",
    "Tokenizer",
    "TokenizerDataError",
    "TokenizerError",
    "byte_fallback",
    "hf_tokenizer_file",
]
