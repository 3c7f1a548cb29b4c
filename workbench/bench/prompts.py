"""The benchmarks' prompts: token ids of one English text, cut to the lengths a benchmark asks for."""

from __future__ import annotations

from pathlib import Path

from ..models.model import Model

PROMPT_TEXT = Path(__file__).resolve().parents[1] / "data" / "declaration.txt"


def bench_prompt(model: Model, n: int) -> list[int]:
    """Exactly ``n`` token ids: BOS (if the model adds one) then English text, repeated as needed."""
    tok = model.tokenizer
    text_ids = tok.encode(PROMPT_TEXT.read_text(encoding="utf-8"), add_bos=False)
    ids = [tok.bos_id] if tok.add_bos else []
    while len(ids) < n:
        ids.extend(text_ids[: n - len(ids)])
    return ids[:n]


def depth_and_prompt(model: Model, depth: int, prompt_tokens: int) -> tuple[list[int], list[int]]:
    """The ``depth`` tokens prefilled before the timed prompt, and the prompt: one text cut in two, so that
    without a depth the prompt is exactly :func:`bench_prompt`'s."""
    ids = bench_prompt(model, depth + prompt_tokens)
    return ids[:depth], ids[depth:]
