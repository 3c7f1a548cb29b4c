"""Hugging Face model directories: ``config.json`` + ``model.safetensors`` (or a sharded index).

Gemma 3 (``hf_config``) and Gemma 3n (``gemma3n_hf``, chosen by the config's ``model_type``) are read;
tensors get their GGUF names.

Files are memory-mapped and tensors are read when first used. The safetensors header is validated
before use: its size, JSON, dtypes, shapes and data offsets must agree with the file, so a lying header
raises :class:`SafetensorsError` instead of reading out of bounds.
"""

from __future__ import annotations

import itertools
import math
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..quant.formats import GGMLType
from . import gemma3n, gemma3n_hf
from .config import ModelConfig
from .errors import ModelFormatError
from .gemma3 import layer_of
from .hf_config import config_from_hf
from .validate import Fields, is_int, parse_json, read_json, show
from .weights import QTensor

MAX_HEADER_BYTES = 100 * 1024 * 1024
# JSON files are parsed whole (~25x their bytes at worst): caps far above real ones (a Gemma 3 config.json
# is ~2 KB, the 27B's index ~100 KB)
MAX_CONFIG_BYTES = 2**20
MAX_INDEX_BYTES = 16 * 2**20
_DTYPES = {"F32": (GGMLType.F32, 4), "F16": (GGMLType.F16, 2), "BF16": (GGMLType.BF16, 2)}


class SafetensorsError(ModelFormatError):
    """A safetensors file or index is invalid (the message says which and why)."""


def _entry(name: str, e: Any, data_size: int, path: Path) -> tuple[str, list[int], int, int]:
    """(dtype, shape, start, end) of one header entry, each checked: integers, a known dtype, and a
    byte range inside the data section that holds exactly the shape's values."""
    if not isinstance(e, dict):
        raise SafetensorsError(f"{path}: header entry {name!r} is malformed (not an object)")
    dtype, shape, offsets = e.get("dtype"), e.get("shape"), e.get("data_offsets")
    if not isinstance(dtype, str) or not isinstance(shape, list) or not isinstance(offsets, list):
        raise SafetensorsError(f"{path}: header entry {name!r} is malformed (dtype, shape or data_offsets)")
    if len(offsets) != 2:
        raise SafetensorsError(f"{path}: header entry {name!r} is malformed ({len(offsets)} data_offsets)")
    if not all(is_int(v) for v in [*shape, *offsets]):
        raise SafetensorsError(f"{path}: header entry {name!r} is malformed (non-integer shape or offsets)")
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise SafetensorsError(f"{path}: tensor {name!r} has dtype {dtype[:60]} (supported: F32, F16, BF16)")
    if any(d < 0 for d in shape):
        raise SafetensorsError(f"{path}: tensor {name!r} has a negative dimension {shape}")
    lo, hi = offsets
    nbytes = math.prod(shape) * _DTYPES[dtype][1]
    if not 0 <= lo <= hi <= data_size or hi - lo != nbytes:
        raise SafetensorsError(
            f"{path}: tensor {name!r} claims bytes {lo}..{hi} for shape {show(shape)} {dtype} "
            f"({nbytes} bytes) but the data section has {data_size} bytes: the header lies"
        )
    return dtype, shape, lo, hi


