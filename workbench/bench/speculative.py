"""Speculative decoding vs plain greedy decoding, side by side on one engine: effective tokens/s, the
acceptance rate, and whether every output is identical.

Plain and speculative runs alternate prompt by prompt and repeat by repeat, so machine noise hits both
alike. Figures are ``measured`` (host wall clock on the engine's device).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..runtime.engine import Engine
from ..runtime.speculative import Drafter, speculative_generate
from .stats import median_ci, ratio_ci

# Prompts whose continuations repeat what the prompt holds (lists, tables, code, records): where prompt
# lookup drafting is meant to help. The base model continues each pattern.
REPETITIVE_PROMPTS = (
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. "
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"
    "    return a * b\n\n\ndef div(a, b):\n",
    "name: Alice, city: Paris, country: France\nname: Bob, city: Berlin, country: Germany\n"
    "name: Carla, city: Rome, country: Italy\nname: David, city: Madrid, country:",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Monday, Tuesday, Wednesday, "
    "Thursday, Friday, Saturday, Sunday. Monday, Tuesday,",
)


def speculative_compare(
    engine: Engine,
    drafter: Drafter,
    prompts: Sequence[str | Sequence[int]],
    max_tokens: int,
    k: int,
    repeats: int,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Plain greedy and speculative generation of every prompt, ``repeats`` times, alternating."""
    if repeats < 1 or not prompts:
        raise ValueError("need repeats >= 1 and at least one prompt")
    plain_s: list[float] = []
    spec_s: list[float] = []
    plain_e2e: list[float] = []
    spec_e2e: list[float] = []
    per_prompt = []
    drafted = accepted = steps = tokens = 0
    for r in range(repeats):
        for i, prompt in enumerate(prompts):
            g = engine.generate(prompt, max_tokens)
            s = speculative_generate(engine, prompt, max_tokens, drafter, k)
            n_plain, n_spec = len(g.output_ids) - 1, len(s.output_ids) - 1
            plain_s.append(n_plain / g.decode_s if g.decode_s > 0 else 0.0)
            spec_s.append(s.decode_tok_s)
            plain_e2e.append(len(g.output_ids) / (g.prefill_s + g.decode_s))
            spec_e2e.append(len(s.output_ids) / (s.prefill_s + s.decode_s))
            if r == 0:
                per_prompt.append({"prompt": i, "input_tokens": len(s.input_ids), "identical":
                                   g.output_ids == s.output_ids, "plain_ids": g.output_ids,
                                   "speculative_ids": s.output_ids, "acceptance_rate": s.acceptance_rate,
                                   "tokens_per_step": n_spec / s.verify_steps if s.verify_steps else 0.0})  # fmt: skip
            drafted, accepted = drafted + s.drafted, accepted + s.accepted
            steps, tokens = steps + s.verify_steps, tokens + n_spec
            if progress:
                progress(f"  repeat {r + 1}/{repeats}, prompt {i}: plain {plain_s[-1]:7.1f} tok/s, speculative "
                         f"{spec_s[-1]:7.1f} tok/s, accepted {s.accepted}/{s.drafted}")  # fmt: skip
    dev = engine.backend.device.label()
    return {
        "drafter": drafter.name,
        "k": k,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "identical": all(p["identical"] for p in per_prompt),
        "plain_decode_tok_s": median_ci(plain_s),
        "speculative_decode_tok_s": median_ci(spec_s),
        "decode_speedup": ratio_ci(spec_s, plain_s),
        "plain_tok_s_end_to_end": float(np.median(plain_e2e)),
        "speculative_tok_s_end_to_end": float(np.median(spec_e2e)),
        "end_to_end_speedup": ratio_ci(spec_e2e, plain_e2e),
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "tokens_per_verify_step": tokens / steps if steps else 0.0,
        "prompts": per_prompt,
        "how": f"measured (host wall clock, {engine.backend.name} on {dev}); medians over prompts x repeats",
    }
