"""The CPU's cycle counter, read inside compiled code (profiled program steps, the shards' barrier timeouts),
and its rate, calibrated once against ``time.perf_counter``."""

from __future__ import annotations

import time

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ...numba_jit import numba


@intrinsic
def cycle_counter(typingctx):
    """The CPU's cycle counter (``llvm.readcyclecounter``: rdtsc on x86)."""

    def codegen(context, b, signature, args):
        fn = b.module.globals.get("llvm.readcyclecounter") or ir.Function(
            b.module, ir.FunctionType(ir.IntType(64), []), "llvm.readcyclecounter"
        )
        return b.call(fn, [])

    return types.int64(), codegen


@numba.njit(cache=True)
def cycles():  # pragma: no cover - compiled
    return cycle_counter()


_RATE: list[float] = []


def cycle_rate() -> float:
    """Cycle-counter ticks per second, measured once against ``time.perf_counter`` over 20 ms."""
    if not _RATE:
        cycles()
        t0, c0 = time.perf_counter(), cycles()
        while time.perf_counter() - t0 < 0.02:
            pass
        _RATE.append((cycles() - c0) / (time.perf_counter() - t0))
    return _RATE[0]
