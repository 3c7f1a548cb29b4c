#!/usr/bin/env python
"""Device time of every dispatch of one Vulkan decode step, from timestamps: the dispatches of two layers
in order (kernel, defines, grid, specialization constants) and a table per (op, kernel, defines) over the
step, after the untimed step's GPU time. The profiler's op rows sum an op's dispatches (a quantize pass and
its projection are one row); this shows them apart. Per-dispatch timestamps serialize the step, so the timed
total exceeds the untimed one (measured, device timestamps).

    python scripts/vulkan_dispatch_times.py MODEL [--depth 512] [--tune k=v,...] [--layers 0,5]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
from pathlib import Path

import numpy as np

import workbench as wb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vulkan_decode_step import decode_step_seconds  # a sibling script


class _Quiet:
    """An observer that only makes the backend time every dispatch."""

    def on_op(self, *args, **kwargs) -> None:
        pass

    def on_step(self, *args, **kwargs) -> None:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--depth", type=int, default=512, help="prompt tokens before the timed steps")
    ap.add_argument("--tune", default=None, help="vulkan tunables name=value,...")
    ap.add_argument("--layers", default="0,5", help="layers whose dispatches are listed one by one")
    args = ap.parse_args()
    model = wb.load(args.model)
    engine = wb.Engine(model, "vulkan", **({"tune": args.tune} if args.tune else {}))
    seq = engine.new_sequence(max_len=args.depth + 64)
    vocab = model.config.vocab_size
    engine.forward(seq, [(977 * i + 13) % vocab for i in range(args.depth)])
    steps = decode_step_seconds(engine, seq, warm=8, steps=16)
    print(f"{args.model} depth {args.depth} tune {args.tune or '-'}: untimed decode step "
          f"{1e3 * statistics.median(steps):.3f} ms GPU (median of {len(steps)})")  # fmt: skip
    engine.observer = _Quiet()
    for i in range(3):
        engine.forward(seq, [(600 + i) % vocab])
    prog = next(reversed(engine.backend.programs.values()))
    times = prog.dispatch_times()
    shown = tuple(f"blk.{n}." for n in args.layers.split(","))
    per: dict[tuple[str, str, str], list[float]] = collections.defaultdict(list)
    for d, t in zip(prog.dispatches, times):
        op = d.op.split(".", 2)[-1] if d.op.startswith("blk.") else d.op
        per[(op, d.kernel, ",".join(d.defines))].append(float(t))
        if d.op.startswith(shown):
            print(f"  {d.op:40s} {d.kernel:12s} {','.join(d.defines)[:60]:60s} grid={d.groups} "
                  f"spec={d.spec} barrier={int(d.barrier)} {1e6 * t:8.2f} us")  # fmt: skip
    total = float(np.sum(times))
    print(f"timed step: {1e3 * total:.3f} ms over {len(times)} dispatches")
    for (op, kernel, defines), ts in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        s = sum(ts)
        print(f"  {len(ts):4d} x {1e6 * s / len(ts):8.2f} us = {1e3 * s:7.3f} ms ({100 * s / total:4.1f}%)  "
              f"{op:34s} {kernel:12s} {defines[:60]}")  # fmt: skip
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
