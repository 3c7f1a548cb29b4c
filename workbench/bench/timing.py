"""One timed repeat of prefill + decode, as every engine of ``workbench bench`` reports it (ours and llama.cpp's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .stats import median_ci, percentiles


@dataclass
class RunTiming:
    """Seconds of one repeat. ``decode_latencies_s`` holds one entry per decode step where the engine times
    each step; an engine that times only the whole decode (llama-bench) leaves it empty and sets
    ``decode_total_s``."""

    prefill_s: float
    ttft_s: float
    decode_latencies_s: list[float]
    decode_device_s: list[float] = field(default_factory=list)  # accelerator time per step, where measured
    decode_total_s: float | None = None

    @property
    def decode_s(self) -> float:
        if self.decode_total_s is not None:
            return self.decode_total_s
        return float(sum(self.decode_latencies_s))


def summarize(runs: list[RunTiming], prompt_tokens: int, gen: int) -> dict[str, Any]:
    pre = [prompt_tokens / r.prefill_s for r in runs]
    dec = [gen / r.decode_s for r in runs]
    lat = [x for r in runs for x in r.decode_latencies_s]
    overhead = [
        1.0 - d / w for r in runs if len(r.decode_device_s) == len(r.decode_latencies_s)
        for w, d in zip(r.decode_latencies_s, r.decode_device_s)
    ]  # fmt: skip
    out_overhead = (
        {"decode_host_overhead_share": median_ci(overhead),
         "decode_host_overhead_how": "measured: step wall time minus the GPU time of its command buffer"}
        if overhead else {}
    )  # fmt: skip
    return {
        **out_overhead,
        "prefill_tok_s": median_ci(pre),
        "decode_tok_s": median_ci(dec),
        "time_to_first_token_s": median_ci([r.ttft_s for r in runs]),
        "decode_latency_s": percentiles(lat),
        "samples": {
            "prefill_tok_s": pre,
            "decode_tok_s": dec,
            "time_to_first_token_s": [r.ttft_s for r in runs],
            "decode_latency_p50_s": [
                float(np.median(r.decode_latencies_s)) for r in runs if r.decode_latencies_s
            ],
        },
    }
