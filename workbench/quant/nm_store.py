"""Compressed storage of N:M sparse matrices: only the N kept values of every M inputs, and where they are.

A (rows, cols) weight in which every group of M consecutive inputs of a row holds at most N nonzeros
(:func:`workbench.sparsity.nm.prune_nm` makes one) is stored as

* ``values`` (rows, cols * N / M): the kept values of each group in input order (a group with fewer than
  N nonzeros keeps some zeros, so every group has exactly N slots);
* ``idx`` uint8 (rows, cols * N / M / 2): each slot's position inside its group (0 .. M-1) as a 4-bit
  code, two per byte: slot ``2i`` in the low nibble of byte ``i``, slot ``2i + 1`` in the high nibble.
  For 2:4 this is one byte per group (first kept position low, second high).

The values plane is then stored in a planar value format (fp32, fp16, bf16, int8 per channel), so a kernel
reads N/M of the value bytes plus 4 bits per kept value instead of the dense row.
"""

from __future__ import annotations

import numpy as np

MAX_M = 16  # positions are 4-bit codes


class NMError(ValueError):
    """A matrix or an N:M pattern that the compressed storage cannot represent."""


def check_pattern(n: int, m: int, cols: int, what: str = "tensor") -> None:
    """Clear errors for patterns this storage cannot hold, or that do not divide ``cols``."""
    if not 0 < n < m <= MAX_M:
        raise NMError(f"{what}: N:M {n}:{m} needs 0 < N < M <= {MAX_M} (positions are 4-bit codes)")
    if cols % m:
        raise NMError(
            f"{what}: N:M {n}:{m} does not divide the input dimension {cols} (not a multiple of {m})"
        )
    if (cols // m * n) % 2:
        raise NMError(f"{what}: N:M {n}:{m} over {cols} inputs keeps an odd number of values per row")


def compress(w: np.ndarray, n: int, m: int, what: str = "tensor") -> tuple[np.ndarray, np.ndarray]:
    """``(values, idx)`` of ``w`` (rows, cols), which must have at most ``n`` nonzeros in each group."""
    rows, cols = w.shape
    check_pattern(n, m, cols, what)
    g = w.reshape(rows, cols // m, m)
    nonzero = g != 0
    if (nonzero.sum(axis=2) > n).any():
        raise NMError(
            f"{what}: more than {n} nonzeros in a group of {m} inputs: not {n}:{m} sparse (prune first)"
        )
    # the nonzeros first, then zeros, each in input order; the first n positions, sorted, are the slots
    order = np.argsort(~nonzero, axis=2, kind="stable")[:, :, :n]
    pos = np.sort(order, axis=2)
    values = np.take_along_axis(g, pos, axis=2).reshape(rows, -1)
    codes = pos.reshape(rows, -1).astype(np.uint8)
    idx = codes[:, 0::2] | (codes[:, 1::2] << np.uint8(4))
    return np.ascontiguousarray(values), np.ascontiguousarray(idx)


def positions(idx: np.ndarray, n: int, m: int) -> np.ndarray:
    """Column of every kept slot: (rows, kept) int64."""
    rows = idx.shape[0]
    codes = np.empty((rows, 2 * idx.shape[1]), np.int64)
    codes[:, 0::2] = idx & 15
    codes[:, 1::2] = idx >> 4
    group = np.arange(codes.shape[1]) // n
    return group * m + codes


def expand(values: np.ndarray, idx: np.ndarray, n: int, m: int) -> np.ndarray:
    """The dense (rows, cols) matrix of compressed ``values`` / ``idx`` (zeros where nothing is kept)."""
    rows, kept = values.shape
    out = np.zeros((rows, kept // n * m), values.dtype)
    np.put_along_axis(out, positions(idx, n, m), values, axis=1)
    return out
