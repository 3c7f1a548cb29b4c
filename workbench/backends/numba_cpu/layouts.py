"""Which layout each weight gets at load: the GGUF blocks as stored, or a layout repacked for the kernels.

:data:`LAYOUTS` is the policy, one row a repacked layout: the tunable that turns it on, its default (from
the host's features and the other tunables), the weights it applies to, and the repacking. Rows are tried
in order and the first that is on and applies wins; a weight no row takes keeps its GGUF blocks (or, of a
float type, is read as float32). :func:`native_weight` applies the policy to one weight. Figures behind
each default: docs/backend-cpu.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...quant.formats import GGMLType
from ...quant.planar import PlanarTensor
from ...quant.repack import (
    Q5_0_X4_VALUES,
    ROW_GROUP,
    q4_k_to_r16,
    q5_0_to_q8_0,
    q5_0_to_r16,
    q5_0_to_x4,
    q6_k_to_i8,
    q8_0_to_r16,
)
from ..base import UnsupportedOpError
from . import matvec as mv
from . import qformats as qf
from .simd import Q4_K_R16, Q5_0_R16, Q5_0_X4, Q6_K_I8, Q8_0_R16
from .weights import CpuWeight

# the GGUF types whose rows the backend interleaves 16 at a time (interleave_rows): layout, repacking
TO_R16 = {
    GGMLType.Q8_0: (Q8_0_R16, q8_0_to_r16),
    GGMLType.Q5_0: (Q5_0_R16, q5_0_to_r16),
    GGMLType.Q4_K: (Q4_K_R16, q4_k_to_r16),
}


@dataclass(frozen=True)
class Host:
    """What a layout's default depends on: the host's kernels and the activation quantization."""

    wide: bool  # the 512-bit kernels (AVX-512BW host: dot_int16_512bit.py)
    vnni: bool  # the 512-bit kernels and AVX512-VNNI
    act_quant: str  # the backend's act_quant ("int16", "int8", "none")


@dataclass(frozen=True)
class Layout:
    tunable: str  # the backend tunable (and attribute) that turns the layout on
    default: Callable[[Host], bool]
    # whether it applies to a weight (the tensor; whether its rows may be interleaved: not those of sparse
    # ops, which read single rows)
    applies: Callable[[Any, bool], bool]
    repack: Callable[[str, Any], CpuWeight]  # (name, tensor) -> the weight in the layout


def _to_r16(name: str, qt) -> CpuWeight:
    fmt, repack = TO_R16[qt.type]
    return CpuWeight(name, qt.type, fmt, repack(qt.raw), mv.units(qt.type, qt.cols))


def _q5_0_as_q8_0(name: str, qt) -> CpuWeight:
    return CpuWeight(
        name, GGMLType.Q8_0, int(GGMLType.Q8_0), q5_0_to_q8_0(qt.raw), mv.units(GGMLType.Q8_0, qt.cols)
    )


def _q5_0_as_x4(name: str, qt) -> CpuWeight:
    return CpuWeight(name, qt.type, Q5_0_X4, q5_0_to_x4(qt.raw), qt.cols // Q5_0_X4_VALUES)


def _q6_k_as_i8(name: str, qt) -> CpuWeight:
    return CpuWeight(name, qt.type, Q6_K_I8, q6_k_to_i8(qt.raw), mv.units(qt.type, qt.cols))


LAYOUTS: tuple[Layout, ...] = (
    # Q8_0, Q5_0 and Q4_K weights (of a multiple of 16 rows) with 16 rows interleaved (Q8_0_R16, Q5_0_R16,
    # Q4_K_R16: dot_int16_interleaved.py), as many bytes, one vpdpwssd per pair of values of 16 rows
    # (figures: docs/backend-cpu.md#rows-interleaved-16-at-a-time). Default: on AVX512-VNNI hosts with int16
    # activations (the int8 and float paths have no interleaved kernels and would read such rows back one by
    # one); never for the weights of sparse ops, which read single rows
    Layout(
        "interleave_rows",
        lambda h: h.act_quant == "int16" and h.vnni,
        lambda qt, rows_ok: rows_ok and qt.type in TO_R16 and qt.rows % ROW_GROUP == 0,
        _to_r16,
    ),
    # Q5_0 weights converted to Q8_0 blocks of the same values (workbench.quant.repack): 55% more bytes, but
    # on AVX2 hosts a Q8_0 block computes in ~2/3 of a Q5_0 block's time (its fifth bits cost a third of the
    # work), and decode's Q5_0 projections are compute-bound. Default: on, except with the 512-bit kernels
    # (dot_int16_512bit.py), whose Q5_0 rows ran as fast as the repacked ones for less to read and hold
    # (figures: docs/backend-cpu.md#512-bit-kernels)
    Layout("q5_0_as_q8_0", lambda h: not h.wide, lambda qt, _: qt.type == GGMLType.Q5_0, _q5_0_as_q8_0),
    # Q5_0 weights regrouped four blocks at a time (Q5_0_X4, workbench.quant.repack; rows of a multiple of
    # 128 values), same bytes, so that the 512-bit kernels read whole blocks in value order (figures:
    # docs/backend-cpu.md#512-bit-kernels). Default: with the 512-bit kernels (q5_0_as_q8_0, when on, wins)
    Layout(
        "q5_0_as_x4",
        lambda h: h.wide,
        lambda qt, _: qt.type == GGMLType.Q5_0 and qt.cols % Q5_0_X4_VALUES == 0,
        _q5_0_as_x4,
    ),
    # Q6_K weights with their codes as int8 (Q6_K_I8): 30% more bytes, the bit planes no longer rebuilt per
    # token (figures: docs/backend-cpu.md#128-bit-kernels)
    Layout("q6_k_as_i8", lambda h: True, lambda qt, _: qt.type == GGMLType.Q6_K, _q6_k_as_i8),
)
LAYOUT_NAMES = tuple(ly.tunable for ly in LAYOUTS)


def layout_defaults(host: Host) -> dict[str, bool]:
    """Each layout's default on this host: tunable -> on."""
    return {ly.tunable: ly.default(host) for ly in LAYOUTS}


