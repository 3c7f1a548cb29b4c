"""Token sampling: greedy, temperature, top-k, top-p, min-p and repetition penalty, seeded.

``make_sampler(params)`` returns a function ``(logits, history) -> token id``; the decode loop only calls it.
The order of the transforms is that of Hugging Face's ``generate``: repetition penalty, temperature,
top-k, top-p, min-p.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

Sampler = Callable[[np.ndarray, Sequence[int]], int]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict:
        return asdict(self)


def apply_repetition_penalty(logits: np.ndarray, history: Sequence[int], penalty: float) -> np.ndarray:
    """Divide positive logits (multiply negative ones) of tokens already seen by ``penalty``."""
    if penalty == 1.0 or not len(history):
        return logits
    out = logits.copy()
    seen = np.unique(np.asarray(history, dtype=np.int64))
    vals = out[seen]
    out[seen] = np.where(vals > 0, vals / penalty, vals * penalty)
    return out


def filter_logits(logits: np.ndarray, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> np.ndarray:
    """Logits with the tokens removed by top-k, top-p and min-p set to -inf (the best token always stays)."""
    out = logits.astype(np.float64, copy=True)
    if top_k and top_k < len(out):
        kth = np.partition(out, -top_k)[-top_k]
        out[out < kth] = -np.inf
    if top_p < 1.0 or min_p > 0.0:
        order = np.argsort(-out, kind="stable")
        probs = np.exp(out[order] - out[order[0]])
        probs /= probs.sum()
        drop = np.zeros(len(out), dtype=bool)
        if top_p < 1.0:
            cum = np.cumsum(probs)
            drop |= (cum - probs) >= top_p  # keep the smallest prefix whose mass reaches top_p
        if min_p > 0.0:
            drop |= probs < min_p * probs[0]
        drop[0] = False
        out[order[drop]] = -np.inf
    return out


def make_sampler(params: SamplingParams) -> Sampler:
    """A sampler for ``params``: argmax when temperature is 0, else a seeded draw."""
    rng = np.random.default_rng(params.seed)

    def sample(logits: np.ndarray, history: Sequence[int]) -> int:
        x = apply_repetition_penalty(np.asarray(logits, dtype=np.float32), history, params.repetition_penalty)
        if params.greedy:
            return int(np.argmax(x))
        x = filter_logits(x.astype(np.float64) / params.temperature, params.top_k, params.top_p, params.min_p)
        p = np.exp(x - x.max())
        p /= p.sum()
        return int(rng.choice(len(p), p=p))

    return sample
