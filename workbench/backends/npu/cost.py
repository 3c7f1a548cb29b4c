"""The emulator's cost model: the time of one schedule on one AIE array (every figure is ``emulated``).

Per launch: the XRT launch cost, then the array time. With double-buffered FIFOs (depth >= 2) compute,
core streams, shim DMA and the DDR interface overlap, so the array time is the slowest of them plus the
fill of the first tile; with single buffers compute and data movement add up (or the overlapped time, if
that is longer: single buffering never helps).

- compute: kernel calls per core x cycles per call / clock. A call costs its MACs / sustained MAC rate
  (the MAC tile per cycle, one column of it for GEMV and thin attention, one MAC per cycle on the scalar
  unit, times :data:`~workbench.backends.npu.arch.MAC_EFFICIENCY`), plus per output block of the
  2x2-expanded matmuls (mm.cc, our int8 mm_i8.cc: accumulator load/store, loop prologue), plus vector ops /
  vector lanes, plus the call overhead
- core streams: the busiest core input channel, 32 bit per cycle
- memory-tile streams: the busiest memory-tile input channel from the shim (a column's stream that the
  memory tile splits or forwards to its cores: all its cores' data per call), 32 bit per cycle; the hop
  also adds one object's transfer to the pipeline fill
- shim DMA: per direction, each tensor's runs (a fixed number of cycles each) and bytes (32 bit per cycle)
  on its channel of each of its columns; a direction's channels share the work of all its tensors
- DDR interface: bytes / the NPU's DDR bandwidth

:func:`host_buffer_seconds` is the host's cost of allocating fresh XRT buffers for one run, for figures
measured that way (the emulator's op times, like mlir-aie's test harness, have their buffers in place).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .arch import (
    BLOCK_CYCLES,
    BO_BYTE_S,
    BO_FIXED_S,
    BURST_CYCLES,
    CALL_OVERHEAD_CYCLES,
    MAC_EFFICIENCY,
    SCALAR_MACS_PER_CYCLE,
    VECTOR_LANES_F32,
    AieArray,
)
from .dataflow import Schedule


@dataclass(frozen=True)
class Estimate:
    """Emulated time of one launch of a schedule, and what bounds it."""

    seconds: float
    launch_s: float
    array_s: float
    compute_s: float
    stream_s: float
    memtile_s: float
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
    """MACs per cycle a core sustains for ``dtype`` on the matrix unit, as vector MACs (one MAC-tile
    column) or on the scalar unit."""
    if unit == "scalar":
        return SCALAR_MACS_PER_CYCLE
    r, s, t = array.mac_tile(dtype)
    per_cycle = r * s * t if unit == "matrix" else r * s
    return per_cycle * MAC_EFFICIENCY[dtype]


def call_cycles(schedule: Schedule, array: AieArray) -> float:
    macs = (
        schedule.macs_per_call / mac_rate(array, schedule.dtype_in, schedule.mac_unit)
        if schedule.macs_per_call
        else 0.0
    )
    return (
        macs
        + schedule.blocks_per_call * BLOCK_CYCLES
        + schedule.vector_ops_per_call / VECTOR_LANES_F32
        + CALL_OVERHEAD_CYCLES
    )


def shim_cycles(schedule: Schedule, array: AieArray) -> float:
    """Cycles of the busiest shim DMA channel: per direction, the larger of one tensor's work over its own
    columns and the direction's work spread over all its channels."""
    busiest = 0.0
    for direction in ("in", "out"):
        work = [
            (t.bursts * BURST_CYCLES + t.nbytes / array.dma_bytes_per_cycle, t.columns)
            for t in schedule.transfers
            if t.direction == direction
        ]
        if work:
            spread = sum(w for w, _ in work) / (schedule.columns * array.shim_channels)
            busiest = max(busiest, spread, max(w / cols for w, cols in work))
    return busiest


def estimate(schedule: Schedule, array: AieArray, launches: int = 1) -> Estimate:
    """Emulated seconds of ``launches`` launches of ``schedule`` on ``array``."""
    clock = array.clock_hz
    compute = schedule.calls_per_core * call_cycles(schedule, array) / clock
    per_call = schedule.stream_bytes_per_call()
    stream = schedule.calls_per_core * per_call / array.dma_channel_bw
    hop = schedule.memtile_stream_bytes_per_call()
    memtile = schedule.calls_per_core * hop / array.dma_channel_bw
    shim = shim_cycles(schedule, array) / clock
    ddr = sum(t.nbytes for t in schedule.transfers) / array.ddr_bw
    fill = (per_call + hop) / array.dma_channel_bw + call_cycles(schedule, array) / clock
    parts = {"compute": compute, "core streams": stream, "memory-tile streams": memtile, "shim DMA": shim,
             "DDR interface": ddr}  # fmt: skip
    bound = max(parts, key=parts.get)
    array_s = parts[bound] + fill
    if schedule.min_depth() < 2 and compute + max(stream, memtile, shim, ddr) > array_s:
        # single buffers: a core computes only once its data arrived (never faster than double-buffered)
        bound = "compute + data movement (single-buffered)"
        array_s = compute + max(stream, memtile, shim, ddr)
    launch = launches * array.launch_s
    total = launch + launches * array_s
    if launch > launches * array_s:
        bound = "launch overhead"
    return Estimate(total, launch, launches * array_s, compute, stream, memtile, shim, ddr, bound, array.key)


def host_buffer_seconds(schedule: Schedule) -> float:
    """Host seconds of one run that allocates, fills, syncs, reads back and frees a fresh XRT buffer for
    every tensor of ``schedule`` (``modeled``: fixed cost per buffer object plus a cost per byte)."""
    buffers = schedule.host_buffers()
    return len(buffers) * BO_FIXED_S + sum(nbytes for _, nbytes in buffers) * BO_BYTE_S
