"""Weights on the device in a planar layout of their native blocks (no dequantization on the host).

Re-quantized weights (:class:`workbench.quant.planar.PlanarTensor`: fp32/fp16/bf16, int8 per channel, int4
group-wise) are planar already and go up plane by plane.

Each GGUF block field (scales, high bits, quantized values) is gathered into its own contiguous plane, so a
row's quantized values are contiguous and 32-bit aligned for the shaders (``shaders/quant.glsl``); the bits
are those of the file. A tensor larger than the device's ``maxStorageBufferRange`` is split by rows into parts,
each its own buffer; kernels run once per part.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...models.weights import QTensor
from ...quant.formats import FORMATS as BLOCK_FORMATS
from ...quant.formats import GGMLType
from ...quant.planar import PlanarTensor
from ..base import UnsupportedOpError
from .memory import Buffer, Transfers

# byte ranges of each block's fields, in plane order (plane 0 = quantized values)
PLANES: dict[GGMLType, tuple[tuple[int, int], ...]] = {
    GGMLType.Q8_0: ((2, 34), (0, 2)),
    GGMLType.Q5_0: ((6, 22), (2, 6), (0, 2)),
    GGMLType.Q4_K: ((16, 144), (4, 16), (0, 4)),
    GGMLType.Q6_K: ((0, 128), (128, 192), (192, 208), (208, 210)),
}
PLAIN = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
SUPPORTED = (*PLAIN, *PLANES)
ALIGN = 16


def planes_of(raw: np.ndarray, qtype: GGMLType) -> list[np.ndarray]:
    """The planes of ``raw`` (rows, row_bytes) uint8 blocks, each a flat uint8 array."""
    if qtype in PLAIN:
        return [np.ascontiguousarray(raw).reshape(-1)]
    fmt = BLOCK_FORMATS[qtype]
    blocks = raw.reshape(raw.shape[0], -1, fmt.block_bytes)
    return [np.ascontiguousarray(blocks[:, :, a:b]).reshape(-1) for a, b in PLANES[qtype]]


@dataclass
class WeightPart:
    """Rows ``row0 .. row0 + rows`` of a weight in one buffer; ``planes`` are word offsets of each plane."""

    buffer: Buffer
    row0: int
    rows: int
    planes: tuple[int, int, int, int]


@dataclass
class DeviceWeight:
    name: str
    fmt: str  # GGUF type name (Q4_K ...) or the planar format's name (int4-g32 ...)
    rows: int
    cols: int
    parts: list[WeightPart]
    defines: tuple[str, ...] = ()  # shader defines that select the decoder (quant.glsl)
    role: str = "device"  # memory role of its buffers: device (device-local) or host (host-visible)

    @property
    def nbytes(self) -> int:
        return sum(p.buffer.size for p in self.parts)


def _padded(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


PLANAR_PLAIN = {"fp32": "F32", "fp16": "F16", "bf16": "BF16"}


def planar_defines(t: PlanarTensor) -> tuple[str, ...]:
    """Decoder defines of a re-quantized planar weight; a clear error for formats without a shader."""
    f = t.type
    if f.nm:
        raise UnsupportedOpError(
            f"vulkan backend: tensor {t.name!r} is {f.name}: compressed N:M sparse weights have no Vulkan kernel "
            "(the cpu backend runs them; numpy computes them dense)"
        )
    if f.act8:
        raise UnsupportedOpError(
            f"vulkan backend: tensor {t.name!r} is {f.name}: dynamic int8 activations (+a8) have no Vulkan "
            f"kernel; use {f.name.removesuffix('+a8')} (same weights, float activations)"
        )
    if f.kind in PLANAR_PLAIN:
        return (f"FMT_{PLANAR_PLAIN[f.kind]}",)
    if f.kind == "int8":
        return ("FMT_I8",)
    return ("FMT_I4", f"I4_GROUP={f.group}") + (() if f.symmetric else ("I4_ASYM",))


PLANAR_ORDER = ("q", "scale", "zero")


def _planar_planes(t: PlanarTensor, r0: int, r1: int) -> list[np.ndarray]:
    return [
        np.ascontiguousarray(t.planes[k][r0:r1]).reshape(-1).view(np.uint8)
        for k in PLANAR_ORDER
        if k in t.planes
    ]


def _format(t: QTensor | PlanarTensor) -> tuple[str, tuple[str, ...]]:
    """The weight's format name and decoder defines; a clear error for formats without a shader."""
    if isinstance(t, PlanarTensor):
        return t.type.name, planar_defines(t)
    if t.type not in SUPPORTED:
        raise UnsupportedOpError(
            f"vulkan backend: tensor {t.name!r} has type {t.type.name}, which has no Vulkan kernel "
            f"(supported: {', '.join(x.name for x in SUPPORTED)})"
        )
    return t.type.name, (f"FMT_{t.type.name}",)


