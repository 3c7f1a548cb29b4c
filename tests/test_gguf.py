"""The GGUF reader: fast on the real model, and a clear GGUFError (never a crash) on hostile files."""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest

from workbench.models.gguf import GGUFError, GGUFFile
from workbench.models.registry import default_model_path
from workbench.quant.formats import UnsupportedQuantError


def _s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def _kv_u32(key: str, v: int) -> bytes:
    return _s(key) + struct.pack("<II", 4, v)


def _kv_str(key: str, v: str | bytes) -> bytes:
    return _s(key) + struct.pack("<I", 8) + _s(v)


def _tensor(name: str, dims: list[int], qtype: int, offset: int) -> bytes:
    return (
        _s(name)
        + struct.pack("<I", len(dims))
        + b"".join(struct.pack("<Q", d) for d in dims)
        + struct.pack("<IQ", qtype, offset)
    )


def _file(
    kvs: list[bytes], tensors: list[bytes], data: bytes = b"", n_tensors=None, n_kv=None, magic=b"GGUF"
) -> bytes:
    head = magic + struct.pack(
        "<IQQ", 3, len(tensors) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv
    )
    body = head + b"".join(kvs) + b"".join(tensors)
    body += b"\0" * (-len(body) % 32)
    return body + data


def _write(tmp_path, blob: bytes):
    p = tmp_path / "m.gguf"
    p.write_bytes(blob)
    return p


def _valid(tmp_path):
    data = np.arange(64, dtype=np.float32).tobytes()
    return _write(
        tmp_path,
        _file(
            [_kv_str("general.architecture", "gemma3"), _kv_u32("x.n", 7)],
            [_tensor("t", [16, 4], 0, 0)],
            data,
        ),
    )


def test_valid_small_file(tmp_path):
    g = GGUFFile(_valid(tmp_path))
    assert g.metadata["general.architecture"] == "gemma3" and g.metadata["x.n"] == 7
    info = g.tensors["t"]
    assert info.shape == (4, 16) and info.nbytes == 256
    np.testing.assert_array_equal(g.tensor_data("t").view(np.float32).reshape(-1), np.arange(64))


def test_default_model_opens_fast():
    path = default_model_path()
    GGUFFile(path)  # warm the page cache
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        g = GGUFFile(path)
        times.append(time.perf_counter() - t0)
    assert len(g.tensors) == 236
    assert g.tensors["token_embd.weight"].shape == (262144, 640)
    assert len(g.metadata["tokenizer.ggml.tokens"]) == 262144
    assert sorted(times)[1] < 1.0, times


def test_bad_magic(tmp_path):
    with pytest.raises(GGUFError, match="not a GGUF file"):
        GGUFFile(_write(tmp_path, b"GGML" + b"\0" * 60))


def test_empty_and_truncated_files(tmp_path):
    with pytest.raises(GGUFError):
        GGUFFile(_write(tmp_path, b""))
    blob = _valid(tmp_path).read_bytes()
    for cut in (3, 10, 30, 60, len(blob) - 1):
        with pytest.raises(GGUFError, match=r"truncated|past the end|magic|cannot open"):
            GGUFFile(_write(tmp_path, blob[:cut]))


def test_absurd_counts_do_not_allocate(tmp_path):
    with pytest.raises(GGUFError, match="tensor count"):
        GGUFFile(_write(tmp_path, _file([], [], n_tensors=2**62)))
    with pytest.raises(GGUFError, match="metadata count"):
        GGUFFile(_write(tmp_path, _file([], [], n_kv=2**60)))
    huge_array = _s("a") + struct.pack("<IIQ", 9, 6, 2**61)  # array of 2**61 float32
    with pytest.raises(GGUFError, match="past the end"):
        GGUFFile(_write(tmp_path, _file([huge_array], [])))
    huge_string = _s("k") + struct.pack("<IQ", 8, 2**50)
    with pytest.raises(GGUFError, match="truncated"):
        GGUFFile(_write(tmp_path, _file([huge_string], [])))


def test_absurd_dimensions(tmp_path):
    with pytest.raises(GGUFError, match="absurd dimension"):
        GGUFFile(_write(tmp_path, _file([], [_tensor("t", [2**60, 4], 0, 0)])))
    with pytest.raises(GGUFError, match="dimensions"):
        GGUFFile(_write(tmp_path, _file([], [_tensor("t", [1] * 9, 0, 0)])))
    with pytest.raises(GGUFError, match="cannot fit"):
        GGUFFile(_write(tmp_path, _file([], [_tensor("t", [2**20, 2**20], 0, 0)])))


def test_offset_past_end(tmp_path):
    data = np.zeros(64, np.float32).tobytes()
    with pytest.raises(GGUFError, match="past the end"):
        GGUFFile(_write(tmp_path, _file([], [_tensor("t", [16, 4], 0, 1 << 20)], data)))
    with pytest.raises(GGUFError, match="aligned"):
        GGUFFile(_write(tmp_path, _file([], [_tensor("t", [4], 0, 3)], data)))


def test_unknown_quant_type(tmp_path):
    with pytest.raises(UnsupportedQuantError, match="type id 99"):
        GGUFFile(_write(tmp_path, _file([], [_tensor("t", [32], 99, 0)], b"\0" * 64)))


def test_row_not_whole_blocks(tmp_path):
    with pytest.raises(GGUFError, match="whole number"):
        GGUFFile(_write(tmp_path, _file([], [_tensor("t", [33], 8, 0)], b"\0" * 128)))


def test_non_utf8_metadata(tmp_path):
    with pytest.raises(GGUFError, match="UTF-8"):
        GGUFFile(_write(tmp_path, _file([_kv_str("general.name", b"\xff\xfe bad")], [])))
    with pytest.raises(GGUFError, match="UTF-8"):
        GGUFFile(_write(tmp_path, _file([_s(b"bad\xff") + struct.pack("<II", 4, 1)], [])))


def test_unknown_value_type_and_duplicates(tmp_path):
    with pytest.raises(GGUFError, match="unknown value type"):
        GGUFFile(_write(tmp_path, _file([_s("k") + struct.pack("<I", 77)], [])))
    with pytest.raises(GGUFError, match="duplicate metadata"):
        GGUFFile(_write(tmp_path, _file([_kv_u32("k", 1), _kv_u32("k", 2)], [])))
    with pytest.raises(GGUFError, match="duplicate tensor"):
        GGUFFile(_write(tmp_path, _file([], [_tensor("t", [8], 0, 0), _tensor("t", [8], 0, 32)], b"\0" * 64)))


def test_bad_version_and_alignment(tmp_path):
    blob = bytearray(_valid(tmp_path).read_bytes())
    blob[4:8] = struct.pack("<I", 99)
    with pytest.raises(GGUFError, match="version 99"):
        GGUFFile(_write(tmp_path, bytes(blob)))
    bad_align = _s("general.alignment") + struct.pack("<II", 4, 3)
    with pytest.raises(GGUFError, match="power of two"):
        GGUFFile(_write(tmp_path, _file([bad_align], [])))
