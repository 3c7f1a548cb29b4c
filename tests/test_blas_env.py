"""OpenBLAS threads are told to sleep after their work (workbench.blas_env), and the cpu backend says when not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import write_tiny_gguf

import workbench as wb
from workbench import blas_env
from workbench.backends import make_backend

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, **env: str) -> list[str]:
    unset = ("OPENBLAS_THREAD_TIMEOUT", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
    clean = {k: v for k, v in os.environ.items() if k not in unset}
    done = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, cwd=ROOT, capture_output=True,
                          text=True, check=True, timeout=120)  # fmt: skip
    return done.stdout.split()


def test_importing_workbench_first_sets_the_timeout():
    out = _python("import os, workbench; from workbench import blas_env as b; "
                  "print(os.environ['OPENBLAS_THREAD_TIMEOUT'], b.SPINNING, b.thread_timeout())")  # fmt: skip
    assert out == ["4", "False", "4"]


def test_numba_workers_spin_briefly_unless_the_user_chose():
    show = "import os, workbench; print(os.environ.get('GOMP_SPINCOUNT', 'unset'))"
    assert _python(show) == ["1000"]
    assert _python(show, GOMP_SPINCOUNT="7") == ["7"]
    assert _python(show, OMP_WAIT_POLICY="ACTIVE") == ["unset"]  # libgomp derives its spin from the policy


def test_the_llama_cpp_child_gets_libgomps_own_spin_unless_the_user_chose():
    show = ("import workbench; from workbench import blas_env as b; e = b.foreign_env(); "
            "print(e.get('GOMP_SPINCOUNT', 'unset'), e.get('OPENBLAS_THREAD_TIMEOUT', 'unset'))")  # fmt: skip
    assert _python(show) == ["unset", "unset"]  # ours are for our threads only
    assert _python(show, GOMP_SPINCOUNT="7", OPENBLAS_THREAD_TIMEOUT="9") == ["7", "9"]


def test_the_llama_cpp_worker_imports_nothing_of_workbench():
    from workbench.bench.llama_cpp import WORKER

    code = (
        f"import runpy, sys; sys.argv = ['w']; runpy.run_path({str(WORKER)!r}, run_name='not_main'); "
        "print('workbench' in sys.modules)"
    )
    assert _python(code) == ["False"]


def test_numpy_imported_first_is_reported():
    out = _python(
        "import numpy, workbench; from workbench import blas_env as b; print(b.SPINNING, b.thread_timeout())"
    )
    assert out[:2] == ["True", "28"]


def test_a_value_the_user_set_is_kept():
    out = _python(
        "import os, workbench; print(os.environ['OPENBLAS_THREAD_TIMEOUT'])", OPENBLAS_THREAD_TIMEOUT="12"
    )
    assert out == ["12"]


def test_cpu_backend_warns_when_openblas_spins(tmp_path, monkeypatch):
    model = wb.load(write_tiny_gguf(tmp_path / "tiny.gguf"))
    monkeypatch.setattr(blas_env, "SPINNING", True)
    with pytest.warns(UserWarning, match="OPENBLAS_THREAD_TIMEOUT=4"):
        backend = make_backend("cpu", model, threads=1)
    assert backend.device.details["openblas_thread_timeout"].startswith("28")


@pytest.mark.parametrize(
    ("core", "kernels", "features", "warned"),
    [
        ("Haswell", ["Haswell"], "+avx2,+avx512f,+avx512bw", True),
        ("zen", ["Zen"], "+avx2,+avx512f", True),
        ("SkylakeX", ["SkylakeX"], "+avx2,+avx512f", False),  # AVX-512 kernels already
        ("Haswell", ["Haswell"], "+avx2,-avx512f", False),  # the host has no AVX-512: nothing lost
        ("", ["Haswell"], "+avx2,+avx512f", False),  # not pinned by the variable
        ("Haswell", [], "+avx2,+avx512f", False),  # no OpenBLAS loaded (another BLAS)
    ],
)
def test_openblas_pinned_below_the_host_is_reported(monkeypatch, core, kernels, features, warned):
    monkeypatch.setenv("OPENBLAS_CORETYPE", core)
    notice = blas_env.narrow_pin(features, kernels)
    assert (notice is not None) == warned
    if warned:
        assert f"OPENBLAS_CORETYPE={core}" in notice and kernels[0] in notice and "Unset it" in notice
