"""The cpu backend's layouts repacked from GGUF blocks at load, for the kernel tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from workbench.backends.numba_cpu import matvec as mv
from workbench.backends.numba_cpu.simd import Q6_K_I8
from workbench.quant.formats import GGMLType
from workbench.quant.repack import q5_0_to_x4, q6_k_to_i8


class Layout(NamedTuple):
    qtype: GGMLType  # the GGUF type it is repacked from
    fmt: int  # its CpuWeight.fmt
    repack: Callable[[np.ndarray], np.ndarray]
    unit_values: int
    unit_bytes: int
    gguf_units: int  # GGUF blocks or superblocks in one of its units


LAYOUTS = {
    "Q6_K_I8": Layout(GGMLType.Q6_K, Q6_K_I8, q6_k_to_i8, 256, 274, 1),
    "Q5_0_X4": Layout(GGMLType.Q5_0, mv.Q5_0_X4, q5_0_to_x4, 128, 88, 4),
}
