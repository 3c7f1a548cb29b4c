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

# Cost-model factors (see `workbench calibrate npu` for how well they fit the published figures):
# fraction of the MAC tile rate the kernels' software-pipelined inner loops issue: i16 (and i8, assumed
# alike) one VMAC per cycle (mm.cc's 2x2-expanded loop: four MACs per four cycles, its four 256-bit operand
# loads take two on the two load units); bf16 set so that a 64x64x64 mm.cc call sustains ~50% of the MAC
# peak, the most whole-array bf16 GEMM reaches (published, mlir-aie issue #2735;
# docs/backend-npu.md#the-cost-model-and-its-figures)
MAC_EFFICIENCY = {"i16": 1.0, "i8": 1.0, "bf16": 0.75}
# cycles per 2 x 2 group of output accumulators (2r x 2t values) of mm.cc's expanded matmul kernels outside
# the k-loop: load, shift-round-saturate and store the four accumulators, loop prologue and epilogue (the
# 4 x 2 and 4 x 4 expansions of recent aie2 kernels are charged per four accumulators alike). Set so a
# 64x64x64 i16 call sustains 80% of the MAC peak, the most the kernels reach between their event0/event1
# trace markers (mlir-aie issue #2735); small tiles pay it more often (32x32x32: 67%). Those i16 kernels
# load and store int32 C, as our int8 mm_i8.cc loads and stores its int32 partial sums, so int8 is charged alike
BLOCK_CYCLES = 16
# cycles a core spends per kernel call outside the kernel (lock acquire/release, call, loop bookkeeping)
CALL_OVERHEAD_CYCLES = 200
# MACs per cycle of a scalar (non-vectorized) kernel: the scalar unit has one 32-bit multiplier and two
# load ports, so an unrolled, pipelined MAC loop with compile-time trip counts (mv.cc's matvec_scalar)
# issues at most one MAC per cycle
SCALAR_MACS_PER_CYCLE = 1.0
# a shim DMA channel spends this many cycles per contiguous run of its access pattern (one AXI burst of
# at most MAX_BURST_BYTES) on top of moving the run's bytes at dma_bytes_per_cycle: short runs (64 B rows
# of 32 x 16-bit tiles) are issue-bound. Fitted once to the two single-core 32x32x32 i16 GEMM figures
# (Phoenix 256^3 with buffers reused, Hawk Point 512^3: equal and opposite errors, workbench calibrate npu);
# in cycles because the shim DMA runs at the array clock (Hawk Point, at 1.6x the clock, measured ~1.4x
# faster per tile)
BURST_CYCLES = 28
MAX_BURST_BYTES = 4096
# Host side of a run that allocates fresh XRT buffers every time (as the mrtib figures' NpuKernel.run does;
# the emulator's op times, like mlir-aie's test harness, have buffers in place): per buffer object a fixed
# cost (create, map, free: ioctls and pyxrt) plus a cost per byte: pinning pages ~99 ms/GB
# (amd/xdna-driver issue #1399), a host copy in or out at ~10 GB/s (one-thread numpy copy into a fresh
# buffer, measured on the dev machine: 7-10 GB/s) and the cache sync at ~85 GB/s (amd/xdna-driver PR
# #270). BO_FIXED_S is the remainder of the published 0.82 -> 1.10 ms step between the same 256^3 design
# run with reused and with per-run buffers (3 buffers, 512 KiB).
BO_BYTE_S = 0.099e-9 + 1 / 10e9 + 1 / 85e9
BO_FIXED_S = 56e-6
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
