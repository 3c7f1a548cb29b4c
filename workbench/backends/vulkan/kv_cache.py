"""The KV cache on the device: one buffer per layer (keys, then values; float32, or float16 with the
``kv.fp16`` tunable), pooled for reuse.

Global layers hold every position (slot = position); sliding layers a ring of ``window + MAX_RING_STEP +
slack`` slots (slot = position % ring), enough for a step of up to ``MAX_RING_STEP`` tokens and a rollback of
``slack`` tokens. Device buffers are taken from a pool keyed by shape and returned when the cache object is
collected, so programs recorded for a pooled buffer set stay valid across sequences. Only layers that own
their keys and values get buffers: a Gemma 3n layer that shares KV has its owner's entry (``kv_layer``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from ...models.config import ModelConfig
from ...runtime.kv_cache import ContextLimitError
from .memory import Buffer

MAX_RING_STEP = 512


@dataclass
class LayerSlots:
    """``slots`` positions of keys and values; ``wraps``: a sliding ring smaller than the context;
    ``fp16``: float16 elements (else float32)."""

    buffer: Buffer
    slots: int
    wraps: bool
    kv_dim: int
    fp16: bool = False

    @property
    def v_off(self) -> int:
        """Offset of the values in the layer's buffer, in elements (float32 or float16)."""
        return self.slots * self.kv_dim

    @property
    def defines(self) -> tuple[str, ...]:
        """Shader defines of the kernels that read or write this cache."""
        return ("KV_F16",) if self.fp16 else ()


@dataclass
class DeviceKV:
    """A set of per-layer device buffers (``id`` identifies it in recorded programs)."""

    id: int
    key: tuple[int, int]
    layers: list[LayerSlots]

    @property
    def nbytes(self) -> int:
        return sum(la.buffer.size for la in self.owned())

    def owned(self) -> list[LayerSlots]:
        """Each layer's buffers once (sharing layers' entries are their owners')."""
        return list({id(la): la for la in self.layers}.values())


class VulkanKVCache:
    """One sequence's cache: the engine-facing interface of :class:`workbench.runtime.kv_cache.KVCache`."""

    def __init__(self, config: ModelConfig, device_kv: DeviceKV, max_len: int, release):
        self.config, self.device_kv, self.max_len = config, device_kv, max_len
        self.length = 0
        weakref.finalize(self, release, device_kv)

    def check_room(self, n_new: int) -> None:
        if self.length + n_new > self.max_len:
            raise ContextLimitError(
                f"sequence of {self.length + n_new} tokens exceeds the context limit of {self.max_len} tokens"
            )

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} tokens to {length}")
        self.length = length

    @property
    def nbytes(self) -> int:
        return self.device_kv.nbytes


class KVPool:
    """Allocates :class:`DeviceKV` buffer sets (float16 elements with ``fp16``) and keeps released ones for
    reuse."""

    def __init__(self, dev, config: ModelConfig, fp16: bool = False):
        self.dev, self.config, self.fp16 = dev, config, fp16
        self._free: dict[tuple[int, int], list[DeviceKV]] = {}
        self._all: list[DeviceKV] = []

    def new_cache(self, max_len: int, slack: int = 0) -> VulkanKVCache:
        c = self.config
        if max_len > c.context_length:
            raise ContextLimitError(
                f"max_len {max_len} exceeds the model's context length {c.context_length}"
            )
        key = (max_len, slack)
        free = self._free.setdefault(key, [])
        kv = free.pop() if free else self._allocate(key)
        return VulkanKVCache(c, kv, max_len, self._release)

    def _allocate(self, key: tuple[int, int]) -> DeviceKV:
        max_len, slack = key
        c = self.config
        layers = []
        for i in range(c.n_layers):
            if c.kv_layer(i) != i:  # shares an earlier layer's cache
                layers.append(layers[c.kv_layer(i)])
                continue
            ring = min(max_len, c.sliding_window + MAX_RING_STEP + slack) if c.is_sliding(i) else max_len
            size = 2 * ring * c.kv_dim * (2 if self.fp16 else 4)
            buf = Buffer(self.dev, size, name=f"kv cache layer {i}", spill=True)  # host-visible if no room
            layers.append(LayerSlots(buf, ring, ring < max_len, c.kv_dim, self.fp16))
        kv = DeviceKV(len(self._all), key, layers)
        self._all.append(kv)
        return kv

    def _release(self, kv: DeviceKV) -> None:
        self._free.setdefault(kv.key, []).append(kv)

    def destroy(self) -> None:
        for kv in self._all:
            for la in kv.owned():
                la.buffer.destroy()
        self._all.clear()
        self._free.clear()
