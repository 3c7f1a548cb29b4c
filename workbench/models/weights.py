"""Model weights kept in their stored format (GGUF quant blocks, or f32/f16/bf16), loaded lazily."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..quant.dequant import dequantize
from ..quant.formats import FORMATS, GGMLType


class MissingTensorError(KeyError):
    """A tensor the model needs is not in the file."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class QTensor:
    """One weight tensor in its native storage.

    ``shape`` is numpy order (``(rows, cols)`` for matrices, rows being output features). ``raw`` gives
    the stored bytes as ``uint8`` of shape ``(rows, bytes_per_row)``, read on first use (a memory-map
    view for both GGUF and safetensors). ``norm_offset`` is added after dequantization: Hugging Face
    stores RMSNorm weights as ``w`` where the model uses ``1 + w``; GGUF stores ``1 + w`` already.
    """

    name: str
    type: GGMLType
    shape: tuple[int, ...]
    loader: Callable[[], np.ndarray] = field(repr=False)
    norm_offset: float = 0.0
    _raw: np.ndarray | None = field(default=None, repr=False)

    @property
    def raw(self) -> np.ndarray:
        if self._raw is None:
            raw = self.loader()
            expected = (self.rows, self.row_bytes)
            if raw.dtype != np.uint8 or raw.shape != expected:
                raw = np.asarray(raw).view(np.uint8).reshape(expected)
            self._raw = raw
        return self._raw

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1], dtype=np.int64)) if len(self.shape) > 1 else 1

    @property
    def cols(self) -> int:
        return self.shape[-1]

    @property
    def row_bytes(self) -> int:
        return FORMATS[self.type].nbytes(self.cols)

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def n_elements(self) -> int:
        return self.rows * self.cols

    def dequantize(self) -> np.ndarray:
        """All values as float32, in ``shape``."""
        out = dequantize(self.raw, self.type, self.name).reshape(self.shape)
        return out + np.float32(self.norm_offset) if self.norm_offset else out

    def dequantize_rows(self, rows: np.ndarray) -> np.ndarray:
        """Float32 values of the given rows only (embedding lookup without dequantizing the table)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = dequantize(self.raw[rows], self.type, self.name).reshape(len(rows), self.cols)
        return out + np.float32(self.norm_offset) if self.norm_offset else out


class Weights(Mapping[str, QTensor]):
    """Name -> :class:`QTensor`, names in GGUF convention (``blk.3.attn_q.weight``)."""

    def __init__(self, tensors: Mapping[str, QTensor], source: str):
        self._t = dict(tensors)
        self.source = source

    def __getitem__(self, name: str) -> QTensor:
        try:
            return self._t[name]
        except KeyError:
            raise MissingTensorError(f"tensor {name!r} is missing from {self.source}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._t)

    def __len__(self) -> int:
        return len(self._t)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self._t.values())

    def type_table(self) -> dict[str, dict[str, int]]:
        """Per storage type: tensor count, values and bytes."""
        count: Counter[str] = Counter()
        elems: Counter[str] = Counter()
        size: Counter[str] = Counter()
        for t in self._t.values():
            count[t.type.name] += 1
            elems[t.type.name] += t.n_elements
            size[t.type.name] += t.nbytes
        return {k: {"tensors": count[k], "values": elems[k], "bytes": size[k]} for k in sorted(count)}
