"""Helpers shared by the NPU design and kernel tests."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def build_module() -> ModuleType:
    """``mlir/build.py`` imported as a module."""
    sys.path.insert(0, str(ROOT / "mlir"))
    try:
        import build
    finally:
        sys.path.pop(0)
    return build


def dma_walk(buffer: np.ndarray, dims) -> np.ndarray:
    """The order in which a DMA with access pattern ``dims`` ((size, stride) outermost first, in elements)
    streams ``buffer``."""
    index = np.zeros(1, np.int64)
    for size, stride in dims:
        index = (index[:, None] + stride * np.arange(size)[None, :]).reshape(-1)
    return buffer.reshape(-1)[index]
