"""Planar weight formats made by re-quantization: fp32, fp16, bf16, int8 per-channel, int4 group-wise.

GGUF block formats interleave scales and quantized values inside each block; these formats are *planar*:
every plane is its own contiguous array, rows being output features, so a GPU shader (or a SIMD loop)
reads a row's values with aligned vector loads and its scales from a separate small buffer.

Storage of a (rows, cols) weight, per format name:

* ``fp32``: ``q`` float32 (rows, cols).
* ``fp16``: ``q`` float16 (rows, cols), IEEE half, round to nearest even.
* ``bf16``: ``q`` uint16 (rows, cols), the high half of the float32 bits, round to nearest even.
* ``int8``: ``q`` int8 (rows, cols) in -127..127; ``scale`` float32 (rows,); ``w = scale[r] * q``.
* ``int4-gG`` (symmetric, G = 32, 64 or 128): ``q`` uint8 (rows, cols // 2), two 4-bit codes ``u`` per
  byte; ``scale`` float16 (rows, cols // G); ``w = scale * (u - 8)``. Within group ``j`` of a row (bytes
  ``j*G/2 .. (j+1)*G/2``) byte ``i`` holds value ``j*G + i`` in its low nibble and value ``j*G + G/2 + i``
  in its high nibble (the split-halves order of ggml's Q4_0: the two halves unpack with one mask and one
  shift into contiguous vectors).
* ``int4-gG-asym``: as above plus ``zero`` uint8 (rows, cols // G) in 0..15: ``w = scale * (u - zero)``
  (the range of each group is widened to include 0 so that 0 is exact).

N:M sparse weights (made by pruning, :mod:`workbench.sparsity.nm`) are stored compressed: format
``fp32|fp16|bf16|int8-nmN:M`` holds only the kept values in the value format (``q``, and ``scale`` for
int8) and a plane ``idx`` of 4-bit positions (:mod:`workbench.quant.nm_store`).

A suffix ``+a8`` (int8 and int4 formats) adds *dynamic activation quantization*: the matmul's input is
quantized per token (per row) to int8 with scale ``max|x| / 127`` before the product, so a kernel can
multiply integers; the reference semantics is that rounding followed by the float product
(:func:`fake_quant_rows_int8`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np

from .nm_store import NMError, check_pattern, compress, expand

GROUP_SIZES = (32, 64, 128)
FLOAT_FORMATS = ("fp32", "fp16", "bf16")
NM_KINDS = ("fp32", "fp16", "bf16", "int8")  # value formats of compressed N:M weights
_VALUE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}
_NAME = re.compile(r"^(?:(fp32|fp16|bf16|int8)|int4-g(\d+)(-asym)?)(\+a8)?$")


class FormatError(ValueError):
    """A format name or a weight shape that a format cannot represent."""


@dataclass(frozen=True)
class PlanarFormat:
    """One planar format: ``kind`` fp32/fp16/bf16/int8/int4, ``group`` (int4), ``symmetric``, ``act8``;
    ``nm`` (N, M) for compressed N:M sparse storage."""

    kind: str
    group: int = 0
    symmetric: bool = True
    act8: bool = False
    nm: tuple[int, int] | None = None

    @property
    def name(self) -> str:
        """The format's spelling, e.g. ``int4-g32-asym+a8``, ``fp16-nm2:4`` (what records and op rows show)."""
        base = f"int4-g{self.group}{'' if self.symmetric else '-asym'}" if self.kind == "int4" else self.kind
        sparse = f"-nm{self.nm[0]}:{self.nm[1]}" if self.nm else ""
        return base + sparse + ("+a8" if self.act8 else "")

    @property
    def values(self) -> PlanarFormat:
        """The format of the stored values: this one without N:M compression."""
        return replace(self, nm=None)

    def __str__(self) -> str:
        return self.name

    def row_bytes(self, cols: int) -> int:
        """Bytes of one row across all planes."""
        if self.nm:
            kept = cols // self.nm[1] * self.nm[0]
            return kept * _VALUE_BYTES[self.kind] + kept // 2 + (4 if self.kind == "int8" else 0)
        if self.kind in ("fp16", "bf16"):
            return 2 * cols
        if self.kind == "fp32":
            return 4 * cols
        if self.kind == "int8":
            return cols + 4
        groups = cols // self.group
        return cols // 2 + 2 * groups + (0 if self.symmetric else groups)

    def bits_per_weight(self, cols: int) -> float:
        return 8.0 * self.row_bytes(cols) / cols

    def check_shape(self, shape: tuple[int, ...], what: str = "tensor") -> None:
        if len(shape) != 2:
            raise FormatError(f"{what}: format {self.name} stores matrices, got shape {shape}")
        if self.nm:
            if self.kind not in NM_KINDS or self.act8:
                raise FormatError(
                    f"{what}: {self.name}: N:M storage holds {', '.join(NM_KINDS)} values (no int4, no +a8)"
                )
            try:
                check_pattern(*self.nm, shape[1], what)
            except NMError as e:
                raise FormatError(str(e)) from None
        if self.kind == "int4" and shape[1] % self.group:
            raise FormatError(
                f"{what}: {shape[1]} columns is not a multiple of the group size {self.group} of {self.name}"
            )


