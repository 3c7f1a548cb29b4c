"""Resolve a model specification (a name, a path, or ``synthetic:<config>``) to a loaded :class:`Model`."""

from __future__ import annotations

from pathlib import Path

from .bundled import default_model_path
from .config import UnsupportedModelError
from .model import Model, load_gguf, load_hf
from .synth import synthetic_model_path

DEFAULT_MODEL = "gemma3-270m"


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
        return load_gguf(synthetic_model_path(str(where)), kind="synthetic", name=f"synthetic:{where}")
    return load_gguf(where, name=DEFAULT_MODEL if str(spec) in (DEFAULT_MODEL, "default") else "")
