"""Accuracy metrics of next-token distributions (numpy): accumulated over chunks of logit rows."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@dataclass
class TokenMetrics:
    """Sums over scored tokens: NLL of the reference and of the variant, KL(ref || variant), top-1 matches."""

    n: int = 0
    nll_ref: float = 0.0
    nll: float = 0.0
    kl: float = 0.0
    kl_max: float = 0.0
    top1_same: int = 0

    def add(self, ref_logits: np.ndarray, logits: np.ndarray, targets: np.ndarray) -> None:
        """Score rows ``i`` (the distributions after token i) against the next tokens ``targets[i]``."""
        if ref_logits.shape != logits.shape or len(targets) != len(logits):
            raise ValueError(
                f"logit shapes {ref_logits.shape} / {logits.shape} and {len(targets)} targets disagree"
            )
        lp_ref, lp = log_softmax(ref_logits), log_softmax(logits)
        rows = np.arange(len(targets))
        self.nll_ref -= float(lp_ref[rows, targets].sum())
        self.nll -= float(lp[rows, targets].sum())
        kl = (np.exp(lp_ref) * (lp_ref - lp)).sum(axis=-1)
        self.kl += float(kl.sum())
        self.kl_max = max(self.kl_max, float(kl.max()))
        self.top1_same += int((ref_logits.argmax(-1) == logits.argmax(-1)).sum())
        self.n += len(targets)

    def summary(self) -> dict[str, float]:
        if not self.n:
            raise ValueError("no token was scored")
        ppl, ppl_ref = math.exp(self.nll / self.n), math.exp(self.nll_ref / self.n)
        return {
            "tokens_scored": self.n,
            "perplexity": ppl,
            "perplexity_ref": ppl_ref,
            "perplexity_rel": ppl / ppl_ref - 1.0,
            "kl_mean": self.kl / self.n,
            "kl_max": self.kl_max,
            "top1_agreement": self.top1_same / self.n,
        }


def greedy_agreement(ref: list[list[int]], got: list[list[int]]) -> dict[str, float]:
    """Per prompt, the fraction of the reference continuation matched before the first differing token
    (``greedy_prefix``, mean over prompts) and the fraction of equal tokens position by position."""
    if len(ref) != len(got) or not ref:
        raise ValueError("greedy agreement needs the same non-empty number of continuations on both sides")
    prefix, same = [], []
    for a, b in zip(ref, got, strict=True):
        n = max(len(a), 1)
        k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        prefix.append(k / n)
        same.append(sum(x == y for x, y in zip(a, b, strict=False)) / n)
    return {"greedy_prefix": float(np.mean(prefix)), "greedy_same": float(np.mean(same))}
