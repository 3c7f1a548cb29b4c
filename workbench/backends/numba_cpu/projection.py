"""``x @ W.T`` for a step's rows and the cpu backend's weights, by the step's rows (docs/backend-cpu.md, the
projections table): up to ``gemv_max_rows`` rows the one-row decode kernels for each row; ``batch_min_rows`` to
``batch_rows`` rows the batched kernels (each weight block decoded once per 8 rows); more rows a BLAS GEMM on
the weights dequantized to float32 (kept in the backend's dense cache while they fit in ``dense_cache_mib``,
else tile by tile), or with ``prefill_gemm`` int8 the Q4_K and Q6_K_I8 weights by the integer GEMM of
:mod:`.gemm_kquant_int8` (activations as int8 per 256 values, one scale each, as llama.cpp's Q8_K)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import numpy as np

from ...quant.planar import fake_quant_rows_int8
from . import batched
from . import gemm_kquant_int8 as gk
from . import matvec as mv
from . import qformats as qf
from .kernel_table import LAYOUT_NAMES
from .weights import CpuWeight

if TYPE_CHECKING:
    from . import CpuBackend

PREFILL_GEMM = ("auto", "int8", "float")  # the tunable prefill_gemm's values
_EMPTY_W = np.zeros((0, 1), np.uint8)
_EMPTY_O = np.zeros((1, 0), np.float32)


def project(b: CpuBackend, x: np.ndarray, ws: list) -> list[np.ndarray]:
    """``x @ W.T`` for each weight object of ``ws`` (weights of the backend, or row subsets of them)."""
    if any(w.fmt == qf.PLANAR_FMT for w in ws):
        return _project_planar(b, x, ws)
    if b.batch_min_rows <= x.shape[0] <= b.batch_rows and all(w.fmt >= 0 for w in ws):
        return _project_rows(b, x, ws)
    if b.prefill_gemm == "int8" and x.shape[0] > b.gemv_max_rows and any(_by_int8(w) for w in ws):
        return _project_int8(b, x, ws)
    if any(w.fmt < 0 for w in ws) or (x.shape[0] > b.gemv_max_rows and len(ws) == 1):
        return [gemm(b, x, w) for w in ws]
    if x.shape[0] > b.gemv_max_rows:
        return _gemm_stacked(b, x, ws)
    outs = [np.empty((x.shape[0], w.rows), np.float32) for w in ws]
    xs = np.empty((x.shape[0], x.shape[1] // 32), np.float32)
    xq, xd = mv.NO_CODES, mv.NO_FLOATS
    if b.levels:
        xq = mv.act_codes(x.shape[0], x.shape[1], b.vnni)
        xd = np.empty_like(xs)
        mv.quantize_rows_i16(x, b.levels, xq, xd, xs)
    else:
        mv.block_sums(x, xs)
    for i in range(0, len(ws), 3):
        mv.matvec3(*_slots(ws[i : i + 3], outs[i : i + 3]), x, b.levels, xq, xd, xs, b.rows_per_task)
    return outs


def checked_prefill_gemm(choice: str) -> str:
    """The tunable ``prefill_gemm``, refused with a clear error when it is not one of PREFILL_GEMM."""
    if choice not in PREFILL_GEMM:
        raise ValueError(f"prefill_gemm must be one of {list(PREFILL_GEMM)}, got {choice!r}")
    return choice


def auto_prefill_gemm(b: CpuBackend) -> str:
    """``prefill_gemm=auto`` for the loaded weights: "float" dequantizes the weights and multiplies the exact
    activations by BLAS; "int8" quantizes the activations per 256 values and multiplies integers
    (:mod:`.gemm_kquant_int8`: faster than BLAS on AVX2, no float copies). int8 on AVX2 hosts where the model's
    float32 weights would not fit ``dense_cache_mib`` (the float path then dequantizes every weight on every
    prompt), else float, so small models keep exact activations (docs/backend-cpu.md#int8-prefill-gemm)."""
    return "int8" if gk.HAS_AVX2 and float_bytes(b) > b.dense_budget else "float"


def float_bytes(b: CpuBackend) -> int:
    """Bytes of the float32 copies of the quantized weights prefill multiplies (prefill's float path): all but
    the token embedding and the LM head, which a prefill applies to its last row only, and the planar
    (re-quantized) variants' weights, which the int8 GEMM does not read."""
    graph = b.model.graph(1)
    skip = {n for op in graph.ops if op.kind == "embed" or op.name == "lm_head" for n in op.weights}
    return sum(
        4 * w.rows * w.cols
        for name, w in b.weights.items()
        if isinstance(w, CpuWeight) and w.fmt >= 0 and name not in skip
    )


def int8_layouts(b: CpuBackend) -> list[str]:
    """The layouts of the backend's weights that the int8 prefill GEMM reads."""
    fmts = {w.fmt for w in b.weights.values() if isinstance(w, CpuWeight) and _by_int8(w)}
    return sorted(LAYOUT_NAMES[f] for f in fmts)


def _project_planar(b: CpuBackend, x: np.ndarray, ws: list) -> list[np.ndarray]:
    """``x @ W.T`` for weights some of which are planar (:mod:`.qformats`): native matvecs for few rows, BLAS
    for many (activations fake-quantized to int8 where the format asks)."""
    outs = []
    for w in ws:
        if not isinstance(w, qf.PlanarWeight):
            outs.extend(project(b, x, [w]))
        elif x.shape[0] > b.gemv_max_rows:
            outs.append(gemm(b, fake_quant_rows_int8(x) if w.format.act8 else x, w))
        else:
            outs.append(w.matvec(np.ascontiguousarray(x, np.float32), b.rows_per_task))
    return outs


def _by_int8(w: CpuWeight) -> bool:
    return gk.supported(w.fmt, w.cols)


def _project_int8(b: CpuBackend, x: np.ndarray, ws: list[CpuWeight]) -> list[np.ndarray]:
    """Q4_K and Q6_K_I8 weights by the int8 GEMM (the activations quantized once for all of them), others
    by BLAS on their float32 rows."""
    q = gk.quantize_activations(x)
    return [gk.gemm(w.fmt, w.data, q, b.rows_per_task) if _by_int8(w) else gemm(b, x, w) for w in ws]


def _slots(ws: list, outs: list) -> list[Any]:
    """The (format, data, units, output) arguments of up to three weights, unused slots empty."""
    slots: list[Any] = []
    for j in range(3):
        slots += (
            [ws[j].fmt, ws[j].data, ws[j].n_units, outs[j]] if j < len(ws) else [0, _EMPTY_W, 0, _EMPTY_O]
        )
    return slots


def _project_rows(b: CpuBackend, x: np.ndarray, ws: list[CpuWeight]) -> list[np.ndarray]:
    """Each weight block decoded once for all rows of ``x`` (batched decode, verification)."""
    n = x.shape[0]
    xp = np.zeros((batched.pad_rows(n), x.shape[1]), np.float32)
    xp[:n] = x
    xq, xd, xs = mv.NO_CODES, mv.NO_FLOATS, mv.NO_FLOATS
    if b.levels:
        xq, xd = np.empty(xp.shape, np.int16), np.empty((len(xp), x.shape[1] // 32), np.float32)
        xs = np.empty_like(xd)
        mv.quantize_rows_i16(xp, b.levels, xq, xd, xs)
    outs = [np.empty((len(xp), w.rows), np.float32) for w in ws]
    for i in range(0, len(ws), 3):
        slots = _slots(ws[i : i + 3], outs[i : i + 3])
        batched.matmul_rows3(*slots, xp, b.levels, xq, xd, xs, b.rows_per_task)
    return [o[:n] for o in outs]


def _gemm_stacked(b: CpuBackend, x: np.ndarray, ws: list[CpuWeight]) -> list[np.ndarray]:
    """Several quantized weights of one input (QKV; gate and up) in one BLAS call on their float32 rows
    stacked in the dense cache: one thread-pool wake-up instead of one per weight, a wider product."""
    key = "+".join(w.name for w in ws)
    dense = b.dense.get(key)
    bounds = list(itertools.accumulate((w.rows for w in ws), initial=0))
    if dense is None and _dense_held(b) + 4 * bounds[-1] * x.shape[1] <= b.dense_budget:
        dense = b.dense[key] = np.empty((bounds[-1], x.shape[1]), np.float32)
        for w, r0 in zip(ws, bounds, strict=False):
            w.dequantize_into(0, dense[r0 : r0 + w.rows])
    if dense is None:
        return [gemm(b, x, w) for w in ws]
    y = x @ dense.T
    return [np.ascontiguousarray(y[:, r0:r1]) for r0, r1 in itertools.pairwise(bounds)]


def _dense_held(b: CpuBackend) -> int:
    return sum(a.nbytes for a in b.dense.values())


def gemm(b: CpuBackend, x: np.ndarray, w: CpuWeight) -> np.ndarray:
    """``x @ W.T`` by BLAS on the float32 rows of ``w`` (from the dense cache, else dequantized tile by tile)."""
    if w.fmt < 0:
        return x @ w.data.T
    dense = b.dense.get(w.name)
    if dense is None and _dense_held(b) + 4 * w.rows * x.shape[1] <= b.dense_budget:
        dense = b.dense[w.name] = np.empty((w.rows, x.shape[1]), np.float32)
        w.dequantize_into(0, dense)
    if dense is not None:
        return x @ dense.T
    out = np.empty((x.shape[0], w.rows), np.float32)
    tile_rows = max(64, (8 << 20) // (4 * x.shape[1]))
    tile = np.empty((tile_rows, x.shape[1]), np.float32)
    for r0 in range(0, w.rows, tile_rows):
        n = min(tile_rows, w.rows - r0)
        w.dequantize_into(r0, tile[:n])
        np.matmul(x, tile[:n].T, out=out[:, r0 : r0 + n])
    return out
