#!/usr/bin/env python
"""Sample the host's streaming read bandwidth and the cost of exchanges between threads, to tell the states
of a shared VM apart.

Each sample: a 256 MiB streaming read (GB/s, 2 threads), the round trip of an empty numba parallel loop
(work handed to the threads and waited for), and a round of two threads each writing 8 KB that one thread
then reads (the pattern of a parallel op whose outputs the next op reads), and how the two threads' arithmetic scales:
the throughput of independent ``vpmaddwd`` chains (registers only, ``scripts/cpu_peak.py``'s loop) on two
threads over one (2.0: two cores; ~1: one core's units shared, as by SMT siblings or a busy host). On the
2-vCPU dev VM the first three moved together: ~45 GB/s with 0.8 us and 2.2 us, or ~72 GB/s with 2 us and
5.5 us (the vCPUs then on two chiplets, each with its own memory link, every exchange crossing between
them); the arithmetic scaled 1.93-2.04x in both states (three of ~30 samples: 1.01-1.70x, moments when
another load shared a core).

    .venv/bin/python scripts/vm_state_probe.py [--samples 10] [--every 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.instrument.devices import stream_buffer, stream_read_gbs, thread_round_trip_us
from workbench.numba_jit import numba

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_peak import _op_kernel  # a sibling script

ROUNDS = 20000


@numba.njit(parallel=True, cache=True)
def _write_then_read(a, rounds):  # pragma: no cover - compiled
    """Per round: each of two threads writes its half of ``a``; then the calling thread sums all of it."""
    s = 0.0
    half = a.shape[0] // 2
    for r in range(rounds):
        for t in numba.prange(2):
            for i in range(t * half, (t + 1) * half):
                a[i] = r + i
        for i in range(a.shape[0]):
            s += a[i]
    return s


_MADD = _op_kernel("vpmaddwd")
MADD_ROUNDS = 2_000_000


@numba.njit(parallel=True)
def _madd_on(threads):  # pragma: no cover - compiled
    """Each of ``threads`` threads runs MADD_ROUNDS rounds of the independent vpmaddwd chains."""
    out = np.zeros(threads, np.int64)
    for t in numba.prange(threads):
        out[t] = _MADD(MADD_ROUNDS, 3 + t)
    return out


def compute_scaling() -> float:
    """Throughput of the multiply chains on two threads over one (each thread the same work)."""
    one = two = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        _madd_on(1)
        t1 = time.perf_counter()
        _madd_on(2)
        one, two = min(one, t1 - t0), min(two, time.perf_counter() - t1)
    return 2 * one / two


def sample(buf: np.ndarray, exchange: np.ndarray) -> dict:
    gbs = stream_read_gbs(2, repeats=1, arr=buf)
    rt = thread_round_trip_us(2, loops=ROUNDS // 4)
    t0 = time.perf_counter()
    _write_then_read(exchange, ROUNDS)
    ex = (time.perf_counter() - t0) / ROUNDS * 1e6
    return {
        "time": time.strftime("%H:%M:%S"),
        "stream_read_gbs": gbs,
        "round_trip_us": rt,
        "exchange_16kb_us": ex,
        "compute_scaling": compute_scaling(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    buf, exchange = stream_buffer(), np.zeros(2048)  # 2 x 8 KB of float64
    _write_then_read(exchange, 2)
    _madd_on(1), _madd_on(2)
    rows = []
    for i in range(args.samples):
        row = sample(buf, exchange)
        rows.append(row)
        if not args.json:
            print(f"{row['time']}  read {row['stream_read_gbs']:5.1f} GB/s  round trip {row['round_trip_us']:.2f} us  "
                  f"2 x 8 KB written, then read {row['exchange_16kb_us']:.2f} us  "
                  f"arithmetic on 2 threads {row['compute_scaling']:.2f}x one", flush=True)  # fmt: skip
        if i + 1 < args.samples:
            time.sleep(args.every)
    if args.json:
        print(json.dumps({"how": "measured on this host (2 threads)", "samples": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
