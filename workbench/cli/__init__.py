"""The ``workbench`` command line: one sub-module per command, each adding its parser and handler."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from typing import Any

# sub-command -> module under workbench.cli that defines ``add_parser(subparsers)`` and ``run(args)``
COMMANDS = (
    "generate", "bench", "limits", "info", "devices", "synth", "runs", "sweep", "report", "calibrate", "placement",
    "serve", "eval", "batching", "speculate", "tune",
)  # fmt: skip


def emit_json(obj: Any) -> None:
    """Print one JSON object on stdout (the contract of every ``--json`` flag)."""
    json.dump(obj, sys.stdout, indent=None, default=_json_default)
    sys.stdout.write("\n")
    sys.stdout.flush()


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workbench", description="Run and study Gemma 3 inference op by op."
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"workbench.cli.{name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from workbench import __version__

        print(__version__)
        return 0
    if not args.command:
        parser.print_help()
        return 2
    if getattr(args, "device", None) is not None and hasattr(args, "tune"):
        # --device X is the backend tunable device=X (the vulkan backend reads it; others reject it clearly)
        args.tune = ",".join(x for x in (args.tune, f"device={args.device}") if x)
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print("\nworkbench: interrupted", file=sys.stderr)
        return 130
    except (ValueError, RuntimeError, OSError, KeyError, NotImplementedError) as e:
        if getattr(args, "debug", False):
            raise
        print(f"workbench {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
