"""A small, fast and defensive GGUF reader: header, metadata, tensor index and memory-mapped tensor data.

Nothing is dequantized or copied at open: tensor data are ``uint8`` views of a read-only memory map, and
the large string arrays of the vocabulary are decoded on first use. Every size read from the file is
checked against the bytes that remain before anything is allocated, so a truncated or hostile file
raises :class:`GGUFError` instead of crashing or allocating a huge buffer.
"""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..quant.formats import GGMLType, UnsupportedQuantError, block_format
from .errors import ModelFormatError

GGUF_MAGIC = b"GGUF"
MAX_DIMS = 4
MAX_ARRAY_DEPTH = 4
# arrays inside arrays in one file: each becomes a Python object ~10x its bytes (models use flat arrays)
MAX_NESTED_ARRAYS = 4096
DEFAULT_ALIGNMENT = 32

# value type id -> (struct code, numpy dtype) for fixed-size scalars
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"),
    1: ("<b", "<i1"),
    2: ("<H", "<u2"),
    3: ("<h", "<i2"),
    4: ("<I", "<u4"),
    5: ("<i", "<i4"),
    6: ("<f", "<f4"),
    7: ("<?", "<u1"),
    10: ("<Q", "<u8"),
    11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}
_STRING, _ARRAY, _BOOL = 8, 9, 7


class GGUFError(ModelFormatError):
    """The file is not a valid GGUF file (the message says where and why)."""


@dataclass(frozen=True, slots=True)  # slots: a hostile index of tiny entries costs less memory
class TensorInfo:
    """One entry of the tensor index. ``shape`` is in numpy order (rows last-dimension-first reversed)."""

    name: str
    type: GGMLType
    shape: tuple[int, ...]
    offset: int  # absolute offset of the first byte in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class StringArray:
    """A metadata array of strings, decoded on first access (the vocabulary has 262k of them)."""

    def __init__(self, buf: memoryview, offsets: np.ndarray, lengths: np.ndarray, where: str):
        # where: "<file>: metadata '<key>'", for error messages
        self._buf, self._offsets, self._lengths, self._where = buf, offsets, lengths, where
        self._decoded: list[str] | None = None

    def __len__(self) -> int:
        return len(self._offsets)

    def _decode_all(self) -> list[str]:
        if self._decoded is None:
            buf, out = self._buf, []
            for i, (o, n) in enumerate(zip(self._offsets.tolist(), self._lengths.tolist())):
                try:
                    out.append(str(buf[o : o + n], "utf-8"))
                except UnicodeDecodeError as e:
                    raise GGUFError(f"{self._where}[{i}] is not valid UTF-8 ({e.reason})") from None
            self._decoded = out
        return self._decoded

    def packed(self) -> memoryview:
        """The stored bytes from the first string to the end of the last (lengths between them): the
        array's identity without decoding it."""
        if not len(self):
            return self._buf[0:0]
        return self._buf[int(self._offsets[0]) : int(self._offsets[-1] + self._lengths[-1])]

    def raw(self, i: int) -> bytes:
        """The undecoded bytes of element ``i``."""
        o, n = int(self._offsets[i]), int(self._lengths[i])
        return bytes(self._buf[o : o + n])

    def __getitem__(self, i):
        return self._decode_all()[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._decode_all())

    def tolist(self) -> list[str]:
        return list(self._decode_all())

    def __repr__(self) -> str:
        return f"StringArray(len={len(self)})"


