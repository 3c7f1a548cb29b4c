"""The table matvec of the step programs: up to MAX_W weights of one activation row (a table row each: see
:data:`.matvec.W_FMT`) in one parallel loop over tasks of rows, with the KV prefetch a task can carry and the
per-task maxima from which the greedy argmax is read (figures: docs/backend-cpu.md#the-lm-head)."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ...numba_jit import numba
from .addr import prefetch
from .matvec import W_FMT, W_ROWS, rows_at, task_count, task_size

njit, prange = numba.njit, numba.prange


CLAIMED_ROWS = 65536  # tables of more rows (the LM head) hand out tasks from a shared counter
CLAIM_TASKS = 256  # tasks of such a table


@intrinsic
def _fetch_add(typingctx, counter, delta):
    """Atomically add ``delta`` to ``counter[8]`` (an int64 array of 16: the counter alone on its cache line)
    and return its previous value."""

    def codegen(context, b, signature, args):
        data = context.make_array(signature.args[0])(context, b, args[0]).data
        p = b.gep(data, [ir.Constant(ir.IntType(64), 8)])
        return b.atomic_rmw("add", p, args[1], "monotonic")

    return types.int64(types.Array(types.int64, 1, "C"), types.int64), codegen


@njit(cache=True)
def claim_task(counter, front):  # pragma: no cover - compiled
    """The next task, from the front or from the back of the tasks left, or -1 when none is left. The counter
    holds the first task left in its low 32 bits and the end of those left in its high ones; a claim moves
    one of the two and checks them as they were just before it, so no task is claimed twice."""
    old = _fetch_add(counter, np.int64(1) if front else np.int64(-(1 << 32)))
    lo, hi = old & 0xFFFFFFFF, old >> 32
    if lo >= hi:
        return -1
    return lo if front else hi - 1


@njit(cache=True)
def table_tasks(wt, n_w, rpt):  # pragma: no cover - compiled
    """Task sizes (rows) of the first ``n_w`` weights of ``wt``, the index of each weight's first task, and
    whether threads claim tasks (tables of more than CLAIMED_ROWS rows) or take equal shares of them."""
    rows = 0
    for j in range(n_w):
        rows += wt[j, W_ROWS]
    claim = rows > CLAIMED_ROWS
    size = np.empty(n_w, np.int64)
    starts = np.zeros(n_w + 1, np.int64)
    for j in range(n_w):
        size[j] = task_size(wt[j, W_FMT], max(rpt, task_count(wt[j, W_ROWS], CLAIM_TASKS)) if claim else rpt)
        starts[j + 1] = starts[j] + task_count(wt[j, W_ROWS], size[j])
    return size, starts, claim


@njit(cache=True)
def task_counter(n_tasks):  # pragma: no cover - compiled
    """A claim counter over ``n_tasks`` tasks (allocated outside the parallel functions: np.zeros there is a
    parallel loop)."""
    c = np.zeros(16, np.int64)
    c[8] = n_tasks << 32
    return c


@njit(cache=True)
def _task_rows(wt, size, starts, i):  # pragma: no cover - compiled
    """(weight, first row, end row) of task ``i``."""
    j = 0
    while i >= starts[j + 1]:
        j += 1
    r0 = (i - starts[j]) * size[j]
    return j, r0, min(wt[j, W_ROWS], r0 + size[j])


@njit(cache=True)
def _table_task(wt, size, starts, i, outs, x, levels, xq, xd, xs):  # pragma: no cover - compiled
    j, r0, r1 = _task_rows(wt, size, starts, i)
    rows_at(wt[j], r0, r1, x, levels, xq, xd, xs, outs[j], r0)


# parallel iterations that claim tasks: threads beyond this count idle in these loops; a thread's iterations
# after the tasks ran out return at their first claim (numba.get_num_threads() in place of this constant
# would keep the kernels out of numba's cache). numba's static schedule hands each thread a contiguous
# share of the iterations: with two threads one claims from the front of the tasks and the other from the
# back (with more threads, or a dynamic schedule, several claim from each end: still each task once).
WORKERS = 16


NO_PREFETCH = np.zeros(3, np.int64)  # the prefetch region of a table matvec: none (see prefetch_share)
# a table matvec's per-task maxima: not wanted (from Python; compiled callers pass an empty slice of their own
# buffer, as numba freezes global arrays read-only)
NO_MAXIMA = np.zeros(0, np.float32)
PREFETCH_MAX = 1 << 20  # bytes of a prefetch region at most (both arrays): of larger ones, the first rows


@njit(cache=True, inline="always")
def prefetch_share(pf, i, n_tasks):  # pragma: no cover - compiled
    """Prefetch task ``i``'s share of the cache lines of two arrays (addresses ``pf[0]``, ``pf[1]``, ``pf[2]``
    bytes each): the KV rows of the next decode attention, during the gate/up projection before it (the
    cache is cold: a token's weights streamed through since). With the static schedule the first thread
    prefetches the first half of the rows, which the first half of the attention's key ranges (its share
    there too) reads. Figures: docs/backend-cpu.md#prefetching."""
    lines = pf[2] // 64 + 1  # a region not aligned to 64 bytes ends in one more line
    for ln in range(i * lines // n_tasks, (i + 1) * lines // n_tasks):
        prefetch(pf[0] + ln * 64)
        prefetch(pf[1] + ln * 64)


@njit(cache=True)
def _wants_maxima(maxima, n_w, n_tasks, n_act):  # pragma: no cover - compiled
    """Whether a table matvec records each task's largest output in ``maxima``: asked for (room for every
    task), for one weight and one activation row (a decode step's LM head: the greedy token's argmax)."""
    return maxima.shape[0] > 0 and maxima.shape[0] >= n_tasks and n_w == 1 and n_act == 1


@njit(cache=True)
def _all_finite(row, r0, r1):  # pragma: no cover - compiled
    """Whether ``row[r0:r1]`` holds no NaN or infinity (the exponent bits, as integers: a vector loop)."""
    bits = row[r0:r1].view(np.int32)
    top = np.int32(0)
    for i in range(bits.shape[0]):
        top = max(top, bits[i] & np.int32(0x7F800000))
    return top != np.int32(0x7F800000)


@njit(cache=True, fastmath=True)
def _largest(row, r0, r1):  # pragma: no cover - compiled
    """max(row[r0:r1]) of finite values (a vector loop)."""
    m = row[r0]
    for i in range(r0 + 1, r1):
        m = max(m, row[i])
    return m


@njit(cache=True)
def _task_max(wt, size, starts, i, outs, maxima):  # pragma: no cover - compiled
    """maxima[i] = the largest output of task ``i``, NaN when one is not finite (read while the task's rows
    are in this core's cache, instead of a cold pass over all the outputs afterwards)."""
    j, r0, r1 = _task_rows(wt, size, starts, i)
    row = outs[j][0]
    maxima[i] = _largest(row, r0, r1) if _all_finite(row, r0, r1) else np.float32(np.nan)


@njit(cache=True)
def argmax_of_tasks(wt, rpt, maxima, n_tasks, out):  # pragma: no cover - compiled
    """np.argmax of the output row ``out`` of a table matvec that recorded the maxima of its ``n_tasks`` tasks
    (:func:`matvec_table`'s return): the first task holding the largest, then its first row holding it;
    -1 when an output is not finite (np.argmax then decides: a NaN wins there)."""
    size, starts, _ = table_tasks(wt, np.int64(1), rpt)
    best, at = np.float32(-np.inf), -1
    for i in range(n_tasks):
        m = maxima[i]
        if m != m:
            return -1
        if m > best:
            best, at = m, i
    if at < 0:
        return -1
    _, r0, r1 = _task_rows(wt, size, starts, at)
    for r in range(r0, r1):
        if out[r] == best:
            return r
    return -1


@njit(parallel=True, cache=True)
def matvec_table(wt, n_w, outs, x, levels, xq, xd, xs, rpt, pf, maxima):  # pragma: no cover - compiled
    """``outs[j][t, :] = W_j . activation row t`` for the first ``n_w`` weights of table ``wt`` (a row per
    weight: format, address, row bytes, rows, units; activations as :func:`rows_at` takes them), in one
    parallel loop over tasks of ``rpt`` rows, each thread an equal share. For the LM head (a table of more
    than CLAIMED_ROWS rows) threads instead claim big tasks from a shared counter, so a slower thread leaves
    work to the other (for small tables an atomic crossing cores per task cost more than it saved), the
    first half of the iterations from the front of the tasks, the second half from the back, so that each
    thread streams one contiguous stretch of the weight (figures: docs/backend-cpu.md#the-lm-head).
    ``pf``: a region whose lines the tasks of a table of equal shares prefetch (:func:`prefetch_share`).
    ``maxima``: see :func:`_wants_maxima`; returns the number of tasks whose maxima it holds (0: none)."""
    size, starts, claim = table_tasks(wt, n_w, rpt)
    fill = _wants_maxima(maxima, n_w, starts[n_w], x.shape[0])
    if claim:
        counter = task_counter(starts[n_w])
        for it in prange(WORKERS):
            front = it < WORKERS // 2
            i = claim_task(counter, front)
            while i >= 0:
                _table_task(wt, size, starts, i, outs, x, levels, xq, xd, xs)
                if fill:
                    _task_max(wt, size, starts, i, outs, maxima)
                i = claim_task(counter, front)
    else:
        for i in prange(starts[n_w]):
            _table_task(wt, size, starts, i, outs, x, levels, xq, xd, xs)
            if fill:
                _task_max(wt, size, starts, i, outs, maxima)
            if pf[2] > 0:
                prefetch_share(pf, i, starts[n_w])
    return starts[n_w] if fill else 0