def _rows_per_part(t: QTensor | PlanarTensor, limit: int) -> int:
    return max(1, (limit - 64 * ALIGN) // t.row_bytes)


def _plane_row_bytes(t: QTensor | PlanarTensor) -> list[int]:
    """Bytes one row adds to each plane (the layout of :func:`planes_of` and the planar planes)."""
    if isinstance(t, PlanarTensor):
        return [t.planes[k].nbytes // t.rows for k in PLANAR_ORDER if k in t.planes]
    if t.type in PLAIN:
        return [t.row_bytes]
    blocks = t.row_bytes // BLOCK_FORMATS[t.type].block_bytes
    return [blocks * (b - a) for a, b in PLANES[t.type]]


def device_bytes(t: QTensor | PlanarTensor, limit: int) -> int:
    """The bytes :func:`upload_weight` will allocate for ``t`` (planes padded, parts of at most ``limit``
    bytes), known before anything is uploaded."""
    _format(t)
    per_row, step = _plane_row_bytes(t), _rows_per_part(t, limit)
    parts = [min(step, t.rows - r0) for r0 in range(0, t.rows, step)]
    return sum(max(16, sum(_padded(n * b) for b in per_row)) for n in parts)


def upload_weight(
    t: QTensor | PlanarTensor, transfers: Transfers, limit: int, role: str = "device"
) -> DeviceWeight:
    """Upload a matrix weight as planar blocks, split into parts of at most ``limit`` bytes, into memory of
    ``role`` (``device`` or ``host``: :class:`.memory.Buffer`)."""
    fmt, defines = _format(t)
    if isinstance(t, PlanarTensor):
        return _upload(t, transfers, limit, fmt, defines, lambda r0, r1: _planar_planes(t, r0, r1), role)
    raw = t.raw
    return _upload(t, transfers, limit, fmt, defines, lambda r0, r1: planes_of(raw[r0:r1], t.type), role)


def _upload(
    t, transfers: Transfers, limit: int, fmt: str, defines: tuple[str, ...], planes_for, role: str
) -> DeviceWeight:
    rows_per_part = _rows_per_part(t, limit)
    parts = []
    for r0 in range(0, t.rows, rows_per_part):
        r1 = min(t.rows, r0 + rows_per_part)
        planes = planes_for(r0, r1)
        offsets, size = [], 0
        for p in planes:
            offsets.append(size)
            size += _padded(p.size)
        buf = Buffer(transfers.dev, size, name=f"{t.name}[{r0}:]", role=role)
        for off, p in zip(offsets, planes):
            transfers.upload(buf, p, off)
        words = tuple(o // 4 for o in offsets) + (0,) * (4 - len(offsets))
        parts.append(WeightPart(buf, r0, r1 - r0, words))  # type: ignore[arg-type]
    return DeviceWeight(t.name, fmt, t.rows, t.cols, parts, defines, role)
