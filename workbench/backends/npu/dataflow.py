"""What one NPU op's schedule describes and what follows from it alone: the tiles, columns and cores, the
object FIFOs between shim, memory tiles and cores, the DDR transfers of a launch, the memory each tile needs
and whether that fits an array (:meth:`Schedule.check`). The planners that choose schedules are in
:mod:`workbench.backends.npu.schedule`; the cost model that times them in :mod:`workbench.backends.npu.cost`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from types import MappingProxyType
from typing import Any

from .arch import DTYPE_BYTES, MAX_BURST_BYTES, AieArray


class ScheduleError(ValueError):
    """A schedule does not fit the array (buffers too big, shape not tileable)."""


@dataclass(frozen=True)
class Fifo:
    """An object FIFO: ``depth`` buffers of ``shape`` x ``dtype`` from ``src`` to ``dst`` tiles.

    ``dims`` is the DMA access pattern (size, stride) the producer streams with (mlir-aie
    ``dims_to_stream``); ``fanout`` how many consumers a broadcast reaches; ``per_call`` whether a new
    object arrives for every kernel call (else once per launch, e.g. a norm weight).
    """

    name: str
    src: str  # shim | memtile | core
    dst: str
    shape: tuple[int, ...]
    dtype: str
    depth: int = 2
    dims: tuple[tuple[int, int], ...] = ()
    fanout: int = 1
    per_call: bool = True

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]

    @property
    def footprint(self) -> int:
        return self.nbytes * self.depth


@dataclass(frozen=True)
class DdrTransfer:
    """What the shim DMAs move between DDR and the array in one launch: ``nbytes`` in contiguous runs of
    ``run_bytes`` (the innermost dimension of the runtime access pattern), spread over ``columns`` shims;
    the host tensor is streamed ``reads`` times (``nbytes / reads`` is its size in host memory)."""

    tensor: str
    direction: str  # in | out
    nbytes: int
    run_bytes: int
    columns: int = 1
    reads: int = 1

    @property
    def bursts(self) -> int:
        runs = -(-self.nbytes // max(1, self.run_bytes))
        return runs * -(-self.run_bytes // MAX_BURST_BYTES)


@dataclass(frozen=True)
class Schedule:
    """How one op runs on the array (see the module docstring)."""

    op: str
    device: str
    dtype_in: str
    dtype_out: str
    problem: Mapping[str, int]
    tile: Mapping[str, int]
    columns: int
    rows: int
    fifos: tuple[Fifo, ...]
    transfers: tuple[DdrTransfer, ...]
    calls_per_core: int
    macs_per_call: int
    mac_unit: str  # "matrix" (MAC tiles), "vector" (a MAC tile column: GEMV, attention rows < r), "scalar"
    vector_ops_per_call: int
    kernels: tuple[str, ...]
    scratch_bytes: int = 0
    blocks_per_call: int = 0  # 2 x 2 groups of output accumulators per mm.cc call (gemm; BLOCK_CYCLES each)
    notes: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "problem", MappingProxyType(dict(self.problem)))
        object.__setattr__(self, "tile", MappingProxyType(dict(self.tile)))
        object.__setattr__(self, "notes", MappingProxyType(dict(self.notes)))

    @property
    def cores(self) -> int:
        return self.columns * self.rows

    def core_bytes(self) -> int:
        """Data memory one core needs: its FIFO buffers (both ends' share) and kernel scratch."""
        return sum(f.footprint for f in self.fifos if "core" in (f.src, f.dst)) + self.scratch_bytes

    def memtile_bytes(self) -> int:
        """Memory one memory tile needs: the FIFOs that land in it from DDR or leave it for DDR."""
        return sum(
            f.footprint for f in self.fifos if f.dst == "memtile" or (f.src == "memtile" and f.dst == "shim")
        )

    def stream_bytes_per_call(self) -> int:
        """Bytes the busiest core input channel carries per kernel call."""
        return max((f.nbytes for f in self.fifos if f.dst == "core" and f.per_call), default=0)

    def memtile_stream_bytes_per_call(self) -> int:
        """Bytes the busiest memory-tile input channel carries from the shim per kernel call (a column's
        stream that the memory tile splits to, or forwards to, its cores; 0 where nothing hops there)."""
        return max(
            (f.nbytes for f in self.fifos if f.dst == "memtile" and f.src == "shim" and f.per_call), default=0
        )

    def host_buffers(self) -> list[tuple[str, int]]:
        """(direction, bytes) of each host tensor a launch reads or writes."""
        return [(t.direction, t.nbytes // t.reads) for t in self.transfers]

    def min_depth(self) -> int:
        return min((f.depth for f in self.fifos if f.per_call), default=2)

    def check(self, array: AieArray) -> None:
        """Raise :class:`ScheduleError` unless every tile's buffers fit and the placement exists."""
        if self.columns > array.columns or self.rows > array.rows:
            raise ScheduleError(
                f"{self.op} on {array.key}: {self.columns} columns x {self.rows} rows exceeds the array "
                f"({array.columns} usable columns x {array.rows} rows)"
            )
        core, limit = self.core_bytes(), array.usable_core_bytes()
        if core > limit:
            parts = ", ".join(f"{f.name} {f.footprint}" for f in self.fifos if "core" in (f.src, f.dst))
            raise ScheduleError(
                f"{self.op} {dict(self.tile)} on {array.key}: core buffers need {core} bytes "
                f"({parts}, scratch {self.scratch_bytes}) but a core has {limit} for data"
            )
        mem = self.memtile_bytes()
        if mem > array.memtile_bytes:
            raise ScheduleError(
                f"{self.op} {dict(self.tile)} on {array.key}: memory-tile buffers need {mem} bytes, "
                f"a memory tile has {array.memtile_bytes}"
            )

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update(problem=dict(self.problem), tile=dict(self.tile), notes=dict(self.notes))
        d["fifos"] = [asdict(f) for f in self.fifos]
        d["transfers"] = [asdict(t) for t in self.transfers]
        d["core_bytes"], d["memtile_bytes"] = self.core_bytes(), self.memtile_bytes()
        return d
