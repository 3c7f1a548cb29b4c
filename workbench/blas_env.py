"""OpenBLAS worker threads told to sleep right after their work (``OPENBLAS_THREAD_TIMEOUT``), and numba's
OpenMP workers to spin only briefly (``GOMP_SPINCOUNT``).

By default they busy-wait 2^28 cycles (~0.1 s) after every BLAS call. The cpu backend prefills with BLAS
GEMMs and decodes with its own numba threads, so on a small host the spinning BLAS threads take the cores
from the first decode steps after each prefill. With 2^4 cycles they sleep at once, and prefill is no slower
(figures: docs/backend-cpu.md#blas-and-openmp-spin).

OpenBLAS reads the variable when it loads, with numpy: this module is imported before numpy (first thing in
``workbench/__init__``). A value the user set is kept. ``SPINNING`` says whether the default spin applies in
this process (numpy was imported first, without the variable): the cpu backend then warns.
"""

from __future__ import annotations

import os
import sys

TIMEOUT_LOG2_CYCLES = "4"  # OpenBLAS's minimum
TIMEOUT_SET_HERE = "OPENBLAS_THREAD_TIMEOUT" not in os.environ
SPINNING = "numpy" in sys.modules and TIMEOUT_SET_HERE
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", TIMEOUT_LOG2_CYCLES)

# numba's OpenMP workers (GNU libgomp) likewise spin after each parallel loop, 300,000 rounds by default
# (~0.1 ms), taking the cores from OpenBLAS's workers when a prefill's GEMM follows a numba loop (tile
# dequantization, attention). 1,000 rounds (a few us) is still longer than the serial gaps between the
# parallel loops of a decode step: prefill gains, decode is unchanged (figures: docs/backend-cpu.md#blas-and-openmp-spin).
# libgomp reads it when it loads, with numba's threading layer. A spin count or wait policy the user set is
# kept (libgomp derives the count from OMP_WAIT_POLICY only while GOMP_SPINCOUNT is unset).
GOMP_SPIN_ROUNDS = "1000"
GOMP_SPIN_SET_HERE = "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ
if GOMP_SPIN_SET_HERE:
    os.environ["GOMP_SPINCOUNT"] = GOMP_SPIN_ROUNDS


def foreign_env() -> dict[str, str]:
    """This process's environment without the variables set here: for a child that runs another program's
    threads (llama.cpp's are libgomp's too, and decoded 1.5-2% slower with our 1,000 spin rounds)."""
    env = dict(os.environ)
    if GOMP_SPIN_SET_HERE:
        env.pop("GOMP_SPINCOUNT", None)
    if TIMEOUT_SET_HERE:
        env.pop("OPENBLAS_THREAD_TIMEOUT", None)
    return env


def gomp_spin() -> str:
    """The spin of numba's OpenMP workers in this process, for reports (the omp threading layer only)."""
    if "GOMP_SPINCOUNT" in os.environ:
        return os.environ["GOMP_SPINCOUNT"]
    return f"libgomp's, from OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '')}"


def thread_timeout() -> str:
    """The spin OpenBLAS uses in this process, for reports: log2 of cycles, and where it came from."""
    if SPINNING:
        return "28 (OpenBLAS default: numpy was imported before workbench)"
    return os.environ["OPENBLAS_THREAD_TIMEOUT"]


# OpenBLAS core types whose single-precision GEMM kernels use AVX-512
AVX512_CORES = frozenset({"skylakex", "cooperlake", "sapphirerapids"})


def narrow_pin(host_features: str, architectures: list[str]) -> str | None:
    """A notice when ``OPENBLAS_CORETYPE`` pins OpenBLAS (``architectures``: the kernels of the OpenBLAS
    libraries loaded, as threadpoolctl names them) to kernels without AVX-512 on a host that has it
    (``host_features``: LLVM's feature string of the host), else None. The value is the user's (or their
    platform's), so it is kept; prefill's GEMMs pay for it (figures: docs/backend-cpu.md#blas-and-openmp-spin)."""
    core = os.environ.get("OPENBLAS_CORETYPE", "").strip()
    narrow = [a for a in architectures if a and a.lower() not in AVX512_CORES]
    if not core or not narrow or "+avx512f" not in host_features.split(","):
        return None
    return (
        f"OPENBLAS_CORETYPE={core} pins OpenBLAS to its {narrow[0]} kernels (no AVX-512) on this AVX-512 host: "
        "the cpu backend's prefill GEMMs run ~1.6x slower than with the variable unset (OpenBLAS then picks "
        "its SkylakeX kernels). Unset it unless it was pinned on purpose."
    )
