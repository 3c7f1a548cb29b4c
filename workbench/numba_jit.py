"""numba, imported with LLVM's SLP vectorizer on (numba disables it by default; our quantized kernels need it).

numba's cache key ignores ``NUMBA_SLP_VECTORIZE``, so the variable is set before numba is first imported
(``workbench/__init__`` sets it too); a process that imported numba earlier without it gets a warning.
numba's cache also ignores changes to code a kernel calls from other files (our LLVM intrinsics), so the
cache folder is keyed by a hash of the kernel sources, numba's version and that variable.
"""

from __future__ import annotations

import os
import sys
import warnings

_preloaded = "numba" in sys.modules
os.environ.setdefault("NUMBA_SLP_VECTORIZE", "1")

import hashlib  # noqa: E402
from pathlib import Path  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402

from .paths import cache_dir  # noqa: E402


def _kernel_digest() -> str:
    here = Path(__file__).parent
    h = hashlib.blake2b(digest_size=8)
    # the kernels' sources (the cpu backend's package) and the constants they compile in (block layouts and
    # format codes): not other backends' files, whose edits must not make a user wait for a recompile
    kernels = [Path(__file__), here / "quant" / "repack.py", here / "quant" / "formats.py"]
    for f in sorted([*kernels, *(here / "backends" / "numba_cpu").glob("*.py")]):
        h.update(f.read_bytes())
    env = "|".join(os.environ.get(v, "") for v in ("NUMBA_SLP_VECTORIZE", "WORKBENCH_CPU_KERNELS"))
    h.update(f"{numba.__version__}|{env}".encode())
    return h.hexdigest()


if not os.environ.get("NUMBA_CACHE_DIR"):
    numba.config.CACHE_DIR = str(cache_dir("numba") / _kernel_digest())

if _preloaded and os.environ.get("NUMBA_SLP_VECTORIZE") != "1":
    warnings.warn(
        "numba was imported before workbench without NUMBA_SLP_VECTORIZE=1: CPU kernels will be slow",
        stacklevel=2,
    )


@numba.njit(parallel=True, cache=True, fastmath=True)
def stream_sum(a):  # pragma: no cover - compiled
    """Sum of a float32 array across threads (a prange reduction): measures streaming read bandwidth."""
    s = np.float32(0.0)
    for i in numba.prange(a.shape[0]):
        s += a[i]
    return s


@numba.njit(parallel=True, cache=True)
def _touch(a):  # pragma: no cover - compiled
    for i in numba.prange(a.shape[0]):
        a[i, 0] += 1.0


@numba.njit(cache=True)
def fork_joins(a, n):  # pragma: no cover - compiled
    """``n`` parallel loops of one cache line a thread (``a``: threads x 16 float32): measures the round trip
    of handing work to the threads and waiting for them."""
    for _ in range(n):
        _touch(a)


__all__ = ["fork_joins", "numba", "stream_sum"]
