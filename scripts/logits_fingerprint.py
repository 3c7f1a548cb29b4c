#!/usr/bin/env python
"""Fingerprints of a backend's logits on a model: SHA-256 of the float32 bytes of a prefill's every row and
of each token-by-token decode step, and the greedy tokens. Two runs with equal fingerprints computed
bit-identical logits; used to hold a refactor of a backend to "behaviour unchanged" (run it before and after
on the same host, with the same tunables and the same kernel-cache state).

    python scripts/logits_fingerprint.py [--model gemma3-270m] [--backend cpu] [--tune k=v,...] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import numpy as np

import workbench as wb

PROMPT = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"
DECODE_STEPS = 8


def sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, dtype=np.float32).tobytes()).hexdigest()[:16]


def fingerprint(model_name: str, backend: str, tune: str | None) -> dict:
    model = wb.load(model_name)
    engine = wb.Engine(model, backend, **({"tune": tune} if tune else {}))
    ids = model.tokenizer.encode(PROMPT)
    prefill = engine.forward(engine.new_sequence(), ids, logits="all")
    seq = engine.new_sequence()
    steps = [engine.forward(seq, [t]) for t in ids]
    tok = int(np.argmax(steps[-1]))
    greedy = [tok]
    for _ in range(DECODE_STEPS - 1):
        row = engine.forward(seq, [tok])
        steps.append(row)
        tok = int(np.argmax(row))
        greedy.append(tok)
    return {
        "model": model_name,
        "backend": backend,
        "tune": tune,
        "prompt_tokens": len(ids),
        "prefill_sha": sha(prefill),
        "steps_sha": [sha(s) for s in steps],
        "greedy": greedy,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--tune", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    fp = fingerprint(a.model, a.backend, a.tune)
    if a.json:
        print(json.dumps(fp, indent=1))
    else:
        print(
            f"{fp['model']} on {fp['backend']}: prefill {fp['prefill_sha']}, steps {' '.join(fp['steps_sha'])}"
        )
        print(f"greedy {fp['greedy']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
