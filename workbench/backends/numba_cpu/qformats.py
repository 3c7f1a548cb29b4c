"""Native ``cpu`` kernels for the planar formats of :mod:`workbench.quant.planar` (no dequantize-to-f32 on
the decode path).

Decode (a few activation rows) runs a matvec per format directly on the stored planes: fp16/bf16 values
and fp16 group scales are widened in registers (LLVM lowers the conversions to vector instructions), int8
and int4 codes are multiplied with float activations or, for ``+a8`` formats, with activations quantized
per token to int8 (integer dot products, one float scale per row or group). Prefill (many rows) dequantizes
rows into float32 tiles for BLAS, as the GGUF formats do, with the same per-token activation rounding for
``+a8`` formats, so both paths compute the reference semantics.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ...numba_jit import numba
from ...quant.formats import GGMLType
from ...quant.planar import PlanarFormat, PlanarTensor
from .nm import KIND_CODE, PAIR_COMBOS, VALUE_VIEW, matvec_2_4, matvec_nm, pair_codes, pair_table
from .qsimd import make_dot_int4
from .weights import CpuWeight

njit, prange = numba.njit, numba.prange
PLANAR_FMT = 1000  # CpuWeight.fmt of planar weights: above every GGML type id, so GGUF kernels never see it


@intrinsic
def half_to_float(typingctx, bits):
    """IEEE half bits (uint16) -> float32."""

    def codegen(context, b, signature, args):
        return b.fpext(b.bitcast(b.trunc(args[0], ir.IntType(16)), ir.HalfType()), ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def bf16_to_float(typingctx, bits):
    """bfloat16 bits (uint16) -> float32."""

    def codegen(context, b, signature, args):
        wide = b.shl(
            b.zext(b.trunc(args[0], ir.IntType(16)), ir.IntType(32)), ir.Constant(ir.IntType(32), 16)
        )
        return b.bitcast(wide, ir.FloatType())

    return types.float32(bits), codegen


@njit(cache=True)
def _tasks(n, rpt):  # pragma: no cover - compiled
    return (n + rpt - 1) // rpt


@njit(parallel=True, cache=True, fastmath=True)
def matvec_half(q, bf16, x, out, rpt):  # pragma: no cover - compiled
    """out[t, r] = q[r] . x[t] with q fp16 (bf16 when ``bf16``) bits as uint16."""
    n, k = q.shape
    for i in prange(_tasks(n, rpt)):
        for r in range(i * rpt, min(n, (i + 1) * rpt)):
            wr = q[r]
            for t in range(x.shape[0]):
                xr = x[t]
                acc = np.float32(0.0)
                if bf16:
                    for j in range(k):
                        acc += bf16_to_float(wr[j]) * xr[j]
                else:
                    for j in range(k):
                        acc += half_to_float(wr[j]) * xr[j]
                out[t, r] = acc


@njit(parallel=True, cache=True, fastmath=True)
def matvec_int8(q, scale, x, out, rpt):  # pragma: no cover - compiled
    """out[t, r] = scale[r] * (q[r] . x[t]), float activations."""
    n, k = q.shape
    for i in prange(_tasks(n, rpt)):
        for r in range(i * rpt, min(n, (i + 1) * rpt)):
            wr = q[r]
            for t in range(x.shape[0]):
                xr = x[t]
                acc = np.float32(0.0)
                for j in range(k):
                    acc += np.float32(wr[j]) * xr[j]
                out[t, r] = acc * scale[r]


@njit(parallel=True, cache=True, fastmath=True)
def matvec_int8_a8(q, scale, xq, xs, out, rpt):  # pragma: no cover - compiled
    """out[t, r] = scale[r] * xs[t] * (q[r] . xq[t]) with int8 activations, int32 sums."""
    n, k = q.shape
    for i in prange(_tasks(n, rpt)):
        for r in range(i * rpt, min(n, (i + 1) * rpt)):
            wr = q[r]
            for t in range(xq.shape[0]):
                xr = xq[t]
                acc = np.int32(0)
                for j in range(k):
                    acc += np.int32(wr[j]) * np.int32(xr[j])
                out[t, r] = np.float32(acc) * scale[r] * xs[t]


f32_g32s, f32_g32a, f32_g64s, f32_g64a, f32_g128s, f32_g128a = (
    make_dot_int4(g, a, False) for g in (32, 64, 128) for a in (False, True)
)
i8_g32s, i8_g32a, i8_g64s, i8_g64a, i8_g128s, i8_g128a = (
    make_dot_int4(g, a, True) for g in (32, 64, 128) for a in (False, True)
)


@njit(cache=True)
def _int4_row(w, s, z, x, xg, n_groups, group, asym, int8_act):  # pragma: no cover - compiled
    """One row of int4 (addresses) against one activation row: the intrinsic of its group size and kind."""
    if int8_act:
        if group == 32:
            return i8_g32a(w, s, z, x, xg, n_groups) if asym else i8_g32s(w, s, z, x, xg, n_groups)
        if group == 64:
            return i8_g64a(w, s, z, x, xg, n_groups) if asym else i8_g64s(w, s, z, x, xg, n_groups)
        return i8_g128a(w, s, z, x, xg, n_groups) if asym else i8_g128s(w, s, z, x, xg, n_groups)
    if group == 32:
        return f32_g32a(w, s, z, x, xg, n_groups) if asym else f32_g32s(w, s, z, x, xg, n_groups)
    if group == 64:
        return f32_g64a(w, s, z, x, xg, n_groups) if asym else f32_g64s(w, s, z, x, xg, n_groups)
    return f32_g128a(w, s, z, x, xg, n_groups) if asym else f32_g128s(w, s, z, x, xg, n_groups)


@njit(parallel=True, cache=True)
def matvec_int4(q, scale, zero, asym, x, xg, xs, group, int8_act, out, rpt):  # pragma: no cover - compiled
    """Group-wise int4 rows times activation rows ``x`` (float32, or int8 codes with per-row scales ``xs``).

    ``xg[t, g]`` is the sum of x[t] over group g: ``sum(s * (u - z) * x) = s * (sum(u * x) - z * xg)``."""
    n, n_groups = q.shape[0], scale.shape[1]
    for i in prange(_tasks(n, rpt)):
        for r in range(i * rpt, min(n, (i + 1) * rpt)):
            w = q.ctypes.data + r * q.strides[0]
            s = scale.ctypes.data + r * scale.strides[0]
            z = zero.ctypes.data + (r * zero.strides[0] if asym else 0)
            for t in range(x.shape[0]):
                v = _int4_row(w, s, z, x.ctypes.data + t * x.strides[0], xg.ctypes.data + t * xg.strides[0],
                              n_groups, group, asym, int8_act)  # fmt: skip
                out[t, r] = v * xs[t] if int8_act else v


@njit(cache=True, fastmath=True)
def quantize_rows_int8(x, xq, xs):  # pragma: no cover - compiled
    """Per-row int8: xs[t] = max|x[t]| / 127, xq[t] = round(x[t] / xs[t])."""
    for t in range(x.shape[0]):
        amax = np.float32(0.0)
        for j in range(x.shape[1]):
            amax = max(amax, abs(x[t, j]))
        s = amax / np.float32(127.0)
        inv = np.float32(1.0) / s if s > 0 else np.float32(0.0)
        for j in range(x.shape[1]):
            xq[t, j] = np.int8(min(max(np.rint(x[t, j] * inv), -127.0), 127.0))
        xs[t] = s


@njit(cache=True)
def group_sums(x, group, out):  # pragma: no cover - compiled
    for t in range(x.shape[0]):
        for g in range(out.shape[1]):
            s = out.dtype.type(0)
            for j in range(group):
                s += out.dtype.type(x[t, g * group + j])
            out[t, g] = s


class PlanarWeight:
    """A planar weight as the cpu kernels read it (fp16/bf16 as uint16 bits, fp16 group scales as uint16)."""

    def __init__(self, tensor: PlanarTensor):
        p = tensor.planes
        self.name, self.format, self.fmt, self.tensor = tensor.name, tensor.type, PLANAR_FMT, tensor
        kind = tensor.type.kind
        self.q = p["q"].view(np.uint16) if kind in ("fp16", "bf16") else p["q"]
        self.scale = p["scale"].view(np.uint16) if kind == "int4" else p.get("scale")
        self.zero = p.get("zero", np.zeros((1, 1), np.uint8))
        self.cols = tensor.cols

    @property
    def rows(self) -> int:
        return self.q.shape[0]

    def dequantize_into(self, row0: int, out: np.ndarray) -> None:
        out[:] = self.tensor.dequantize_rows(np.arange(row0, row0 + out.shape[0]))

    def gather(self, rows: np.ndarray) -> np.ndarray:
        return self.tensor.dequantize_rows(rows)

    def matvec(self, x: np.ndarray, rpt: int) -> np.ndarray:
        """x (T, cols) @ W.T for a few rows T, natively on the planes."""
        f: PlanarFormat = self.format
        out = np.empty((x.shape[0], self.rows), np.float32)
        if f.kind in ("fp16", "bf16"):
            matvec_half(self.q, f.kind == "bf16", x, out, rpt)
            return out
        if f.act8:
            xq = np.empty(x.shape, np.int8)
            xs = np.empty(x.shape[0], np.float32)
            quantize_rows_int8(x, xq, xs)
            if f.kind == "int8":
                matvec_int8_a8(self.q, self.scale, xq, xs, out, rpt)
            else:
                xg = np.empty((x.shape[0], self.cols // f.group), np.int32)
                group_sums(xq, f.group, xg)
                matvec_int4(
                    self.q, self.scale, self.zero, not f.symmetric, xq, xg, xs, f.group, True, out, rpt
                )
            return out
        if f.kind == "int8":
            matvec_int8(self.q, self.scale, x, out, rpt)
        else:
            xg = np.empty((x.shape[0], self.cols // f.group), np.float32)
            group_sums(x, f.group, xg)
            ones = np.ones(x.shape[0], np.float32)
            matvec_int4(self.q, self.scale, self.zero, not f.symmetric, x, xg, ones, f.group, False, out, rpt)
        return out


class NMWeight(PlanarWeight):
    """A compressed N:M planar weight as the cpu kernels read it."""

    def __init__(self, tensor: PlanarTensor):
        super().__init__(tensor)
        f = tensor.type
        self.n, self.m = f.nm
        self.values = tensor.planes["q"].view(VALUE_VIEW[f.kind])
        self.idx = tensor.planes["idx"]
        self.row_scale = self.scale if f.kind == "int8" else np.ones(self.rows, np.float32)
        self.kind = KIND_CODE[f.kind]
        # the vector kernel: 2:4 rows whose groups pair up
        self.codes = pair_codes(self.idx) if (self.n, self.m) == (2, 4) and self.cols % 8 == 0 else None

    def matvec(self, x: np.ndarray, rpt: int) -> np.ndarray:
        """x (T, cols) @ W.T for a few rows T, reading only the kept values."""
        out = np.empty((x.shape[0], self.rows), np.float32)
        if self.codes is not None:
            tab = np.empty((x.shape[0], self.cols // 8, PAIR_COMBOS, 4), np.float32)
            pair_table(x, tab)
            matvec_2_4(self.kind, self.values, self.codes, self.row_scale, tab, out, rpt)
        else:
            matvec_nm(self.values, self.idx, self.row_scale, x, self.n, self.m, out, rpt)
        return out


def cpu_weight(tensor: PlanarTensor):
    """The cpu backend's view of a planar tensor: fp32 is a plain float32 weight, N:M compressed weights
    :class:`NMWeight`, the others planar."""
    if tensor.type.nm:
        return NMWeight(tensor)
    if tensor.type.kind == "fp32":
        return CpuWeight(tensor.name, GGMLType.F32, -1, np.ascontiguousarray(tensor.planes["q"]), 0)
    return PlanarWeight(tensor)
