#!/usr/bin/env python
"""Device time of one Vulkan decode step (the untimed program, device timestamps) at a context depth, for
each of several tunable settings, with the KV cache sized as ``workbench bench`` sizes it (depth + 256
positions): 32 steps after 8 warm ones, median and minimum. For A/B checks of decode-path tunables without
the host's share (figures: experiments/vulkan-scale/notes.md).

    python scripts/vulkan_decode_step.py MODEL DEPTH [- | k=v,...] ...   ("-": the defaults)
"""

from __future__ import annotations

import statistics
import sys

import workbench as wb


def decode_step_seconds(engine, seq, warm: int = 8, steps: int = 32) -> list[float]:
    """Device seconds of ``steps`` one-token decode steps of ``seq``, after ``warm`` untimed ones."""
    out = []
    for i in range(warm + steps):
        engine.forward(seq, [(500 + i) % engine.model.config.vocab_size])
        t = engine.backend.device_step_seconds()
        if t is None:
            sys.exit("this device gives no timestamps for a step (features.timestamps, tunable timestamps)")
        if i >= warm:
            out.append(t)
    return out


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    model, depth = wb.load(sys.argv[1]), int(sys.argv[2])
    tokens = [(977 * i + 13) % 5000 + 300 for i in range(depth)]
    for tune in sys.argv[3:]:
        engine = wb.Engine(
            model, "vulkan", max_context=depth + 256, **({} if tune == "-" else {"tune": tune})
        )
        seq = engine.new_sequence()
        engine.forward(seq, tokens)
        steps = decode_step_seconds(engine, seq)
        print(
            f"{sys.argv[1]} depth {depth} {tune}: decode step {1e3 * statistics.median(steps):.3f} ms median, "
            f"{1e3 * min(steps):.3f} min (device)",
            flush=True,
        )
        engine.backend.close()


if __name__ == "__main__":
    main()
