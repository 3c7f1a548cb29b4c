"""Where the workbench keeps caches and results."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(sub: str = "") -> Path:
    """``$WORKBENCH_CACHE`` (default ``~/.cache/workbench``), or a sub-folder of it, created on demand."""
    root = Path(os.environ.get("WORKBENCH_CACHE") or Path.home() / ".cache" / "workbench")
    path = root / sub if sub else root
    path.mkdir(parents=True, exist_ok=True)
    return path