def parse_format(text: str) -> PlanarFormat:
    """``fp32``, ``fp16``, ``bf16``, ``int8``, ``int4-g32|64|128[-asym]``, int formats optionally ``+a8``."""
    m = _NAME.match(text.strip().lower())
    if not m:
        raise FormatError(
            f"unknown weight format {text!r}: use fp32, fp16, bf16, int8, int4-g32, int4-g64, int4-g128 "
            "(add -asym for asymmetric int4, +a8 for int8 activations on int8/int4), or native"
        )
    plain, group, asym, act8 = m.groups()
    if plain:
        if act8 and plain != "int8":
            raise FormatError(
                f"format {text!r}: +a8 (int8 activations) applies to int8 and int4 weights only"
            )
        return PlanarFormat(plain, act8=bool(act8))
    g = int(group)
    if g not in GROUP_SIZES:
        raise FormatError(
            f"format {text!r}: invalid group size {g} (use one of {', '.join(map(str, GROUP_SIZES))})"
        )
    return PlanarFormat("int4", g, symmetric=not asym, act8=bool(act8))


# -- quantizers (numpy, float32 in) ---------------------------------------------------------------------
def _to_bf16_bits(w: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(w, np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def _safe_inv(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)


def _quant_int8(w: np.ndarray) -> dict[str, np.ndarray]:
    scale = (np.abs(w).max(axis=1) / np.float32(127.0)).astype(np.float32)
    q = np.clip(np.rint(w * _safe_inv(scale)[:, None]), -127, 127).astype(np.int8)
    return {"q": q, "scale": scale}


def _pack_nibbles(u: np.ndarray, group: int) -> np.ndarray:
    """(rows, cols) codes 0..15 -> (rows, cols // 2) bytes in the split-halves order of each group."""
    rows, cols = u.shape
    g = u.reshape(rows, cols // group, 2, group // 2).astype(np.uint8)
    return (g[:, :, 0, :] | (g[:, :, 1, :] << np.uint8(4))).reshape(rows, cols // 2)


def _unpack_nibbles(q: np.ndarray, group: int) -> np.ndarray:
    rows = q.shape[0]
    b = q.reshape(rows, -1, group // 2)
    return np.stack([b & np.uint8(15), b >> np.uint8(4)], axis=2).reshape(rows, -1)


def _quant_int4(w: np.ndarray, group: int, symmetric: bool) -> dict[str, np.ndarray]:
    rows, cols = w.shape
    g = w.reshape(rows, cols // group, group)
    if symmetric:
        # the value of largest magnitude maps exactly to -8 (ggml's Q4_0 trick: the full -8..7 range is used)
        idx = np.abs(g).argmax(axis=2)[..., None]
        extreme = np.take_along_axis(g, idx, axis=2)[..., 0]
        scale = (extreme / np.float32(-8.0)).astype(np.float16)
        zero = np.full(scale.shape, 8, np.uint8)
    else:
        lo = np.minimum(g.min(axis=2), 0.0)
        hi = np.maximum(g.max(axis=2), 0.0)
        scale = ((hi - lo) / np.float32(15.0)).astype(np.float16)
        zero = np.clip(np.rint(-lo * _safe_inv(scale.astype(np.float32))), 0, 15).astype(np.uint8)
    inv = _safe_inv(scale.astype(np.float32))[..., None]
    u = np.clip(np.rint(g * inv) + zero[..., None], 0, 15).astype(np.uint8)
    planes = {"q": _pack_nibbles(u.reshape(rows, cols), group), "scale": scale}
    if not symmetric:
        planes["zero"] = zero
    return planes


def quantize(w: np.ndarray, fmt: PlanarFormat, what: str = "tensor") -> dict[str, np.ndarray]:
    """The planes of ``w`` (float32, (rows, cols)) in ``fmt``."""
    fmt.check_shape(w.shape, what)
    w = np.ascontiguousarray(w, np.float32)
    if not np.isfinite(w).all():
        raise FormatError(f"{what}: cannot quantize non-finite values")
    if fmt.nm:
        try:
            values, idx = compress(w, *fmt.nm, what)
        except NMError as e:
            raise FormatError(str(e)) from None
        return {**quantize(values, fmt.values, what), "idx": idx}
    if fmt.kind == "fp32":
        return {"q": w}
    if fmt.kind == "fp16":
        return {"q": w.astype(np.float16)}
    if fmt.kind == "bf16":
        return {"q": _to_bf16_bits(w)}
    if fmt.kind == "int8":
        return _quant_int8(w)
    return _quant_int4(w, fmt.group, fmt.symmetric)


def dequantize_planes(planes: dict[str, np.ndarray], fmt: PlanarFormat) -> np.ndarray:
    """Float32 values of (a row selection of) a planar tensor: the format's reference semantics."""
    if fmt.nm:
        values = dequantize_planes({k: v for k, v in planes.items() if k != "idx"}, fmt.values)
        return expand(values, planes["idx"], *fmt.nm)
    q = planes["q"]
    if fmt.kind == "fp32":
        return q.astype(np.float32, copy=False)
    if fmt.kind == "fp16":
        return q.astype(np.float32)
    if fmt.kind == "bf16":
        return (q.astype(np.uint32) << np.uint32(16)).view(np.float32)
    if fmt.kind == "int8":
        return q.astype(np.float32) * planes["scale"][:, None]
    rows = q.shape[0]
    u = _unpack_nibbles(q, fmt.group).reshape(rows, -1, fmt.group).astype(np.float32)
    zero = planes["zero"].astype(np.float32) if "zero" in planes else np.float32(8.0)
    scale = planes["scale"].astype(np.float32)
    return (scale[..., None] * (u - (zero[..., None] if "zero" in planes else zero))).reshape(rows, -1)


def fake_quant_rows_int8(x: np.ndarray) -> np.ndarray:
    """Per-row (per-token) int8 rounding of activations: ``round(x / s) * s`` with ``s = max|x| / 127``."""
    x = x.astype(np.float32, copy=False)
    s = (np.abs(x).max(axis=1, keepdims=True) / np.float32(127.0)).astype(np.float32)
    return (np.clip(np.rint(x * _safe_inv(s)), -127, 127) * s).astype(np.float32)


@dataclass
class PlanarTensor:
    """A weight in a planar format, with the same surface as :class:`workbench.models.weights.QTensor`.

    ``source`` names what it was made from (e.g. ``Q4_K``): when that is itself quantized, the planar
    values carry its error too.
    """

    name: str
    type: PlanarFormat
    shape: tuple[int, ...]
    planes: dict[str, np.ndarray] = field(repr=False)
    source: str = ""
    norm_offset: float = 0.0

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def cols(self) -> int:
        return self.shape[1]

    @property
    def row_bytes(self) -> int:
        return self.type.row_bytes(self.cols)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.planes.values())

    @property
    def n_elements(self) -> int:
        return self.rows * self.cols

    def dequantize(self) -> np.ndarray:
        return dequantize_planes(self.planes, self.type).reshape(self.shape)

    def dequantize_rows(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        return dequantize_planes({k: v[rows] for k, v in self.planes.items()}, self.type)


def matmul_input(tensor, x: np.ndarray) -> np.ndarray:
    """The activation a matmul with ``tensor`` multiplies: int8-rounded per token for ``+a8`` formats."""
    fmt = getattr(tensor, "type", None)
    return fake_quant_rows_int8(x) if isinstance(fmt, PlanarFormat) and fmt.act8 else x


def make_planar(name: str, w: np.ndarray, fmt: PlanarFormat, source: str) -> PlanarTensor:
    return PlanarTensor(name, fmt, tuple(w.shape), quantize(w, fmt, name), source)
