"""Published NPU figures beside the emulator's estimates for the same designs, run the same way.

Each figure names the design it was measured on (tile sizes, dtypes, cores, kernel as its source gives
them), the device (Phoenix ``npu1`` or Hawk Point ``hawkpoint``, whose array runs at 1.6x the clock) and
what its time includes: launch + wait with buffers allocated once (mlir-aie's test harness), or a host
call that allocates, fills and syncs fresh XRT buffers every run (``fresh_buffers``, the mrtib figures'
``NpuKernel.run``), which the estimate then includes (:func:`~workbench.backends.npu.cost.host_buffer_seconds`).
``CALIBRATION`` rows are those a cost-model factor was set against; ``CHECKS`` rows set nothing. Every row
must come out within :data:`TOLERANCE` (a test keeps them there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .arch import AieArray, get_array
from .cost import estimate, host_buffer_seconds
from .schedule import Schedule, gemm_schedule, gemv_schedule

TOLERANCE = 0.25
SRC_OPEN_XDNA = (
    "github.com/Scottcjn/open-xdna RESULTS.md (Ryzen 7 8845HS Hawk Point, mlir-aie 1.3.3 + Peano; mlir-aie "
    "test harness: launch + wait, buffers allocated once)"
)
SRC_TOOLKIT = "github.com/tibrezus/xdna-npu-toolkit iron/results (Ryzen 7 7840HS Phoenix, mlir-aie v1.3.2)"
SRC_MRTIB = "huggingface.co/mrtib/phoenix-npu1-iron-kernels (same designs and runs as the toolkit results)"
FRESH_BUFFERS = (
    "timed per NpuKernel.run: allocate, fill and sync new XRT buffers, launch, wait, sync and copy the output"
)


@dataclass(frozen=True)
class Figure:
    """A published figure, the design it was measured on and whether its time includes fresh buffers."""

    name: str
    device: str
    published: float
    unit: str  # GOPS | us
    source: str
    design: Callable[[AieArray], Schedule]
    ops: float = 0.0  # operations of one run (for GOPS figures)
    fresh_buffers: bool = False
    notes: str = ""

    def estimate(self) -> tuple[float, Schedule, dict]:
        array = get_array(self.device)
        sched = self.design(array)
        sched.check(array)
        est = estimate(sched, array).to_dict()
        host = host_buffer_seconds(sched) if self.fresh_buffers else 0.0
        seconds = est["seconds"] + host
        est.update(host_buffers_s=host, total_s=seconds)
        if host:
            est["how"] += " + modeled host buffers"
            if host > max(est["launch_s"], est["array_s"]):
                est["bound"] = "host buffers"
        value = self.ops / seconds / 1e9 if self.unit == "GOPS" else seconds * 1e6
        return value, sched, est

    def row(self) -> dict:
        value, sched, est = self.estimate()
        return {
            "figure": self.name,
            "device": self.device,
            "published": self.published,
            "estimate": value,
            "unit": self.unit,
            "rel_error": value / self.published - 1.0,
            "source": self.source,
            "how": est["how"],
            "bound": est["bound"],
            "seconds": {k: est[k] for k in ("total_s", "launch_s", "array_s", "host_buffers_s")},
            "design": {"op": sched.op, "tile": dict(sched.tile), "columns": sched.columns, "rows": sched.rows,
                       "dtype_in": sched.dtype_in, "dtype_out": sched.dtype_out, "kernel": sched.kernels[0],
                       "fresh_buffers_each_run": self.fresh_buffers},
            "notes": self.notes,
        }  # fmt: skip


def _single_core(n: int) -> Callable[[AieArray], Schedule]:
    # mlir-aie single_core as both sources built it: 32x32x32 tiles, i16 in, i32 out, B row-major
    return lambda a: gemm_schedule(a, n, n, n, "i16", 32, 32, 32, 1, 1, dtype_out="i32", b_col_maj=False)


def _whole_array(a: AieArray) -> Schedule:
    # mlir-aie whole_array, 512x512x512_64x64x32_4c: 4 columns x 4 rows, i16 in, i32 out, B row-major
    return gemm_schedule(a, 512, 512, 512, "i16", 64, 64, 32, 4, 4, dtype_out="i32", b_col_maj=False)


def _matrix_vector(a: AieArray) -> Schedule:
    # mlir-aie matrix_vector (v1.3.2): M = K = 288, m = k = 32, one core, i16 -> i32, matvec_scalar
    return gemv_schedule(a, 288, 288, "i16", 32, 32, 1, 1, vectorized=False)


def _smallest(a: AieArray) -> Schedule:
    # the smallest design the schedules describe: one core, one 32 x 32 GEMV tile
    return gemv_schedule(a, 32, 32, "i16", 32, 32, 1, 1)


CALIBRATION: tuple[Figure, ...] = (
    Figure(
        "single-core 512^3 i16->i32 GEMM, 32x32x32 tiles", "hawkpoint", 67.9, "GOPS",
        SRC_OPEN_XDNA, _single_core(512), 2 * 512**3,
        notes="3956 us per run; sets BURST_CYCLES with the next row (the design is shim-DMA bound: 64 B runs)",
    ),
    Figure(
        "single-core 256^3 i16->i32 GEMM (gemm-256-1col), buffers reused", "npu1", 41.2, "GOPS",
        SRC_TOOLKIT + " gemm-256-benchmark.md (bench_gemm.py: launch + wait, buffers allocated once)",
        _single_core(256), 2 * 256**3,
        notes="0.82 ms per run; sets BURST_CYCLES with the previous row",
    ),
    Figure(
        "single-core 256^3 i16->i32 GEMM (gemm-256-1col), fresh buffers", "npu1", 30.5, "GOPS",
        SRC_MRTIB + "; " + SRC_TOOLKIT + " gemm-multi-benchmark.md", _single_core(256), 2 * 256**3,
        fresh_buffers=True,
        notes="1.10 ms per run, " + FRESH_BUFFERS + "; the same design as the previous row, so the 0.28 ms "
        "step sets BO_FIXED_S (with the per-byte host costs from their own sources)",
    ),
)  # fmt: skip

CHECKS: tuple[Figure, ...] = (
    Figure(
        "16-core (4x4) 512^3 i16->i32 GEMM (gemm-512-4col), fresh buffers", "npu1", 264.7, "GOPS",
        SRC_MRTIB + "; " + SRC_TOOLKIT + " gemm-multi-benchmark.md", _whole_array,
        2 * 512**3, fresh_buffers=True,
        notes="1.01 ms per run, " + FRESH_BUFFERS + " (2 MiB of buffers: the modeled host side is ~60% of the time)",
    ),
    Figure(
        "single-core 288x288 i16 GEMV (gemv-288), scalar kernel, fresh buffers", "npu1", 376.0, "us",
        SRC_TOOLKIT + " gemm-multi-benchmark.md: 0.376 ms per run (mrtib/phoenix-npu1-iron-kernels: 0.4 GOPS)",
        _matrix_vector, fresh_buffers=True,
        notes=FRESH_BUFFERS + "; mlir-aie's matrix_vector ran matvec_scalar then (its vectorized kernel was "
        "marked erroneous); launch, host buffers and 64 B DMA runs dominate, not the 83k MACs",
    ),
    Figure(
        "XRT launch + wait of the smallest design", "hawkpoint", 127.5, "us",
        SRC_OPEN_XDNA + ": passthrough_kernel (4096 B), NPU time avg 127.5 us (120.7-135.9)", _smallest,
        notes="the launch cost is a model input (arch launch_us: published ~120-160 us, midpoint); "
        "this row checks it against a measured near-empty design",
    ),
)  # fmt: skip


def calibration_table() -> dict:
    """``{"calibration": [...], "checks": [...], "tolerance": 0.25, "all_within": bool, "how": ...}``."""
    calibration = [f.row() for f in CALIBRATION]
    checks = [f.row() for f in CHECKS]
    return {
        "calibration": calibration,
        "checks": checks,
        "tolerance": TOLERANCE,
        "all_within": all(abs(r["rel_error"]) <= TOLERANCE for r in calibration + checks),
        "how": "emulated (AIE cost model) vs published measurements",
    }
