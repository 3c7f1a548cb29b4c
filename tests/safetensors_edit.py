"""Edit safetensors files in tests: split into the header object and the data section, and join back."""

from __future__ import annotations

import json
import struct
from typing import Any


def split(blob: bytes) -> tuple[dict[str, Any], bytes]:
    """(header object, data section) of a valid safetensors file's bytes."""
    (n,) = struct.unpack_from("<Q", blob)
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def join(header: dict[str, Any] | bytes, data: bytes) -> bytes:
    """A safetensors file of ``header`` (an object, or raw bytes that need not be JSON) and ``data``."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def regions(blob: bytes) -> list[tuple[str, int, int]]:
    """(name, start, end) of the length prefix, the header and each tensor's data, in file order."""
    header, data = split(blob)
    start = len(blob) - len(data)
    out = [("length", 0, 8), ("header", 8, start)]
    spans = sorted((e["data_offsets"], name) for name, e in header.items() if name != "__metadata__")
    out += [(f"data {name}", start + lo, start + hi) for (lo, hi), name in spans]
    return out


__all__ = ["join", "regions", "split"]
