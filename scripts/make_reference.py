#!/usr/bin/env python
"""Regenerate tests/fixtures/gemma3_270m_transformers.json with Hugging Face transformers (fp32, CPU torch).

This is the oracle for the numpy backend: transformers loads the same GGUF (dequantized to fp32) and we
record, for several prompts, the logits at chosen positions (top-32 and a fixed sample of 128 ids) and a
40-token greedy continuation with each step's top-2 margin. Dev-only: needs the ``reference`` extra
(``pip install -e '.[reference]'``: torch 2.13 CPU, transformers, accelerate); runs offline.

    HF_HUB_OFFLINE=1 python scripts/make_reference.py [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reference_record import all_logits, greedy, logit_rows, write_fixture  # noqa: E402

from workbench.models.registry import default_model_path  # noqa: E402

# A long English prompt (> 600 tokens, so it crosses the 512-token sliding window): the opening of the
# US Declaration of Independence (1776), public domain, shipped in workbench/data.
LONG_TEXT = (ROOT / "workbench" / "data" / "declaration.txt").read_text(encoding="utf-8")

PROMPTS = {
    "one_token": {"ids": [2]},
    "plain": {"text": "The capital of France is"},
    "chat": {
        "text": "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"
    },
    "code": {
        "text": "def fib(n):\n    if n < 2:\n        return n\n    return fib(n-1) + fib(n-2)\n\ndef main():\n"
    },
    "long": {"text": LONG_TEXT},
}
GREEDY_STEPS = 40
TOP = 32
SAMPLE_IDS = np.random.default_rng(20261122).choice(262144, size=128, replace=False).tolist()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "gemma3_270m_transformers.json")
    args = ap.parse_args()
    import torch
    import transformers
    from transformers import AutoTokenizer, Gemma3ForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 2)
    gguf = default_model_path()
    t0 = time.time()
    model = Gemma3ForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    print(f"loaded in {time.time() - t0:.1f} s", file=sys.stderr)

    out = {
        "description": "Reference logits of Gemma 3 270M (the bundled Q4_K_M GGUF, dequantized) from Hugging Face "
        "transformers in fp32 on CPU, eager attention. Made by scripts/make_reference.py.",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "gguf": gguf.name,
        "sample_ids": SAMPLE_IDS,
        "prompts": {},
    }
    for name, spec in PROMPTS.items():
        if "ids" in spec:
            ids = list(spec["ids"])
        else:
            ids = tok(spec["text"], add_special_tokens=True)["input_ids"]
        n = len(ids)
        positions = sorted(
            {0, n // 2, min(n - 1, 511), min(n - 1, 512), n - 1} | ({600} if n > 600 else set())
        )
        rows = logit_rows(all_logits(model, ids), positions, SAMPLE_IDS, TOP)
        greedy_ids, margins = greedy(model, ids, GREEDY_STEPS)  # with the KV cache
        out["prompts"][name] = {
            **({"text": spec["text"]} if "text" in spec else {}),
            "ids": ids,
            "positions": rows,
            "greedy": greedy_ids,
            "greedy_margins": margins,
        }
        print(f"{name}: {n} tokens, greedy {tok.decode(greedy_ids)!r:.80}", file=sys.stderr)
    write_fixture(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
