"""Serialize a sentencepiece ``ModelProto`` without the protobuf package (only the fields we set).

Field numbers are those of sentencepiece's ``sentencepiece_model.proto``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

# SentencePiece.Type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
MODEL_BPE = 2


def _varint(n: int) -> bytes:
    if n < 0:
        n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _bytes_field(field: int, data: bytes) -> bytes:
    return _key(field, 2) + _varint(len(data)) + data


def _int_field(field: int, v: int) -> bytes:
    return _key(field, 0) + _varint(int(v))


def _piece(text: str, score: float, ptype: int) -> bytes:
    body = _bytes_field(1, text.encode("utf-8")) + _key(2, 5) + struct.pack("<f", score)
    if ptype != NORMAL:
        body += _int_field(3, ptype)
    return _bytes_field(1, body)


def model_proto(
    pieces: Sequence[str],
    scores: Sequence[float],
    types: Sequence[int],
    *,
    unk_id: int,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    special_pieces: dict[str, str] | None = None,
    byte_fallback: bool = True,
    add_dummy_prefix: bool = False,
) -> bytes:
    """A serialized BPE ModelProto that encodes text the way llama.cpp's SPM tokenizer does.

    ``special_pieces`` names the unk/bos/eos/pad pieces (sentencepiece looks them up by name).
    """
    out = [_piece(p, float(s), int(t)) for p, s, t in zip(pieces, scores, types)]
    trainer = b"".join(
        [
            _int_field(3, MODEL_BPE),
            _int_field(4, len(pieces)),
            _int_field(26, 1),  # allow_whitespace_only_pieces
            _int_field(35, int(byte_fallback)),
            _int_field(40, unk_id),
            _int_field(41, bos_id),
            _int_field(42, eos_id),
            _int_field(43, pad_id),
            # sentencepiece finds bos/eos/unk/pad by these names, not by the ids above
            *(
                _bytes_field(f, (special_pieces or {}).get(k, "").encode("utf-8"))
                for f, k in ((45, "unk"), (46, "bos"), (47, "eos"), (48, "pad"))
                if (special_pieces or {}).get(k)
            ),
        ]
    )
    normalizer = b"".join(
        [
            _bytes_field(1, b"identity"),
            _int_field(3, int(add_dummy_prefix)),
            _int_field(4, 0),  # remove_extra_whitespaces
            _int_field(5, 1),  # escape_whitespaces
        ]
    )
    out.append(_bytes_field(2, trainer))
    out.append(_bytes_field(3, normalizer))
    return b"".join(out)
