"""Static check of a generated IRON design's DMA channels: how many each tile uses, against its limits.

:func:`trace_design` runs a design's ``design()`` against a recording stand-in for the part of mlir-aie's
IRON API the designs use (``aie.iron``: object FIFOs with ``forward`` / ``split`` / ``join``, kernels,
core-local buffers, workers whose core body is traced once as IRON traces it, runtime fills and drains with their shim
placements and access patterns) and returns what it recorded (:class:`DesignGraph`; the IRON design tests
read it too), and :func:`channel_usage` counts, per tile, the DMA
channels the object FIFOs lower to: a FIFO's producer tile spends one output (MM2S) channel on it, each
distinct consumer tile one input (S2MM) channel (a broadcast is one output, several inputs). Shared-memory
neighbours that need no DMA are counted as DMA too, so the counts are an upper bound. Limits per tile: a
compute tile 2 in + 2 out, a memory tile 6 + 6, a shim tile ``shim_channels`` + ``shim_channels`` (2 on
AIE2 / AIE2P). Every endpoint must be placed explicitly (``placement=Tile(col, row)``), or the check
refuses the design: SequentialPlacer's choices are not modeled.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace

from .arch import AieArray
from .schedule import Schedule

# (input, output) DMA channels of a compute tile and of a memory tile (AM020 / AM025)
CORE_CHANNELS = (2, 2)
MEMTILE_CHANNELS = (6, 6)

Tile = tuple[int, int]  # (column, row): row 0 shim, row 1 memory tile, rows >= 2 compute tiles


class ChannelError(ValueError):
    """A design uses more DMA channels on some tile than it has, or cannot be counted."""


@dataclass
class TracedFifo:
    name: str
    producers: set[Tile] = field(default_factory=set)
    consumers: set[Tile] = field(default_factory=set)


@dataclass
class TracedKernel:
    name: str
    obj: str  # the object file it links from
    arg_types: list


@dataclass
class DesignGraph:
    """What a traced design declared: object FIFOs with the tiles of their endpoints, kernels, the workers'
    tiles, and the runtime's fills and drains in order (each the tap it streams: ``(kind, shape, tile, ...,
    index)`` as the stand-in's ``TensorTiler2D`` made it)."""

    fifos: list[TracedFifo] = field(default_factory=list)
    kernels: list[TracedKernel] = field(default_factory=list)
    workers: list[Tile] = field(default_factory=list)
    fills: list = field(default_factory=list)
    drains: list = field(default_factory=list)


