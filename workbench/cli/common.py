"""Arguments shared by several commands."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..models.registry import DEFAULT_MODEL


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        "-m",
        default=DEFAULT_MODEL,
        help=f"model: {DEFAULT_MODEL} (bundled), a .gguf path, an HF directory, or synthetic:<config>",
    )


def add_backend_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend", "-b", default="auto", help="numpy | cpu | vulkan | npu | auto (default: auto)"
    )
    p.add_argument(
        "--max-context",
        type=positive_int,
        default=None,
        help="context limit in tokens (default: the model's)",
    )
    p.add_argument("--threads", type=positive_int, default=None, help="host threads (default: all cores)")
    p.add_argument(
        "--tune",
        default=None,
        help="backend tunables name=value,... (cpu: act_quant=int16|int8|none, fused=0|1)",
    )
    add_device_arg(p)
    p.add_argument("--debug", action="store_true", help="show full tracebacks")


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        default=None,
        help="vulkan: device index or name substring (see `workbench devices`; default: best GPU)",
    )


def add_json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def read_prompt(prompt: str | None, prompt_file: str | None) -> str:
    if prompt is not None and prompt_file is not None:
        raise ValueError("give --prompt or --prompt-file, not both")
    if prompt_file is not None:
        return Path(prompt_file).read_text(encoding="utf-8")
    if prompt is None:
        raise ValueError("a prompt is needed: --prompt TEXT or --prompt-file PATH")
    return prompt


def positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def non_negative_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v