def native_weight(
    name: str, qt, on: dict[str, bool], interleave: bool = True, stored: bool = False
) -> CpuWeight:
    """The tensor ``qt`` (named ``name``) in the layout the kernels read: the first layout of :data:`LAYOUTS`
    that is ``on`` and applies, else its GGUF blocks or float32 values (``interleave``: may its rows be
    interleaved; ``stored``: keep the stored blocks, no repacking)."""
    if stored and qt.type in mv.QUANT_TYPES:
        return CpuWeight(name, qt.type, int(qt.type), qt.raw, mv.units(qt.type, qt.cols))
    if isinstance(qt, PlanarTensor):  # re-quantized (workbench.quant.planar): native planar kernels
        return qf.cpu_weight(qt)
    for ly in LAYOUTS:
        if on[ly.tunable] and ly.applies(qt, interleave):
            return ly.repack(name, qt)
    if qt.type in mv.QUANT_TYPES:
        return CpuWeight(name, qt.type, int(qt.type), qt.raw, mv.units(qt.type, qt.cols))
    if qt.type in mv.FLOAT_TYPES:
        data = np.ascontiguousarray(qt.dequantize().reshape(qt.rows, qt.cols), dtype=np.float32)
        return CpuWeight(name, qt.type, -1, data, 0)
    supported = ", ".join(sorted(t.name for t in mv.QUANT_TYPES | mv.FLOAT_TYPES))
    raise UnsupportedOpError(
        f"cpu backend: tensor {name!r} is stored as {qt.type.name}, which has no cpu kernel "
        f"(supported: {supported}); convert the model or use --backend numpy"
    )
