"""Host KV cache: a growing buffer for global layers, a ring buffer of window size for sliding layers.

Layers that attend over another layer's cache (Gemma 3n's last ``kv_shared_layers``) have none of their own:
their entry in :attr:`KVCache.layers` is the owner's :class:`LayerKV`, read with :meth:`LayerKV.visible`.
"""

from __future__ import annotations

import numpy as np

from ..models.config import ModelConfig

ALIGN = 64  # bytes: a cache line, and a 512-bit vector


def zeros_aligned(shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
    """Zeros whose first byte starts a cache line (numpy's large arrays start 16 bytes past one), so that the
    decode kernels' 64-byte vector loads of a row never straddle two lines."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(n + ALIGN, np.uint8)
    skip = -raw.ctypes.data % ALIGN
    return raw[skip : skip + n].view(dtype).reshape(shape)


class ContextLimitError(ValueError):
    """A sequence would exceed the context length."""


class LayerKV:
    """Keys and values of one layer for one sequence.

    Global layers keep every position (grown in chunks up to ``max_len``). Sliding layers keep a ring of
    ``window + slack`` slots, so their memory does not grow with context; ``slack`` allows rolling back
    that many tokens (speculative decoding) without losing keys still inside the window.
    """

    def __init__(self, kv_dim: int, max_len: int, window: int = 0, slack: int = 0, dtype=np.float32):
        self.kv_dim, self.max_len, self.window, self.dtype = kv_dim, max_len, window, np.dtype(dtype)
        self.ring = window + slack if window else 0
        cap = self.ring if window else min(max_len, 256)
        self.keys = zeros_aligned((cap, kv_dim), self.dtype)
        self.values = zeros_aligned((cap, kv_dim), self.dtype)
        self.pos = np.full(cap, -1, np.int64)
        self.shared = False  # read by other layers too: keep what the last append returned for them
        self._last: tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None

    @property
    def capacity(self) -> int:
        return len(self.pos)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    def _grow(self, need: int) -> None:
        cap = self.capacity
        if need <= cap:
            return
        new = min(self.max_len, max(need, 2 * cap))
        for name in ("keys", "values"):
            old = getattr(self, name)
            buf = zeros_aligned((new, self.kv_dim), self.dtype)
            buf[:cap] = old
            setattr(self, name, buf)
        pos = np.full(new, -1, np.int64)
        pos[:cap] = self.pos
        self.pos = pos

    def reserve(self, length: int) -> None:
        """Make room for positions below ``length`` (kernels that write slots in place call this first)."""
        if not self.window:
            self._grow(length)

    def append(
        self, positions: np.ndarray, k: np.ndarray, v: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Store keys/values at ``positions`` and return every key, value and position a query may see.

        The returned keys include the new ones; older keys still in the cache come first.
        """
        first = int(positions[0])
        if self.window:
            held = (self.pos >= 0) & (self.pos < first) & (self.pos > first - self.window)
            order = np.argsort(self.pos[held], kind="stable")
            keys = np.concatenate([self.keys[held][order], k.astype(self.dtype)])
            vals = np.concatenate([self.values[held][order], v.astype(self.dtype)])
            kpos = np.concatenate([self.pos[held][order], positions.astype(np.int64)])
            self.write(positions, k, v)
        else:
            self.write(positions, k, v)
            end = int(positions[-1]) + 1
            keys, vals, kpos = self.keys[:end], self.values[:end], np.arange(end, dtype=np.int64)
        if self.shared:
            self._last = (np.array(positions, np.int64), (keys, vals, kpos))
        return keys, vals, kpos

    def visible(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What the last :meth:`append` returned, which must have been for these ``positions``: the keys,
        values and positions that layers sharing this cache attend over in the same step. (A sliding
        layer's ring may already have overwritten keys that the step's first queries still see.)"""
        if self._last is None or not np.array_equal(self._last[0], positions):
            raise RuntimeError(
                f"KV cache: positions {int(positions[0])}..{int(positions[-1])} read before the layer that "
                f"owns the cache appended them"
            )
        return self._last[1]

    def write(self, positions: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Store keys/values at ``positions`` (slot = position, or position mod ring on sliding layers).

        Kernels that attend over the slots in place (visibility from ``pos``) call this, then read
        ``keys``/``values``/``pos`` directly.
        """
        if self.window:
            keep = slice(max(0, len(positions) - self.ring), len(positions))
            slots = positions[keep] % self.ring
            self.keys[slots], self.values[slots], self.pos[slots] = k[keep], v[keep], positions[keep]
            return
        self._grow(int(positions[-1]) + 1)
        self.keys[positions], self.values[positions], self.pos[positions] = k, v, positions

    def truncate(self, length: int) -> None:
        """Forget positions >= length."""
        drop = self.pos >= length
        self.pos[drop] = -1


class KVCache:
    """The KV cache of one sequence: one :class:`LayerKV` per layer and the number of tokens held."""

    def __init__(self, config: ModelConfig, max_len: int, slack: int = 0, dtype=np.float32):
        if max_len > config.context_length:
            raise ContextLimitError(
                f"max_len {max_len} exceeds the model's context length {config.context_length}"
            )
        self.config, self.max_len = config, max_len
        self.layers: list[LayerKV] = []
        for i in range(config.n_layers):
            src = config.kv_layer(i)
            if src != i:  # shares the cache of an earlier layer
                self.layers[src].shared = True
                self.layers.append(self.layers[src])
                continue
            window = config.sliding_window if config.is_sliding(i) else 0
            self.layers.append(LayerKV(config.kv_dim, max_len, window, slack, dtype))
        self.length = 0

    def owned(self) -> list[LayerKV]:
        """Each layer cache once (shared ones are listed under every layer that reads them)."""
        return list({id(layer): layer for layer in self.layers}.values())

    def check_room(self, n_new: int) -> None:
        if self.length + n_new > self.max_len:
            raise ContextLimitError(
                f"sequence of {self.length + n_new} tokens exceeds the context limit of {self.max_len} tokens"
            )

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} tokens to {length}")
        for layer in self.owned():
            layer.truncate(length)
        self.length = length

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.owned())
