#!/usr/bin/env python
"""Tune only the prefill GEMM shapes (``matmul_coop``) of a model on the Vulkan device, with the autotuner's
checked search (every candidate compared with numpy before it is timed, device timestamps), a fixed time a
shape; optionally also time fixed tiles (``--seconds 0``: only those, the database left alone). Winners replace
the GEMM entries of the tuning database ($WORKBENCH_TUNING_DB or the cache) for this device, driver and model's
shapes; a shape whose default wins loses its entry. ``workbench tune`` does the same within one budget
(``--kernels matmul_coop`` for the GEMM alone); this script gives each shape a fixed time and can time given
tiles beside the search (figures: experiments/vulkan-scale/notes.md).

    python scripts/vulkan_gemm_tune.py MODEL [--seconds 20] [--prompt-tokens 512] [--tile '{"wg":256,...}' ...]
"""

from __future__ import annotations

import argparse
import json
import time

import workbench as wb
from workbench.backends.vulkan.autotune import Tuner
from workbench.backends.vulkan.tuned import TuningDB, param_errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--seconds", type=float, default=20.0, help="search time per shape")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--tile", action="append", default=[], help="a fixed tile to time as well (JSON)")
    args = ap.parse_args()
    tiles = [json.loads(t) for t in args.tile]
    backend = wb.Engine(wb.load(args.model), "vulkan", tune="tuned=0").backend
    f = backend.dev.features
    print(f"{f.name}: shared memory {f.max_shared_memory} B, subgroup {f.subgroup_size}", flush=True)
    tuner = Tuner(backend, budget_s=0, log=lambda s: None)
    db = TuningDB.load()
    total = {"default": 0.0, "best": 0.0}
    for key, call in tuner.shapes(args.prompt_tokens).items():
        if not key.startswith("matmul_coop"):
            continue
        check = tuner.check_data(key, call)
        flops = 2.0 * call["tokens"] * call["cols"] * backend.weight(call["wname"]).rows
        fixed = []
        for tile in tiles:
            if param_errors("matmul_coop", tile, f):
                fixed.append(f"{list(tile.values())}: invalid here")
                continue
            try:
                s = tuner.measure(key, call, tile, check)
            except (ValueError, RuntimeError) as e:  # wrong output or no pipeline: say so, go on
                fixed.append(f"{list(tile.values())}: {e}")
                continue
            fixed.append(f"{list(tile.values())} {s * 1e6:.0f} us")
        r = tuner.tune_shape(key, call, time.monotonic() + args.seconds)
        total["default"] += r.default_s
        total["best"] += r.best_s
        print(
            f"{key}: default {r.default_s * 1e6:.0f} us ({flops / r.default_s / 1e12:.0f} TFLOPS), best "
            f"{r.best_s * 1e6:.0f} us ({flops / r.best_s / 1e12:.0f} TFLOPS) {r.best}, {r.tried} tried, "
            f"{r.rejected} rejected" + (" | " + "; ".join(fixed) if fixed else ""),
            flush=True,
        )
        if args.seconds > 0:  # no search: the given tiles were only timed, the database stays as it was
            tuner.store(db, r)
    dest = db.path if args.seconds > 0 else "not stored (--seconds 0)"
    print("GEMM total us:", {k: round(v * 1e6) for k, v in total.items()}, "->", dest)


if __name__ == "__main__":
    main()
