"""The cpu backend's compile progress: a bar naming the kernel being built, nothing when nothing compiles."""

from __future__ import annotations

import io

from workbench.backends.numba_cpu.compile_progress import CompileProgress
from workbench.numba_jit import numba


def test_compiling_draws_a_bar_naming_the_kernel_and_a_cached_run_draws_nothing():
    @numba.njit
    def fresh_kernel_for_the_progress_test(x):
        return x * 2 + 1

    out = io.StringIO()
    with CompileProgress(stream=out):
        assert fresh_kernel_for_the_progress_test(20) == 41
    text = out.getvalue()
    assert "compiling the cpu kernels for this host" in text
    assert "fresh_kernel_for_the_progress_test" in text and "kernels compiled" in text
    quiet = io.StringIO()
    with CompileProgress(stream=quiet):
        assert fresh_kernel_for_the_progress_test(1) == 3  # compiled already: no bar
    assert quiet.getvalue() == ""
