"""The cpu backend's weight record: a tensor as its kernels read it, in a GGUF block format, a layout the
backend repacked it into at load (:mod:`.layouts`), or float32."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...quant.formats import GGMLType
from . import matvec as mv
from .simd import format_code


@dataclass
class CpuWeight:
    """A weight as the cpu kernels read it: GGUF blocks (``fmt`` = type id), a layout they were repacked
    into at load (``fmt`` = its id in ``simd.REPACKED``, ``type`` the GGUF type) or float32 (``fmt`` = -1)."""

    name: str
    type: GGMLType
    fmt: int
    data: np.ndarray
    n_units: int

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    @property
    def cols(self) -> int:
        return self.n_units * format_code(self.fmt).unit_values if self.fmt >= 0 else self.data.shape[1]

    def dequantize_into(self, row0: int, out: np.ndarray) -> None:
        """Float32 values of rows ``row0 ...`` into ``out`` (quantized formats only)."""
        mv.dequantize_rows(self.fmt, self.data, self.n_units, row0, out)

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """Float32 values of the given rows (embedding lookup)."""
        if self.fmt < 0:
            return self.data[rows]
        out = np.empty((len(rows), self.cols), np.float32)
        mv.dequantize_gather(self.fmt, self.data, self.n_units, rows.astype(np.int64), out)
        return out