def _stand_in(graph: DesignGraph) -> dict[str, ModuleType | SimpleNamespace]:
    def placed(tile: Tile | None, what: str) -> Tile:
        if tile is None:
            raise ChannelError(f"{what} has no explicit placement: its tile (and channels) cannot be counted")
        return tile

    class Handle:
        def __init__(self, fifo: ObjectFifo, is_prod: bool):
            self.fifo, self.is_prod = fifo, is_prod

        def at(self, tile: Tile) -> None:
            (self.fifo.traced.producers if self.is_prod else self.fifo.traced.consumers).add(tile)

        def acquire(self, n):
            return None

        def release(self, n):
            return None

        def forward(self, placement=None, obj_type=None, depth=None, name=None, **kw):
            tile = placed(placement, f"forward of {self.fifo.traced.name}")
            self.at(tile)
            out = ObjectFifo(obj_type, name=name)
            out.traced.producers.add(tile)
            return out

        def split(self, offsets, obj_types=None, names=None, placement=None, **kw):
            return self._many("split", offsets, names, placement, not self.is_prod)

        def join(self, offsets, obj_types=None, names=None, placement=None, **kw):
            return self._many("join", offsets, names, placement, self.is_prod)

        def _many(self, what, offsets, names, placement, ok):
            if not ok:
                raise ChannelError(f"{what} on the wrong end of {self.fifo.traced.name}")
            tile = placed(placement, f"{what} of {self.fifo.traced.name}")
            self.at(tile)
            subs = [ObjectFifo(None, name=n) for n in (names or [None] * len(offsets))]
            for sub in subs:
                (sub.traced.consumers if what == "join" else sub.traced.producers).add(tile)
            return subs

    class ObjectFifo:
        def __init__(self, obj_type, depth=2, name=None, **kw):
            self.traced = TracedFifo(name or f"fifo{len(graph.fifos)}")
            graph.fifos.append(self.traced)

        def prod(self):
            return Handle(self, True)

        def cons(self):
            return Handle(self, False)

    class Kernel:
        def __init__(self, name, obj, arg_types):
            self.traced = TracedKernel(name, obj, list(arg_types))
            graph.kernels.append(self.traced)

        def __call__(self, *args):
            if len(args) != len(self.traced.arg_types):
                raise ChannelError(f"{self.traced.name}: {len(args)} args for {len(self.traced.arg_types)}")

    class Buffer:  # a core's own memory (no DMA): placed on the worker's tile that takes it
        def __init__(self, type=None, initial_value=None, name=None, **kw):
            self.name = name

    class Worker:
        def __init__(self, fn, fn_args, placement=None, **kw):
            tile = placed(placement, "a worker")
            for arg in fn_args:
                if isinstance(arg, Handle):
                    arg.at(tile)
            fn(*fn_args)  # the core body, traced once
            graph.workers.append(tile)

    class Runtime:
        @contextmanager
        def sequence(self, *types_):
            yield [object() for _ in types_]

        def start(self, *workers):
            return None

        def fill(self, handle, tensor, tap=None, placement=None, **kw):
            if not handle.is_prod:
                raise ChannelError(f"fill into the consumer end of {handle.fifo.traced.name}")
            handle.at(placed(placement, f"fill of {handle.fifo.traced.name}"))
            graph.fills.append(tap)

        def drain(self, handle, tensor, tap=None, placement=None, **kw):
            if handle.is_prod:
                raise ChannelError(f"drain from the producer end of {handle.fifo.traced.name}")
            handle.at(placed(placement, f"drain of {handle.fifo.traced.name}"))
            graph.drains.append(tap)

    class Program:
        def __init__(self, device, runtime):
            pass

        def resolve_program(self, placer):
            return graph

    class TensorTiler2D:
        @staticmethod
        def group_tiler(shape, tile, group, **kw):
            n = (shape[0] // tile[0] // group[0]) * (shape[1] // tile[1] // group[1])
            return [("group", shape, tile, group, i) for i in range(n)]

        @staticmethod
        def simple_tiler(shape, tile=None, **kw):
            n = 1 if tile is None else math.prod(s // t for s, t in zip(shape, tile))
            return [("simple", shape, tile, i) for i in range(n)]

    return {
        "aie": ModuleType("aie"),
        "aie.iron": SimpleNamespace(
            Buffer=Buffer,
            Kernel=Kernel,
            ObjectFifo=ObjectFifo,
            Program=Program,
            Runtime=Runtime,
            Worker=Worker,
        ),
        "aie.iron.controlflow": SimpleNamespace(range_=lambda n: range(min(n, 1))),  # a loop body traced once
        "aie.iron.device": SimpleNamespace(NPU1Col4=object, NPU2=object, Tile=lambda col, row: (col, row)),
        "aie.iron.placers": SimpleNamespace(SequentialPlacer=object),
        "aie.helpers": ModuleType("aie.helpers"),
        "aie.helpers.taplib": SimpleNamespace(TensorTiler2D=TensorTiler2D),
        "ml_dtypes": SimpleNamespace(bfloat16=float),
    }


@contextmanager
def _modules(mods: dict) -> Iterator[None]:
    saved = {name: sys.modules.get(name) for name in mods}
    sys.modules.update(mods)
    try:
        yield
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod


def trace_design(source: str) -> DesignGraph:
    """The object FIFOs and endpoint tiles of a generated design (its ``design()`` run on the stand-in)."""
    graph = DesignGraph()
    namespace: dict = {"__name__": "traced_design"}
    with _modules(_stand_in(graph)):
        exec(compile(source, "<design>", "exec"), namespace)  # our own generated source
        namespace["design"]()
    for f in graph.fifos:
        if len(f.producers) != 1 or not f.consumers:
            raise ChannelError(f"object FIFO {f.name}: producers {f.producers}, consumers {f.consumers}")
    return graph


def channel_usage(graph: DesignGraph) -> dict[Tile, tuple[int, int]]:
    """(input, output) DMA channels each tile of ``graph`` uses."""
    ins, outs = Counter(), Counter()
    for f in graph.fifos:
        outs.update(f.producers)
        ins.update(f.consumers)
    return {t: (ins[t], outs[t]) for t in sorted(set(ins) | set(outs))}


def tile_limits(tile: Tile, array: AieArray) -> tuple[int, int]:
    """(input, output) DMA channels ``tile`` has on ``array``."""
    row = tile[1]
    if row == 0:
        return array.shim_channels, array.shim_channels
    return MEMTILE_CHANNELS if row == 1 else CORE_CHANNELS


def over_limits(usage: dict[Tile, tuple[int, int]], array: AieArray) -> list[str]:
    """The tiles of ``usage`` that use more DMA channels than they have on ``array`` (or lie outside it)."""
    out = []
    for tile, (n_in, n_out) in usage.items():
        lim_in, lim_out = tile_limits(tile, array)
        if n_in > lim_in or n_out > lim_out or tile[0] >= array.columns:
            out.append(f"tile {tile}: {n_in} in / {n_out} out DMA channels, limit {lim_in} / {lim_out}")
    return out


def channel_violations(schedule: Schedule, array: AieArray) -> list[str]:
    """Tiles of ``schedule``'s generated design that use more DMA channels than they have (empty: none)."""
    from .iron import design_source

    return over_limits(channel_usage(trace_design(design_source(schedule))), array)
