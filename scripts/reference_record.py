"""What the fixture scripts record from a transformers model (dev-only: needs torch; imported by
make_reference.py and make_layout_reference.py, which run from this folder)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def all_logits(model, ids: Sequence[int]) -> np.ndarray:
    """Every position's logits (T, vocab) of one forward pass without a cache, as float32."""
    import torch

    with torch.no_grad():
        return model(torch.tensor([list(ids)]), use_cache=False).logits[0].float().numpy()


def logit_rows(logits: np.ndarray, positions: Sequence[int], sample_ids: Sequence[int], top: int) -> dict:
    """Per position: the ``top`` highest ids and logits, and the logits of the fixed ``sample_ids``."""
    rows = {}
    for p in positions:
        row = logits[p]
        best = np.argsort(-row, kind="stable")[:top]
        rows[str(p)] = {
            "top_ids": best.tolist(),
            "top_logits": row[best].tolist(),
            "sample_logits": row[list(sample_ids)].tolist(),
        }
    return rows


def greedy(model, ids: Sequence[int], steps: int) -> tuple[list[int], list[float]]:
    """A greedy continuation with the KV cache and each step's top-2 logit margin."""
    import torch

    with torch.no_grad():
        gen = model.generate(
            torch.tensor([list(ids)]),
            max_new_tokens=steps,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            eos_token_id=None,
            pad_token_id=0,
        )
    margins = []
    for step_logits in gen.logits:
        v = np.sort(step_logits[0].float().numpy())[-2:]
        margins.append(float(v[1] - v[0]))
    return gen.sequences[0, len(ids) :].tolist(), margins


def write_fixture(path: Path, data: dict) -> None:
    """Write a fixture as indented JSON and say where and how large."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)", file=sys.stderr)
