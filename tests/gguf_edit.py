"""Edit GGUF files in tests: a file split into its parts (header counts, metadata entries, tensor index,
data) by the ``gguf`` package's reader, changed, and written back byte for byte.

The split is independent of workbench's own parser, so tests can hand it files it has never seen: a
key's value replaced by one of any GGUF type, a tensor's dimensions or offset changed, the counts in the
header lying.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gguf import GGUFReader

# GGUF value type ids
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR_CODES = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B"}
SCALAR_CODES |= {U64: "<Q", I64: "<q", F64: "<d"}


def gguf_string(text: str | bytes) -> bytes:
    """A GGUF string: u64 length, then the bytes (given as bytes, they need not be UTF-8)."""
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def encode_value(vtype: int, value: Any) -> bytes:
    """The payload of a metadata value of type ``vtype``; an array's value is (element type, items)."""
    if vtype in SCALAR_CODES:
        return struct.pack(SCALAR_CODES[vtype], value)
    if vtype == STRING:
        return gguf_string(value)
    etype, items = value
    return struct.pack("<IQ", etype, len(items)) + b"".join(encode_value(etype, v) for v in items)


@dataclass
class Entry:
    """One metadata key/value: the key, its type id, and the value's bytes as stored."""

    key: str
    vtype: int
    payload: bytes

    def to_bytes(self) -> bytes:
        return gguf_string(self.key) + struct.pack("<I", self.vtype) + self.payload


@dataclass
class TensorEntry:
    """One entry of the tensor index: dimensions in GGUF order (fastest first), type id, data offset."""

    name: str | bytes  # bytes: not necessarily UTF-8
    dims: list[int]
    type: int
    offset: int
    n_dims: int | None = None  # the stored count, when a test makes it lie

    def to_bytes(self) -> bytes:
        n = len(self.dims) if self.n_dims is None else self.n_dims
        dims = b"".join(struct.pack("<Q", d) for d in self.dims)
        return (
            gguf_string(self.name) + struct.pack("<I", n) + dims + struct.pack("<IQ", self.type, self.offset)
        )


@dataclass
class GGUFParts:
    """A GGUF file as parts; :meth:`to_bytes` writes it back (data padded to ``alignment``)."""

    version: int
    entries: list[Entry]
    tensors: list[TensorEntry]
    data: bytes
    alignment: int = 32
    counts: tuple[int | None, int | None] = (None, None)  # (tensors, entries) stored, when lying
    magic: bytes = b"GGUF"

    def head(self) -> bytes:
        """Everything before the padding that precedes the data."""
        n_t = len(self.tensors) if self.counts[0] is None else self.counts[0]
        n_kv = len(self.entries) if self.counts[1] is None else self.counts[1]
        out = self.magic + struct.pack("<IQQ", self.version, n_t, n_kv)
        return (
            out + b"".join(e.to_bytes() for e in self.entries) + b"".join(t.to_bytes() for t in self.tensors)
        )

    def to_bytes(self) -> bytes:
        head = self.head()
        return head + b"\0" * (-len(head) % self.alignment) + self.data

    def regions(self) -> list[tuple[str, int, int]]:
        """(name, start, end) of the header, each metadata entry, each tensor index entry, the padding
        and each tensor's data, in file order."""
        out, pos = [("header", 0, 24)], 24
        for e in self.entries:
            n = len(e.to_bytes())
            out.append((f"metadata {e.key}", pos, pos + n))
            pos += n
        for t in self.tensors:
            n = len(t.to_bytes())
            out.append((f"tensor index {t.name}", pos, pos + n))
            pos += n
        start = pos + (-pos % self.alignment)
        out.append(("padding", pos, start))
        ends = sorted({t.offset for t in self.tensors} | {len(self.data)})
        for t in sorted(self.tensors, key=lambda t: t.offset):
            end = next(e for e in ends if e > t.offset)
            out.append((f"tensor data {t.name}", start + t.offset, start + end))
        return out

    def with_entry(self, key: str, vtype: int | None, payload: bytes = b"") -> GGUFParts:
        """A copy with ``key`` set to (``vtype``, ``payload``), appended if new, or removed when
        ``vtype`` is None."""
        entries = [e for e in self.entries if e.key != key or vtype is not None]
        if vtype is not None:
            new = Entry(key, vtype, payload)
            at = next((i for i, e in enumerate(entries) if e.key == key), None)
            if at is None:
                entries.append(new)
            else:
                entries[at] = new
        return replace(self, entries=entries)

    def with_tensor(self, index: int, **changes: Any) -> GGUFParts:
        tensors = list(self.tensors)
        tensors[index] = replace(tensors[index], **changes)
        return replace(self, tensors=tensors)


def read_parts(path: str | Path) -> GGUFParts:
    """Split a GGUF file into parts; ``read_parts(p).to_bytes()`` equals the file's bytes."""
    blob = Path(path).read_bytes()
    reader = GGUFReader(path)
    entries = []
    for name, f in reader.fields.items():
        if name.startswith("GGUF."):  # the reader's names for the header counts
            continue
        size = sum(int(p.nbytes) for p in f.parts)
        raw = blob[f.offset : f.offset + size]
        key_end = 8 + len(name.encode())
        (vtype,) = struct.unpack_from("<I", raw, key_end)
        entries.append(Entry(name, vtype, raw[key_end + 4 :]))
    tensors = []
    for t in reader.tensors:
        parts = t.field.parts  # name length, name, n_dims, dims, type, offset
        dims = [int(d) for d in parts[3]]
        tensors.append(TensorEntry(t.name, dims, int(parts[4][0]), int(parts[5][0])))
    version = struct.unpack_from("<I", blob, 4)[0]
    alignment = int(reader.alignment)
    return GGUFParts(version, entries, tensors, blob[reader.data_offset :], alignment)


__all__ = [
    "ARRAY",
    "BOOL",
    "F32",
    "F64",
    "I8",
    "I16",
    "I32",
    "I64",
    "SCALAR_CODES",
    "STRING",
    "U8",
    "U16",
    "U32",
    "U64",
    "Entry",
    "GGUFParts",
    "TensorEntry",
    "encode_value",
    "gguf_string",
    "read_parts",
]
