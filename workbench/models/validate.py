"""Checked reads of every value a model loader takes from its files, and the checks between them.

A loader never indexes GGUF metadata or a ``config.json`` object directly: it asks :class:`Fields` for a
value of a type, in a range. A value of the wrong type, out of range or missing raises
:class:`ModelFormatError` naming the file, the key and the value, so bad input ends in one clear error
instead of a ``ZeroDivisionError`` or ``AttributeError`` further on. The checks between values and
tensors (shapes, layer counts) live here too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from .errors import ModelFormatError, UnsupportedModelError
from .gemma3 import highest_layer
from .gguf import StringArray

# dimensions and counts are indexed with int32 by the kernels
MAX_DIM = 2**31 - 1
# the most layers a config may state (Gemma 3 27B has 62): per-layer tables are built from the count
MAX_LAYERS = 1024
_REQUIRED = object()  # default of a key that must be present
_SHOW_CHARS = 60


def show(value: Any) -> str:
    """A short description of a value for an error message (arrays by type and length)."""
    if isinstance(value, np.ndarray):
        return f"an array of {value.size} {value.dtype}"
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        text = repr(value)
    elif isinstance(value, Mapping):
        text = f"an object of {len(value)} keys"
    elif isinstance(value, Sequence) or hasattr(value, "__len__"):
        text = f"a list of {len(value)}"
    else:
        text = type(value).__name__
    return text if len(text) <= _SHOW_CHARS else text[: _SHOW_CHARS - 3] + "..."


def is_int(value: Any) -> bool:
    """An integer of JSON or GGUF (a bool is not one)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_number(value: Any) -> bool:
    return is_int(value) or isinstance(value, (float, np.floating))


class Fields:
    """Typed, range-checked reads of one mapping: GGUF metadata, a ``config.json`` object or a part of it.

    ``source`` names the file in messages; ``prefix`` is prepended to keys in messages (``text_config.``).
    Getters take a ``default`` returned when the key is absent (or, for JSON, null); without one the key
    is required.
    """

    def __init__(
        self,
        values: Mapping[str, Any],
        source: str,
        prefix: str = "",
        error: type[ModelFormatError] = ModelFormatError,
    ):
        self.values, self.source, self.prefix = values, source, prefix
        self.error = error  # the kind of ModelFormatError raised (a tokenizer's, a safetensors file's)

    # -- failures ----------------------------------------------------------------------------------
    def fail(self, key: str, value: Any, why: str) -> NoReturn:
        raise self.error(f"{self.source}: {self.prefix}{key} is {show(value)}: {why}")

    def unsupported(self, key: str, value: Any, why: str) -> NoReturn:
        raise UnsupportedModelError(f"{self.source}: {self.prefix}{key} is {show(value)}: {why}")

    # -- presence ----------------------------------------------------------------------------------
    def has(self, key: str) -> bool:
        """Whether ``key`` has a value (JSON null counts as absent, as transformers reads it)."""
        return self.values.get(key) is not None

    def raw(self, key: str, default: Any = _REQUIRED) -> Any:
        """The value as stored; ``default`` when absent, which fails when no default is given."""
        if self.has(key):
            return self.values[key]
        if default is _REQUIRED:
            raise self.error(f"{self.source}: {self.prefix}{key} is missing")
        return default

    # -- scalars -----------------------------------------------------------------------------------
    def integer(self, key: str, default: Any = _REQUIRED, *, lo: int = 1, hi: int = MAX_DIM) -> int:
        """An integer in ``lo..hi`` (counts and dimensions: 1 to 2^31 - 1 unless told)."""
        if not self.has(key):
            return self.raw(key, default)
        value = self.values[key]
        if not is_int(value) or value < lo:
            self.fail(key, value, "not a positive integer" if lo == 1 else f"not an integer >= {lo}")
        if value > hi:
            self.fail(key, value, f"above {hi}")
        return int(value)

    def number(self, key: str, default: Any = _REQUIRED) -> float:
        """A finite number > 0 (epsilons, RoPE bases and scales, softcaps, scalars: all positive)."""
        if not self.has(key):
            return self.raw(key, default)
        value = self.values[key]
        try:
            ok = is_number(value) and math.isfinite(float(value))
        except OverflowError:  # a JSON integer beyond any float
            ok = False
        if not ok:
            self.fail(key, value, "not a finite number")
        if not value > 0:
            self.fail(key, value, "not positive")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        """True or false (an integer 0/1 is not accepted)."""
        value = self.raw(key, default)
        if not isinstance(value, (bool, np.bool_)):
            self.fail(key, value, "not true or false")
        return bool(value)

    def text(self, key: str, default: Any = _REQUIRED) -> str:
        """A string."""
        if not self.has(key):
            return self.raw(key, default)
        value = self.values[key]
        if not isinstance(value, str):
            self.fail(key, value, "not a string")
        return value

    def choice(self, key: str, default: str, choices: Sequence[str]) -> str:
        """A string among ``choices``: another string is an unsupported model, another type malformed."""
        value = self.text(key, default)
        if value not in choices:
            self.unsupported(key, value, f"this engine supports {', '.join(map(repr, choices))}")
        return value

    # -- containers --------------------------------------------------------------------------------
    def section(self, key: str) -> Fields:
        """A nested object as :class:`Fields` (an absent one reads as empty)."""
        value = self.raw(key, {})
        if not isinstance(value, Mapping):
            self.fail(key, value, "not an object")
        return Fields(value, self.source, f"{self.prefix}{key}.", self.error)

    def sequence(self, key: str, default: Any = _REQUIRED) -> Sequence[Any]:
        """A list (JSON) or array (GGUF); check the elements with :meth:`strings` or :meth:`numbers`."""
        if not self.has(key):
            return self.raw(key, default)
        value = self.values[key]
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__len__"):
            self.fail(key, value, "not a list")
        return value

    def strings(self, key: str, default: Any = _REQUIRED) -> Sequence[str]:
        """A list of strings (GGUF's large string arrays stay undecoded: their type says enough)."""
        if not self.has(key):
            return self.raw(key, default)
        value = self.sequence(key)
        if not isinstance(value, StringArray) and not all(isinstance(s, str) for s in value):
            self.fail(key, value, "not a list of strings")
        return value

    def numbers(self, key: str, length: int, *, integers: bool = False) -> np.ndarray:
        """A GGUF numeric array of ``length`` values (int64 when ``integers``, else finite float32)."""
        value = self.raw(key)
        kinds = "iu" if integers else "iuf"
        if not isinstance(value, np.ndarray) or value.dtype.kind not in kinds:
            self.fail(key, value, f"not an array of {'integers' if integers else 'numbers'}")
        if len(value) != length:
            self.fail(key, value, f"has {len(value)} values, expected {length}")
        if integers:
            return value.astype(np.int64)
        with np.errstate(over="ignore"):  # float64 beyond float32 becomes inf, refused below
            out = value.astype(np.float32)
        if not np.isfinite(out).all():
            self.fail(key, value, "holds values that are not finite float32")
        return out


