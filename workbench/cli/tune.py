"""``workbench tune``: search kernel parameters per op shape on this device and keep the winners."""

from __future__ import annotations

import argparse
import sys

from .common import add_device_arg, add_json_arg, add_model_args, positive_int


def add_parser(sub) -> None:
    p = sub.add_parser(
        "tune",
        help="autotune the Vulkan kernels for a model's shapes on this device (stored per device and driver)",
    )
    add_model_args(p)
    p.add_argument(
        "--backend", "-b", default="vulkan", help="vulkan (the only backend with per-shape tuning)"
    )
    p.add_argument(
        "--prompt-tokens", "-p", type=positive_int, default=512, help="prefill length of the GEMM shapes"
    )
    p.add_argument("--budget", type=float, default=540.0, help="seconds for the whole search (default 540)")
    p.add_argument("--beam", type=positive_int, default=3, help="candidates kept per round (default 3)")
    p.add_argument(
        "--kernels",
        default="matvec,matmul_coop",
        help="kernels to tune, comma-separated: matvec (decode), matmul_coop (prefill GEMM); default both",
    )
    p.add_argument(
        "--objective",
        choices=("step", "op"),
        default="step",
        help="how decode (matvec) shapes are timed: step = the device time of whole one-token decode steps at "
        "a context of --prompt-tokens, the candidate in force (default); op = the projection alone, repeated",
    )
    p.add_argument("--db", default=None, help="tuning database (default $WORKBENCH_TUNING_DB or the cache)")
    p.add_argument("--tune", default=None, help="backend tunables name=value,... applied while tuning")
    add_device_arg(p)
    p.add_argument("--debug", action="store_true", help="show full tracebacks")
    add_json_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import workbench as wb

    from ..backends.vulkan.autotune import KERNELS, Tuner
    from ..backends.vulkan.tuned import TuningDB
    from . import emit_json

    if args.backend != "vulkan":
        raise ValueError(f"tune: backend {args.backend!r} has no per-shape tuning (only vulkan)")
    if args.budget <= 0:
        raise ValueError("tune: --budget must be positive")
    kernels = tuple(k.strip() for k in args.kernels.split(",") if k.strip())
    unknown = [k for k in kernels if k not in KERNELS]
    if unknown or not kernels:
        raise ValueError(f"tune: --kernels {args.kernels!r}: choose from {', '.join(KERNELS)}")
    model = wb.load(args.model)
    tune = ",".join(x for x in (args.tune, "tuned=0") if x)  # measure the defaults, not earlier winners
    engine = wb.Engine(model, "vulkan", tune=tune)
    backend = engine.backend
    db = TuningDB.load(Path(args.db) if args.db else None)
    log = (lambda s: print(s, file=sys.stderr)) if args.json else print
    tuner = Tuner(
        backend, beam=args.beam, budget_s=args.budget, log=log, objective=args.objective, engine=engine
    )
    results = tuner.run(args.prompt_tokens, db, kernels)
    if not results and "matmul_coop" in kernels and backend.gemm_kernel != "matmul_coop":
        print(f"tune: no matmul_coop shapes: {backend.gemm_note}", file=sys.stderr)
    out = {
        "model": model.describe(),
        "device": backend.device.name,
        "driver": str(backend.dev.features.driver_version),
        "db": str(db.path),
        "objective": args.objective,
        "shapes": [r.to_dict() for r in results],
        "stored": sum(1 for r in results if r.best != r.default and r.best_s < r.default_s),
    }
    if args.json:
        emit_json(out)
    else:
        print(f"tune: {out['stored']} of {len(results)} shapes beat the defaults; stored in {db.path}")
    backend.close()
    return 0
