"""The AIE array of an NPU as the schedules and the cost model see it.

Geometry (columns, rows, clock, memories, DMA) comes from the NPU device profiles
(:data:`workbench.instrument.devices.PUBLISHED`, field ``array``); MAC rates and MAC tile shapes per
dtype are those of the AIE-ML (npu1) and AIE2P (npu2) cores as mlir-aie's matmul kernels use them.
The few efficiency factors of the cost model live here, each with where it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from ...instrument.devices import DeviceProfile, get_profile

# MAC tile (r, s, t) of one vector MAC instruction: A r x s times B s x t (mlir-aie matmul kernels)
MAC_TILES: dict[str, dict[str, tuple[int, int, int]]] = {
    "npu1": {"bf16": (4, 8, 4), "i8": (4, 8, 8), "i16": (4, 4, 4)},
    "npu2": {"bf16": (4, 8, 8), "i8": (8, 8, 8), "i16": (4, 4, 8)},
}
DTYPE_BYTES = {"bf16": 2, "i8": 1, "i16": 2, "i32": 4, "f32": 4}

# Cost-model factors (the only tuned numbers; see workbench calibrate npu for how well they fit):
# fraction of the MAC peak the matmul kernels sustain in their inner loop: DESIGN.md section 6 (whole-array
# GEMM reaches at most ~75% of peak in i16, ~50% in bf16); i8 assumed like i16
MAC_EFFICIENCY = {"i16": 0.75, "i8": 0.75, "bf16": 0.5}
# cycles a core spends per kernel call outside the MAC loop (lock acquire/release, call, loop prologue)
CALL_OVERHEAD_CYCLES = 200
# the NPU's DDR interface serves one DMA burst (a contiguous run of an access pattern, at most
# MAX_BURST_BYTES) at a time with this fixed cost on top of bytes / bandwidth. Fitted once so that the
# single-core and 16-core 512^3 i16 GEMM figures both come out within 25% (workbench calibrate npu).
BURST_S = 22e-9
MAX_BURST_BYTES = 4096
# fp32 lanes per cycle of the vector unit (512-bit datapath) for norms, softmax and exp
VECTOR_LANES_F32 = 16
# bytes a core keeps for its stack and kernel locals (not available to object FIFOs)
CORE_RESERVED_BYTES = 2048


@dataclass(frozen=True)
class AieArray:
    """One NPU's AIE array."""

    key: str
    name: str
    generation: str
    columns: int  # usable by one design
    physical_columns: int
    rows: int
    clock_hz: float
    core_bytes: int
    memtile_bytes: int
    dma_bytes_per_cycle: int
    shim_channels: int
    launch_s: float
    ddr_bw: float
    power_w: float

    @property
    def cores(self) -> int:
        return self.columns * self.rows

    def mac_tile(self, dtype: str) -> tuple[int, int, int]:
        try:
            return MAC_TILES[self.generation][dtype]
        except KeyError:
            raise ValueError(f"{self.key}: no MAC tile for dtype {dtype!r} (have bf16, i8, i16)") from None

    def macs_per_cycle(self, dtype: str) -> int:
        r, s, t = self.mac_tile(dtype)
        return r * s * t

    def peak_ops(self, dtype: str, columns: int | None = None) -> float:
        """Peak OP/s (2 per MAC) of ``columns`` columns (default: all physical columns)."""
        cols = self.physical_columns if columns is None else columns
        return 2.0 * self.macs_per_cycle(dtype) * cols * self.rows * self.clock_hz

    @property
    def dma_channel_bw(self) -> float:
        """Bytes/s of one DMA channel (core, memory tile or shim)."""
        return self.dma_bytes_per_cycle * self.clock_hz

    def usable_core_bytes(self) -> int:
        return self.core_bytes - CORE_RESERVED_BYTES


def from_profile(profile: DeviceProfile) -> AieArray:
    a = profile.array
    if profile.kind != "npu" or not a:
        raise ValueError(f"device {profile.key!r} is not an NPU with an AIE array profile")
    return AieArray(
        key=profile.key,
        name=profile.name,
        generation=a["generation"],
        columns=int(a["usable_columns"]),
        physical_columns=int(a["physical_columns"]),
        rows=int(a["rows"]),
        clock_hz=float(a["clock_ghz"]) * 1e9,
        core_bytes=int(a["core_memory_kib"]) * 1024,
        memtile_bytes=int(a["memtile_kib"]) * 1024,
        dma_bytes_per_cycle=int(a["dma_bytes_per_cycle"]),
        shim_channels=int(a["shim_channels_per_column"]),
        launch_s=float(a["launch_us"]) * 1e-6,
        ddr_bw=profile.mem_bw,
        power_w=profile.power_w or 0.0,
    )


NPU_DEVICES = ("npu1", "hawkpoint", "npu2")


@cache
def get_array(name: str = "npu1") -> AieArray:
    """The AIE array of an NPU profile: npu1 (Phoenix), hawkpoint, npu2 (Strix); aliases as in devices."""
    return from_profile(get_profile(name))
