#!/usr/bin/env python
"""Regenerate tests/fixtures/gemma3_layouts_transformers.json: Hugging Face transformers' fp32 logits for
tiny random Gemma 3 models in the layouts of the large sizes (tests/layouts.py).

- ``27b``: a ``Gemma3ForCausalLM`` directory with the 27B's attention layout (GQA 4/2 heads, head_dim 128,
  query_pre_attn_scalar 168, x8 linear RoPE on global layers, a 16-token window crossed by the prompt).
- ``4b``: a ``Gemma3ForConditionalGeneration`` directory as the Hub ships 4B-12B (a ``text_config`` that
  leaves heads, head_dim, vocabulary and query_pre_attn_scalar to transformers' defaults; text weights
  under ``language_model.model.``; vision tensors). transformers must give the same logits for the same
  weights saved the newer way (``model.language_model.``) and as a complete ``Gemma3ForCausalLM``
  directory; the script checks that and records the text config transformers resolved.

For each prompt: logits at chosen positions (top-32 and a fixed sample of 128 ids) and a 12-token greedy
continuation with each step's top-2 margin. Weights come from a seeded generator (their SHA-256 is
recorded so tests notice a change). Dev-only: needs the ``reference`` extra; runs offline, on CPU.

    HF_HUB_OFFLINE=1 python scripts/make_layout_reference.py [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from layouts import (  # noqa: E402
    LAYOUTS,
    layout_weights,
    weights_digest,
    write_conditional_hf,
)
from reference_record import all_logits, greedy, logit_rows, write_fixture  # noqa: E402
from tiny import write_tiny_hf  # noqa: E402

GREEDY_STEPS = 12
TOP = 32
N_SAMPLE = 128
PROMPT_SEED = 20261126
# transformers' resolved text-config fields that the tests compare with the engine's config
RESOLVED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "query_pre_attn_scalar",
    "sliding_window",
    "max_position_embeddings",
    "rms_norm_eps",
    "final_logit_softcapping",
    "layer_types",
    "rope_parameters",
)


def prompts(vocab: int, window: int) -> dict[str, list[int]]:
    """A short prompt and one 2.5 windows long, of ids past the special tokens."""
    rng = np.random.default_rng(PROMPT_SEED)
    return {
        "short": [2, *rng.integers(6, min(vocab, 300), size=5).tolist()],
        "long": [2, *rng.integers(6, min(vocab, 300), size=window * 5 // 2 - 1).tolist()],
    }


def record(model, ids: list[int], sample_ids: list[int], window: int) -> tuple[dict, np.ndarray]:
    """(the prompt's fixture entry, all its logits): positions on both sides of the window's edges."""
    n = len(ids)
    edges = {p for p in (window - 1, window, window + 1, 2 * window) if p < n}
    logits = all_logits(model, ids)
    greedy_ids, margins = greedy(model, ids, GREEDY_STEPS)
    rows = logit_rows(logits, sorted({0, n // 2, n - 1} | edges), sample_ids, TOP)
    return {"ids": ids, "positions": rows, "greedy": greedy_ids, "greedy_margins": margins}, logits


def resolved_text_config(model) -> dict:
    cfg = model.config.get_text_config()
    out = {}
    for key in RESOLVED:
        v = getattr(cfg, key)
        out[key] = json.loads(json.dumps(v, default=lambda o: dict(o)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", type=Path, default=ROOT / "tests" / "fixtures" / "gemma3_layouts_transformers.json"
    )
    args = ap.parse_args()
    import torch
    import transformers
    from transformers import Gemma3ForCausalLM, Gemma3ForConditionalGeneration

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 2)
    load = dict(dtype=torch.float32, attn_implementation="eager")
    out = {
        "description": "Logits of tiny random Gemma 3 models in the 27B and Hub-4B layouts (tests/layouts.py) "
        "from Hugging Face transformers in fp32 on CPU, eager attention. Made by "
        "scripts/make_layout_reference.py.",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "layouts": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in LAYOUTS.items():
            weights = layout_weights(name)
            sample_ids = np.random.default_rng(PROMPT_SEED).choice(config.vocab_size, N_SAMPLE, replace=False)
            sample_ids = sorted(sample_ids.tolist())
            causal_dir = write_tiny_hf(Path(tmp) / f"{name}-causal", weights, config=config)
            causal = Gemma3ForCausalLM.from_pretrained(str(causal_dir), **load).eval()
            entry = {
                "weights_sha256": weights_digest(weights),
                "sample_ids": sample_ids,
                "prompts": {},
            }
            others = {}  # the same weights in other directory layouts: transformers must agree
            if name == "4b":
                dirs = {
                    s: write_conditional_hf(Path(tmp) / f"4b-{s}", weights, s)
                    for s in ("hub", "transformers5")
                }
                cond = {
                    s: Gemma3ForConditionalGeneration.from_pretrained(str(d), **load).eval()
                    for s, d in dirs.items()
                }
                oracle, entry["class"] = cond["hub"], "Gemma3ForConditionalGeneration"
                others = {"Gemma3ForCausalLM": causal, "transformers5 names": cond["transformers5"]}
            else:
                oracle, entry["class"] = causal, "Gemma3ForCausalLM"
            entry["transformers_text_config"] = resolved_text_config(oracle)
            for pname, ids in prompts(config.vocab_size, config.sliding_window).items():
                rec, logits = record(oracle, ids, sample_ids, config.sliding_window)
                for other, model in others.items():
                    diff = float(np.abs(all_logits(model, ids) - logits).max())
                    print(
                        f"{name}/{pname}: {other} vs the Hub layout: max |dlogit| {diff:.3g}", file=sys.stderr
                    )
                    assert diff < 1e-5, f"{name}/{pname}: transformers loads {other} differently ({diff})"
                entry["prompts"][pname] = rec
                print(f"{name}/{pname}: {len(ids)} tokens, greedy {rec['greedy']}", file=sys.stderr)
            out["layouts"][name] = entry
    write_fixture(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