# -- JSON files ----------------------------------------------------------------------------------
def parse_json(data: bytes, source: str, error: type[ModelFormatError] = ModelFormatError) -> Any:
    """The JSON value of ``data``: bad encoding, syntax, nesting or numbers raise ``error``."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:  # ValueError: JSONDecodeError, UnicodeDecodeError, digits
        raise error(f"{source}: not valid JSON ({e})") from None


def read_json(path: Path, max_bytes: int, error: type[ModelFormatError] = ModelFormatError) -> Any:
    """The JSON value of the file at ``path``, of at most ``max_bytes`` (parsed JSON takes up to ~25x its
    bytes: each file type is capped well above its real sizes); other failures raise ``error``."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise error(f"{path}: {size} bytes, more than the {max_bytes} such a file may have")
        data = path.read_bytes()
    except OSError as e:
        raise error(f"{path}: cannot be read ({e.strerror or e})") from None
    return parse_json(data, str(path), error)


# -- consistency between values and tensors -------------------------------------------------------
Shapes = Mapping[str, tuple[str, tuple[int, ...]]]  # GGUF name -> (name in the file, shape)


def check_shapes(expected: Mapping[str, tuple[int, ...]], shapes: Shapes, source: str) -> None:
    """Every tensor present must have the shape the config gives it (missing ones fail when used)."""
    for name, want in expected.items():
        if name in shapes and tuple(shapes[name][1]) != tuple(want):
            stored, got = shapes[name]
            raise ModelFormatError(
                f"{source}: tensor {stored!r} has shape {list(got)} but the config gives it {list(want)}"
            )


def check_expected(expected: Mapping[str, Any], shapes: Shapes, source: str) -> None:
    """Every tensor must be one the config expects (as llama.cpp, which refuses a GGUF file with others)."""
    extra = sorted(set(shapes) - set(expected))
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise ModelFormatError(
            f"{source}: tensor {shapes[extra[0]][0]!r}{more} is not one of the {len(expected)} tensors of "
            f"this model's config"
        )


def check_layer_count(n_layers: int, names: Iterable[str], key: str, source: str) -> None:
    """A config may run fewer layers than the files hold (as transformers does), never more (a config
    alone, without tensors, may state any count up to ``MAX_LAYERS``)."""
    highest = highest_layer(names)
    if highest is not None and n_layers > highest + 1:
        raise ModelFormatError(f"{source}: {key} = {n_layers} but the files hold layers 0..{highest} only")


__all__ = [
    "MAX_DIM",
    "MAX_LAYERS",
    "Fields",
    "ModelFormatError",
    "Shapes",
    "check_expected",
    "check_layer_count",
    "check_shapes",
    "is_int",
    "is_number",
    "parse_json",
    "read_json",
    "show",
]
