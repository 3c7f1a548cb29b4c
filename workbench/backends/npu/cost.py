"""The emulator's cost model: the time of one schedule on one AIE array (every figure is ``emulated``).

Per launch: the XRT launch cost, then the array time. With double-buffered FIFOs (depth >= 2) compute,
core streams, shim DMA and the DDR interface overlap, so the array time is the slowest of them plus the
fill of the first tile; with single buffers compute and data movement add up.

- compute: kernel calls per core x (MACs / sustained MAC rate + vector ops / vector lanes + call
  overhead) / clock; the MAC rate is the MAC tile per cycle (GEMV and thin attention use one column of it)
  times the kernel efficiency of its dtype (:data:`~workbench.backends.npu.arch.MAC_EFFICIENCY`)
- core streams: the busiest core input channel, 32 bit per cycle
- shim: bytes per column over its DMA channels, 32 bit per cycle each
- DDR interface: bytes / bandwidth plus a fixed cost per DMA burst (contiguous run of an access pattern)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .arch import BURST_S, CALL_OVERHEAD_CYCLES, MAC_EFFICIENCY, VECTOR_LANES_F32, AieArray
from .schedule import Schedule


@dataclass(frozen=True)
class Estimate:
    """Emulated time of one launch of a schedule, and what bounds it."""

    seconds: float
    launch_s: float
    array_s: float
    compute_s: float
    stream_s: float
    shim_s: float
    ddr_s: float
    bound: str
    device: str

    @property
    def how(self) -> str:
        return f"emulated (AIE cost model, {self.device})"

    def to_dict(self) -> dict:
        return {**asdict(self), "how": self.how}


def mac_rate(array: AieArray, dtype: str, unit: str) -> float:
    """MACs per cycle a core sustains for ``dtype`` on the matrix unit or as vector MACs (one MAC-tile column)."""
    r, s, t = array.mac_tile(dtype)
    per_cycle = r * s * t if unit == "matrix" else r * s
    return per_cycle * MAC_EFFICIENCY[dtype]


def call_cycles(schedule: Schedule, array: AieArray) -> float:
    macs = (
        schedule.macs_per_call / mac_rate(array, schedule.dtype_in, schedule.mac_unit)
        if schedule.macs_per_call
        else 0.0
    )
    return macs + schedule.vector_ops_per_call / VECTOR_LANES_F32 + CALL_OVERHEAD_CYCLES


def estimate(schedule: Schedule, array: AieArray, launches: int = 1) -> Estimate:
    """Emulated seconds of ``launches`` launches of ``schedule`` on ``array``."""
    clock = array.clock_hz
    compute = schedule.calls_per_core * call_cycles(schedule, array) / clock
    per_call = schedule.stream_bytes_per_call()
    stream = schedule.calls_per_core * per_call / array.dma_channel_bw
    ins = sum(t.nbytes for t in schedule.transfers if t.direction == "in")
    outs = sum(t.nbytes for t in schedule.transfers if t.direction == "out")
    shim_bw = array.shim_channels * array.dma_channel_bw * schedule.columns
    shim = max(ins, outs) / shim_bw
    ddr = sum(t.nbytes / array.ddr_bw + t.bursts * BURST_S for t in schedule.transfers)
    fill = per_call / array.dma_channel_bw + call_cycles(schedule, array) / clock
    parts = {"compute": compute, "core streams": stream, "shim DMA": shim, "DDR interface": ddr}
    if schedule.min_depth() >= 2:
        bound = max(parts, key=parts.get)
        array_s = parts[bound] + fill
    else:
        bound = "compute + data movement (single-buffered)"
        array_s = compute + max(stream, shim, ddr)
    launch = launches * array.launch_s
    total = launch + launches * array_s
    if launch > launches * array_s:
        bound = "launch overhead"
    return Estimate(total, launch, launches * array_s, compute, stream, shim, ddr, bound, array.key)
