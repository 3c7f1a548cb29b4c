"""Robust summaries for noisy machines: medians with bootstrap confidence intervals."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def median_ci(
    samples: Sequence[float], ci: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> dict[str, float]:
    """Median of ``samples`` and a percentile-bootstrap interval of the median."""
    x = np.asarray(samples, dtype=np.float64)
    if len(x) == 0:
        return {"median": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    rng = np.random.default_rng(seed)
    boots = np.median(rng.choice(x, size=(n_boot, len(x)), replace=True), axis=1)
    a = (1 - ci) / 2
    return {
        "median": float(np.median(x)),
        "lo": float(np.quantile(boots, a)),
        "hi": float(np.quantile(boots, 1 - a)),
        "n": len(x),
    }


def ratio_ci(
    ours: Sequence[float], theirs: Sequence[float], ci: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> dict[str, float]:
    """median(ours) / median(theirs), with a bootstrap interval resampling both sides independently."""
    a, b = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    if len(a) == 0 or len(b) == 0:
        return {"ratio": float("nan"), "lo": float("nan"), "hi": float("nan")}
    rng = np.random.default_rng(seed)
    ra = np.median(rng.choice(a, size=(n_boot, len(a))), axis=1)
    rb = np.median(rng.choice(b, size=(n_boot, len(b))), axis=1)
    r = ra / rb
    q = (1 - ci) / 2
    return {
        "ratio": float(np.median(a) / np.median(b)),
        "lo": float(np.quantile(r, q)),
        "hi": float(np.quantile(r, 1 - q)),
    }


def percentiles(samples: Sequence[float], ps: Sequence[int] = (50, 90, 99)) -> dict[str, float]:
    x = np.asarray(samples, dtype=np.float64)
    if len(x) == 0:
        return {f"p{p}": float("nan") for p in ps}
    return {f"p{p}": float(np.percentile(x, p)) for p in ps}