def read_header(path: Path) -> tuple[dict[str, tuple[str, list[int], int, int]], int, int]:
    """({name: (dtype, shape, start, end)}, data start offset, file size) of one safetensors file,
    validated; offsets are relative to the data start."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise SafetensorsError(f"{path}: too short to be a safetensors file ({size} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise SafetensorsError(f"{path}: header length {n} is impossible for a file of {size} bytes")
            raw = f.read(n)
    except OSError as e:
        raise SafetensorsError(f"{path}: cannot be read ({e.strerror or e})") from None
    header = parse_json(raw, f"{path}: header", SafetensorsError)
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    header.pop("__metadata__", None)
    start, data_size = 8 + n, size - 8 - n
    entries = {name: _entry(name, e, data_size, path) for name, e in header.items()}
    spans = sorted((lo, hi, name) for name, (_, _, lo, hi) in entries.items())
    for (_lo1, hi1, n1), (lo2, _, n2) in itertools.pairwise(spans):
        if lo2 < hi1:
            raise SafetensorsError(f"{path}: tensors {n1!r} and {n2!r} overlap in the file")
    return entries, start, size


# Hugging Face Gemma 3 names -> GGUF names; True where the tensor is an RMSNorm weight (stored as w, used as 1+w)
_LAYER_MAP = {
    "self_attn.q_proj.weight": ("attn_q.weight", False),
    "self_attn.k_proj.weight": ("attn_k.weight", False),
    "self_attn.v_proj.weight": ("attn_v.weight", False),
    "self_attn.o_proj.weight": ("attn_output.weight", False),
    "self_attn.q_norm.weight": ("attn_q_norm.weight", True),
    "self_attn.k_norm.weight": ("attn_k_norm.weight", True),
    "input_layernorm.weight": ("attn_norm.weight", True),
    "post_attention_layernorm.weight": ("post_attention_norm.weight", True),
    "pre_feedforward_layernorm.weight": ("ffn_norm.weight", True),
    "post_feedforward_layernorm.weight": ("post_ffw_norm.weight", True),
    "mlp.gate_proj.weight": ("ffn_gate.weight", False),
    "mlp.up_proj.weight": ("ffn_up.weight", False),
    "mlp.down_proj.weight": ("ffn_down.weight", False),
}
_TOP_MAP = {
    "embed_tokens.weight": ("token_embd.weight", False),
    "norm.weight": ("output_norm.weight", True),
}
_PREFIX = re.compile(r"^(?:model\.language_model\.|language_model\.model\.|model\.)")
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


def gguf_name(hf_name: str) -> tuple[str, bool] | None:
    """(GGUF name, is-norm) of a Hugging Face tensor name, or None for tensors the text model does not use.

    Text weights are named ``model.*`` (``Gemma3ForCausalLM``), ``language_model.model.*`` (the Hub's
    ``Gemma3ForConditionalGeneration`` files) or ``model.language_model.*`` (as newer transformers save
    it); the vision tower and projector are not used.
    """
    if hf_name in ("lm_head.weight", "language_model.lm_head.weight"):
        return "output.weight", False
    name = _PREFIX.sub("", hf_name)
    if name in _TOP_MAP:
        return _TOP_MAP[name]
    m = _LAYER.match(name)
    if m and m.group(2) in _LAYER_MAP:
        target, is_norm = _LAYER_MAP[m.group(2)]
        return f"blk.{m.group(1)}.{target}", is_norm
    return None


def _shard_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        doc = read_json(index, MAX_INDEX_BYTES, SafetensorsError)
        if not isinstance(doc, dict):
            raise SafetensorsError(f"{index}: is {show(doc)}, not a JSON object")
        weight_map = Fields(doc, str(index), error=SafetensorsError).section("weight_map").values
        for f in weight_map.values():
            if not isinstance(f, str) or not f or "\0" in f:
                raise SafetensorsError(f"{index}: shard {show(f)} is not a file name")
        files = []
        for f in dict.fromkeys(weight_map.values()):
            p = (path / f).resolve()
            if p.parent != path.resolve():
                raise SafetensorsError(f"{index}: shard {f!r} is outside the model directory")
            if not p.is_file():
                raise SafetensorsError(f"{index}: shard {f!r} is missing")
            files.append(p)
        return files
    single = path / "model.safetensors"
    if single.exists():
        return [single]
    found = sorted(path.glob("*.safetensors"))
    if not found:
        raise SafetensorsError(f"{path}: no model.safetensors, index or *.safetensors files")
    return found


class _Entry(NamedTuple):
    """A text tensor found in a safetensors file."""

    hf_name: str
    file: Path
    qtype: GGMLType
    shape: tuple[int, ...]
    loader: Callable[[], np.ndarray]
    is_norm: bool


def _loader(mm: np.memmap, lo: int, hi: int):
    return lambda: mm[lo:hi]


def _mapped(hf_name: str, is_3n: bool) -> tuple[str, bool, int | None] | None:
    """(GGUF name, is-norm-stored-as-w, part of a stacked tensor) of a tensor name, None when unused."""
    if is_3n:
        m = gemma3n_hf.gguf_name(hf_name)
        return None if m is None else (m[0], False, m[1])
    m = gguf_name(hf_name)
    return None if m is None else (m[0], m[1], None)


def _stack(name: str, parts: dict[int, _Entry]) -> _Entry:
    """One tensor of the parts GGUF stacks (Gemma 3n's AltUp projections): parts 0..k-1, alike."""
    first = parts[min(parts)]
    if sorted(parts) != list(range(len(parts))):
        raise SafetensorsError(
            f"{first.file}: {name!r} is stacked from parts {sorted(parts)}; expected 0..{len(parts) - 1}"
        )
    for p in parts.values():
        if (p.qtype, p.shape) != (first.qtype, first.shape):
            raise SafetensorsError(
                f"{p.file}: tensor {p.hf_name!r} is {p.qtype.name} {list(p.shape)}, unlike "
                f"{first.hf_name!r} ({first.qtype.name} {list(first.shape)}) stacked with it into {name!r}"
            )
    loaders = [parts[k].loader for k in range(len(parts))]

    def load() -> np.ndarray:
        return np.concatenate([np.asarray(f()).reshape(-1) for f in loaders])

    hf = re.sub(r"\.0\.weight$", ".*.weight", parts[0].hf_name)
    return _Entry(hf, first.file, first.qtype, (len(parts), *first.shape), load, False)


def load_hf_dir(path: str | Path) -> tuple[ModelConfig, dict[str, QTensor]]:
    """Config and lazily loaded tensors (GGUF names) of a Hugging Face Gemma 3 or Gemma 3n directory."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise ModelFormatError(f"{path}: no config.json (not a Hugging Face model directory)")
    cfg = read_json(cfg_file, MAX_CONFIG_BYTES)
    if not isinstance(cfg, dict):
        raise ModelFormatError(f"{cfg_file}: is {show(cfg)}, not a JSON object")
    is_3n = gemma3n_hf.is_gemma3n(cfg)
    found: dict[str, _Entry] = {}
    stacked: dict[str, dict[int, _Entry]] = {}
    for file in _shard_files(path):
        header, start, _ = read_header(file)
        mm = np.memmap(file, dtype=np.uint8, mode="r")
        for hf_name, (dtype, dims, lo, hi) in header.items():
            mapped = _mapped(hf_name, is_3n)
            if mapped is None:
                continue
            name, is_norm, part = mapped
            first = found.get(name) if part is None else stacked.get(name, {}).get(part)
            if first is not None:
                raise SafetensorsError(
                    f"{file}: tensor {hf_name!r} is the text model's {name!r}, and so is "
                    f"{first.hf_name!r} in {first.file.name}"
                )
            shape = tuple(dims) or (1,)
            entry = _Entry(
                hf_name, file, _DTYPES[dtype][0], shape, _loader(mm, start + lo, start + hi), is_norm
            )
            if part is None:
                found[name] = entry
            else:
                stacked.setdefault(name, {})[part] = entry
    found.update({name: _stack(name, parts) for name, parts in stacked.items()})
    shapes = {n: (t.hf_name, t.shape) for n, t in found.items()}
    if is_3n:
        config = gemma3n_hf.config_from_hf(cfg, shapes, str(cfg_file), name=path.name)
        used = set(gemma3n.required_weights(config))  # not the K/V projections of sharing layers
    else:
        config = config_from_hf(cfg, shapes, str(cfg_file), name=path.name)
        used = None
    tensors = {
        n: QTensor(n, t.qtype, t.shape, t.loader, 1.0 if t.is_norm else 0.0)
        for n, t in found.items()
        if (layer_of(n) or 0) < config.n_layers  # layers past the config's count are not run
        and (used is None or n in used)
    }
    return config, tensors