class _Cursor:
    """Bounds-checked sequential reader over a memoryview."""

    def __init__(self, buf: memoryview, path: str):
        self.buf, self.pos, self.size, self.path = buf, 0, len(buf), path

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(
                f"{self.path}: truncated or corrupt: {what} needs {n} bytes at offset {self.pos}, "
                f"file has {self.size}"
            )

    def scalar(self, code: str, what: str):
        n = struct.calcsize(code)
        self.need(n, what)
        (v,) = struct.unpack_from(code, self.buf, self.pos)
        self.pos += n
        return v

    def string_span(self, what: str) -> tuple[int, int]:
        n = self.scalar("<Q", f"length of {what}")
        self.need(n, what)
        start = self.pos
        self.pos += n
        return start, n

    def string(self, what: str) -> str:
        start, n = self.string_span(what)
        try:
            return str(self.buf[start : start + n], "utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"{self.path}: {what} is not valid UTF-8 ({e.reason})") from None


def _string_spans(cur: _Cursor, count: int, key: str) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and lengths of ``count`` consecutive GGUF strings (a tight loop: the vocabulary is 262k).

    Typed arrays, not lists, hold them: 16 bytes a string however many a hostile count claims (the
    caller bounds the count by the bytes left), where lists would keep two int objects per string.
    """
    unpack, buf, size, pos = struct.Struct("<Q").unpack_from, cur.buf, cur.size, cur.pos
    offsets, lengths = array("q", [0]) * count, array("q", [0]) * count
    for i in range(count):
        if pos + 8 > size:
            cur.pos = pos
            cur.need(8, f"length of {key!r}[{i}]")
        (n,) = unpack(buf, pos)
        pos += 8
        if n > size - pos:  # checked per string: a u64 length may exceed what int64 offsets hold
            raise GGUFError(
                f"{cur.path}: {key!r}[{i}] of {n} bytes runs past the end of the file: truncated or corrupt"
            )
        offsets[i], lengths[i] = pos, n
        pos += n
    cur.pos = pos
    return np.frombuffer(offsets, dtype=np.int64), np.frombuffer(lengths, dtype=np.int64)


class GGUFFile:
    """An opened GGUF file. ``metadata`` maps keys to values; ``tensors`` maps names to :class:`TensorInfo`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as e:
            raise GGUFError(f"{self.path}: cannot open ({e})") from None
        buf = memoryview(self._mm)
        cur = _Cursor(buf, str(self.path))
        cur.need(4, "magic")
        magic = bytes(buf[0:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        cur.pos = 4
        self.version = cur.scalar("<I", "version")
        if self.version not in (2, 3):
            raise GGUFError(
                f"{self.path}: unsupported GGUF version {self.version} (this reader knows 2 and 3)"
            )
        n_tensors = cur.scalar("<Q", "tensor count")
        n_kv = cur.scalar("<Q", "metadata count")
        remaining = cur.size - cur.pos
        if n_kv > remaining // 13:  # smallest entry: 8-byte key length + 1 char + 4-byte type
            raise GGUFError(f"{self.path}: metadata count {n_kv} cannot fit in {remaining} bytes")
        self.metadata: dict[str, Any] = {}
        self._nested_left = MAX_NESTED_ARRAYS
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}")
            vtype = cur.scalar("<I", f"type of {key!r}")
            if key in self.metadata:
                raise GGUFError(f"{self.path}: duplicate metadata key {key!r}")
            self.metadata[key] = self._value(cur, vtype, key, depth=0)
        remaining = cur.size - cur.pos
        if n_tensors > remaining // 24:  # smallest entry: name length + n_dims + type + offset
            raise GGUFError(f"{self.path}: tensor count {n_tensors} cannot fit in {remaining} bytes")
        infos = [self._tensor_info(cur, i) for i in range(n_tensors)]
        align = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise GGUFError(f"{self.path}: general.alignment {align!r} is not a power of two")
        self.alignment = align
        self.data_offset = (cur.pos + align - 1) // align * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, qtype, shape, rel in infos:
            if name in self.tensors:
                raise GGUFError(f"{self.path}: duplicate tensor {name!r}")
            n = math.prod(shape)
            fmt = block_format(qtype, name)
            if shape[-1] % fmt.block_elems:
                raise GGUFError(
                    f"{self.path}: tensor {name!r} of type {qtype.name} has a row of {shape[-1]} values, "
                    f"not a whole number of {fmt.block_elems}-value blocks"
                )
            nbytes = fmt.nbytes(n)
            start = self.data_offset + rel
            if rel % align:
                raise GGUFError(f"{self.path}: tensor {name!r} offset {rel} is not aligned to {align}")
            if start + nbytes > cur.size:
                raise GGUFError(
                    f"{self.path}: tensor {name!r} ({nbytes} bytes at offset {start}) runs past the end "
                    f"of the file ({cur.size} bytes): truncated or corrupt"
                )
            self.tensors[name] = TensorInfo(name, qtype, shape, start, nbytes)
        # tensors must not share bytes: writers never do it, and it would let a small file describe
        # many tensors (each a few hundred bytes of Python objects)
        listed = list(self.tensors.values())
        starts = np.fromiter((t.offset for t in listed), np.int64, len(listed))
        ends = starts + np.fromiter((t.nbytes for t in listed), np.int64, len(listed))
        order = np.argsort(starts, kind="stable")
        overlaps = np.flatnonzero(starts[order][1:] < ends[order][:-1])
        if overlaps.size:
            first, second = (listed[order[overlaps[0] + k]].name for k in (0, 1))
            raise GGUFError(f"{self.path}: tensors {first!r} and {second!r} overlap in the file")

    # -- parsing helpers -------------------------------------------------------------------------
    def _value(self, cur: _Cursor, vtype: int, key: str, depth: int):
        if vtype in _SCALARS:
            v = cur.scalar(_SCALARS[vtype][0], repr(key))
            return bool(v) if vtype == _BOOL else v
        if vtype == _STRING:
            return cur.string(f"metadata {key!r}")
        if vtype == _ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise GGUFError(f"{self.path}: metadata {key!r} nests arrays deeper than {MAX_ARRAY_DEPTH}")
            etype = cur.scalar("<I", f"element type of {key!r}")
            count = cur.scalar("<Q", f"length of {key!r}")
            remaining = cur.size - cur.pos
            if etype in _SCALARS:
                dt = np.dtype(_SCALARS[etype][1])
                if count > remaining // dt.itemsize:
                    raise GGUFError(
                        f"{self.path}: array {key!r} of {count} elements runs past the end of the file"
                    )
                arr = np.frombuffer(cur.buf, dtype=dt, count=count, offset=cur.pos)
                cur.pos += count * dt.itemsize
                return arr.astype(bool) if etype == _BOOL else arr
            if etype == _STRING:
                if count > remaining // 8:
                    raise GGUFError(
                        f"{self.path}: array {key!r} of {count} strings runs past the end of the file"
                    )
                offsets, lengths = _string_spans(cur, count, key)
                strings = StringArray(cur.buf, offsets, lengths, f"{self.path}: metadata {key!r}")
                # small arrays are decoded now, the vocabulary on first use
                return strings.tolist() if count <= 64 else strings
            if etype == _ARRAY:
                if count > remaining // 12:
                    raise GGUFError(
                        f"{self.path}: array {key!r} of {count} arrays runs past the end of the file"
                    )
                if count > self._nested_left:
                    raise GGUFError(
                        f"{self.path}: array {key!r} of {count} arrays: a file may nest at most "
                        f"{MAX_NESTED_ARRAYS} arrays in arrays"
                    )
                self._nested_left -= count
                return [self._value(cur, _ARRAY, f"{key}[{i}]", depth + 1) for i in range(count)]
            raise GGUFError(f"{self.path}: metadata {key!r} has unknown element type {etype}")
        raise GGUFError(f"{self.path}: metadata {key!r} has unknown value type {vtype}")

    def _tensor_info(self, cur: _Cursor, i: int) -> tuple[str, GGMLType, tuple[int, ...], int]:
        name = cur.string(f"name of tensor #{i}")
        n_dims = cur.scalar("<I", f"n_dims of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFError(f"{self.path}: tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        ne = [cur.scalar("<Q", f"dimension of {name!r}") for _ in range(n_dims)]
        total = 1
        for d in ne:
            if d < 1 or d > 1 << 40:
                raise GGUFError(f"{self.path}: tensor {name!r} has an absurd dimension {d}")
            total *= d
        if total > cur.size * 8:  # no format stores more than 8 values per byte... of the whole file
            raise GGUFError(f"{self.path}: tensor {name!r} with {total} values cannot fit in the file")
        type_id = cur.scalar("<I", f"type of {name!r}")
        try:
            qtype = GGMLType(type_id)
            block_format(qtype, name)
        except (ValueError, UnsupportedQuantError):
            raise UnsupportedQuantError(
                f"{self.path}: tensor {name!r} has unknown GGML type id {type_id}"
            ) from None
        rel = cur.scalar("<Q", f"offset of {name!r}")
        return name, qtype, tuple(reversed(ne)), rel

    # -- access ----------------------------------------------------------------------------------
    def tensor_data(self, name: str) -> np.ndarray:
        """Raw bytes of tensor ``name`` as a read-only ``uint8`` view, shape (rows, bytes per row)."""
        info = self.tensors[name]
        flat = self._mm[info.offset : info.offset + info.nbytes]
        rows = info.n_elements // info.shape[-1]
        return flat.reshape(rows, info.nbytes // rows)

    @property
    def size(self) -> int:
        return int(self._mm.size)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: general.architecture is missing")
        return arch

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, {len(self.tensors)} tensors, {len(self.metadata)} keys)"


def arch_key(meta: Mapping[str, Any], arch: str, key: str, default: Any = None) -> Any:
    """``meta[f"{arch}.{key}"]`` or ``default``."""
    return meta.get(f"{arch}.{key}", default)
