"""The table matvec of the step programs (matvec.matvec_table, int16 and float activations): every row of
every weight once, equal to the one-weight kernels, for small tables (equal shares) and the LM head's size (claimed tasks)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.backends.numba_cpu import matvec as mv
from workbench.backends.numba_cpu import matvec_table as mt
from workbench.backends.numba_cpu.instructions import MAX_W
from workbench.models.synth import random_blocks
from workbench.numba_jit import numba
from workbench.quant.formats import GGMLType

Q8_0 = int(GGMLType.Q8_0)


def _table(weights: list[np.ndarray]) -> np.ndarray:
    wt = np.zeros((MAX_W, 5), np.int64)
    for j, w in enumerate(weights):
        wt[j] = (Q8_0, w.ctypes.data, w.shape[1], w.shape[0], w.shape[1] // 34)
    return wt


@pytest.mark.parametrize("rows", [[40, 7, 300], [mt.CLAIMED_ROWS + 123]])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("prefetch", [False, True])
def test_table_matvec_writes_each_row_once_as_the_one_weight_kernel(rows, threads, prefetch):
    rng = np.random.default_rng(len(rows))
    cols = 64
    weights = [random_blocks(GGMLType.Q8_0, n, cols, rng) for n in rows]
    x = rng.standard_normal((1, cols)).astype(np.float32)
    xq, xd = np.empty(x.shape, np.int16), np.empty((1, cols // 32), np.float32)
    xs = np.empty_like(xd)
    mv.quantize_rows_i16(x, 32767, xq, xd, xs)
    outs = [np.full((1, n), np.nan, np.float32) for n in rows]
    other = np.ones(1000, np.float32)  # a region the tasks prefetch (hints only: the results stay the same)
    region = (
        np.array([other.ctypes.data, other.ctypes.data + 4, 3000], np.int64) if prefetch else mt.NO_PREFETCH
    )
    padded = tuple(outs[min(j, len(outs) - 1)] for j in range(3))
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        mt.matvec_table(_table(weights), len(rows), padded, x, 32767, xq, xd, xs, 16, region, mt.NO_MAXIMA)
        floats = tuple(np.full_like(o, np.nan) for o in padded)
        mv.block_sums(x, xs)
        mt.matvec_table(_table(weights), len(rows), floats, x, 0, xq, xd, xs, 16, region, mt.NO_MAXIMA)
    finally:
        numba.set_num_threads(before)
    mv.quantize_rows_i16(x, 32767, xq, xd, xs)
    for w, o in zip(weights, outs, strict=True):
        want = np.empty_like(o)
        mv.matvec(Q8_0, w, cols // 32, x, 32767, xq, xd, xs, want)
        np.testing.assert_array_equal(o, want)
    mv.block_sums(x, xs)
    for j, w in enumerate(weights):
        want = np.empty((1, w.shape[0]), np.float32)
        mv.matvec(Q8_0, w, cols // 32, x, 0, xq, xd, xs, want)
        np.testing.assert_array_equal(floats[j], want)


@numba.njit
def _claims(n_tasks, pattern, extra):  # pragma: no cover - compiled
    """Claims on one counter of ``n_tasks`` tasks, from the front (pattern 1) or back (0) in turn, until
    both ends fail, then ``extra`` more each: the tasks claimed, in order, and every claim's result."""
    counter = mt.task_counter(n_tasks)
    got = []
    i = 0
    while True:
        t = mt.claim_task(counter, pattern[i % len(pattern)] == 1)
        got.append(t)
        i += 1
        if t < 0 and got.count(-1) >= 2 + extra:
            return got


@pytest.mark.parametrize("pattern", [[1], [0], [1, 0], [1, 1, 0], [0, 0, 0, 1]])
@pytest.mark.parametrize("n_tasks", [1, 2, 7, 256])
def test_claims_from_both_ends_take_every_task_once(n_tasks, pattern):
    got = _claims(n_tasks, np.array(pattern, np.int64), 12)
    tasks = [t for t in got if t >= 0]
    assert sorted(tasks) == list(range(n_tasks))  # each task once, none skipped
    assert all(t == -1 for t in got[len(tasks) :])  # and nothing after the tasks ran out (ends crossed)
    if pattern == [1, 0] and n_tasks >= 4:
        assert tasks[:4] == [0, n_tasks - 1, 1, n_tasks - 2]  # the front and the back in turn


@pytest.mark.parametrize("rows", [300, mt.CLAIMED_ROWS + 123])
@pytest.mark.parametrize("threads", [1, 2])
def test_task_maxima_give_numpys_argmax(rows, threads):
    """The LM head's tasks record their largest output; the argmax found from them is np.argmax's (the first
    of equal maxima), and -1 (np.argmax decides) when an output is NaN or infinite."""
    rng = np.random.default_rng(rows)
    cols = 64
    w = random_blocks(GGMLType.Q8_0, rows, cols, rng)
    x = rng.standard_normal((1, cols)).astype(np.float32)
    xq, xd = np.empty(x.shape, np.int16), np.empty((1, cols // 32), np.float32)
    xs = np.empty_like(xd)
    mv.quantize_rows_i16(x, 32767, xq, xd, xs)
    size, starts, _ = mt.table_tasks(_table([w]), 1, 16)
    n_tasks = int(starts[1])
    maxima = np.empty(n_tasks, np.float32)
    out = np.empty((1, rows), np.float32)

    def argmax(weight: np.ndarray, buf: np.ndarray) -> tuple[int, int]:
        wt = _table([weight])
        n = mt.matvec_table(wt, 1, (out, out, out), x, 32767, xq, xd, xs, 16, mt.NO_PREFETCH, buf)
        return n, (mt.argmax_of_tasks(wt, 16, buf, n, out[0]) if n else -1)

    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        assert argmax(w, maxima) == (n_tasks, np.argmax(out[0]))
        assert argmax(w, mt.NO_MAXIMA)[0] == 0  # not asked for
        assert argmax(w, maxima[: n_tasks - 1])[0] == 0  # no room for every task
        for bad in (0x7E00, 0x7C00):  # a block scale of NaN, of +inf: that row's output is not finite
            broken = w.copy()
            broken[rows // 2, :2] = np.frombuffer(np.uint16(bad).tobytes(), np.uint8)
            n, found = argmax(broken, maxima)
            assert n == n_tasks and found == -1 and not np.isfinite(out[0, rows // 2])
    finally:
        numba.set_num_threads(before)
    ties = out[0].copy()
    ties[rows // 2] = 0.0
    ties[[rows // 3, rows - 1]] = np.nanmax(ties) + 1  # equal maxima in different tasks: the first wins
    per_task = np.array([ties[r : r + size[0]].max() for r in range(0, rows, size[0])], np.float32)
    assert mt.argmax_of_tasks(_table([w]), 16, per_task, n_tasks, ties) == np.argmax(ties) == rows // 3
