"""``workbench serve``: an OpenAI-compatible HTTP server (continuous batching) for one model and backend."""

from __future__ import annotations

import argparse
import os
import sys

from .common import add_backend_args, add_model_args, non_negative_int, positive_int


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the model over HTTP (OpenAI API: /v1/chat/completions, /v1/completions)",
        description="OpenAI-compatible server with continuous batching: /v1/chat/completions, "
        "/v1/completions (streaming and not), /v1/models, /health, /metrics (Prometheus). Binds "
        "127.0.0.1 unless --host says otherwise.",
    )
    add_model_args(p)
    add_backend_args(p)
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=positive_int, default=8006)
    p.add_argument("--model-id", default=None, help="model name clients send (default: the model's name)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("WORKBENCH_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1/* (default: $WORKBENCH_API_KEY; none = open)",
    )
    p.add_argument("--max-batch", type=positive_int, default=8, help="sequences per step (default 8)")
    p.add_argument(
        "--max-step-tokens", type=positive_int, default=256, help="tokens per step (prefill chunks)"
    )
    p.add_argument("--kv-budget-mib", type=positive_int, default=None,
                   help="KV cache budget for running requests (default: 8 sequences of the full context)")  # fmt: skip
    p.add_argument("--max-queue", type=non_negative_int, default=256, help="waiting requests before 429")
    p.add_argument("--max-waiting-kv-mib", type=positive_int, default=None,
                   help="KV cache the waiting requests may need at full length before 429 (default: the KV "
                   "budget; a request alone in the queue is always accepted)")  # fmt: skip
    p.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from .. import Engine, load
    from ..runtime.scheduler import Scheduler, default_kv_budget
    from ..serve import create_app

    if args.max_step_tokens < args.max_batch:
        raise ValueError(
            f"--max-step-tokens ({args.max_step_tokens}) must be >= --max-batch ({args.max_batch})"
        )
    model = load(args.model)
    engine = Engine(model, args.backend, max_context=args.max_context, threads=args.threads, tune=args.tune)
    budget = args.kv_budget_mib << 20 if args.kv_budget_mib else default_kv_budget(engine)
    waiting = args.max_waiting_kv_mib << 20 if args.max_waiting_kv_mib else budget
    scheduler = Scheduler(engine, max_batch=args.max_batch, max_step_tokens=args.max_step_tokens,
                          kv_budget_bytes=budget, max_queue=args.max_queue, max_waiting_kv_bytes=waiting)  # fmt: skip
    model_id = args.model_id or model.name
    app = create_app(scheduler, model_id, api_key=args.api_key)
    dev = engine.backend.device
    print(
        f"workbench serve: {model_id} on {engine.backend.name} ({dev.label()}), http://{args.host}:{args.port}/v1 "
        f"(max batch {args.max_batch}, KV budget {scheduler.kv_budget / 2**20:.0f} MiB, "
        f"API key {'required' if args.api_key else 'off'})",
        file=sys.stderr,
        flush=True,
    )
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        engine.close()
    return 0
