"""Memory heaps and types: which memory type each kind of buffer uses, and what each heap has left.

Two roles matter for model data. ``device``: the first DEVICE_LOCAL type (VRAM on a discrete GPU, the BIOS
carve-out on an integrated one). ``host``: a HOST_VISIBLE | HOST_COHERENT type on a heap that is not
device-local (system memory: GTT on a Radeon iGPU, system RAM over PCIe on a discrete GPU), preferring a type
without HOST_CACHED (write-combined: the GPU reads it without snooping the CPU caches; the CPU only writes it
once). A device whose host-visible types all lie on a device-local heap (lavapipe, some unified-memory
drivers) gives a host-visible type on that heap: the buffer is placed and written as host memory, but it is
the same physical heap.

A heap's budget is VK_EXT_memory_budget's ``heapBudget`` (what this process may use, other processes'
allocations taken out) with its ``heapUsage``, read fresh each time; without the extension, the heap's size
and the bytes this device's buffers hold on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .device import VulkanDevice

BUDGET_EXT = "VK_EXT_memory_budget"

# VkMemoryPropertyFlagBits / VkMemoryHeapFlagBits (fixed by the specification)
DEVICE_LOCAL = 0x1
HOST_VISIBLE = 0x2
HOST_COHERENT = 0x4
HOST_CACHED = 0x8
HEAP_DEVICE_LOCAL = 0x1


@dataclass(frozen=True)
class MemoryType:
    index: int
    heap: int
    flags: int


@dataclass(frozen=True)
class Heap:
    """One memory heap as seen now: ``budget`` bytes this process may use, ``used`` of them in use."""

    index: int
    size: int
    device_local: bool
    budget: int
    used: int

    @property
    def free(self) -> int:
        return max(0, self.budget - self.used)

    def describe(self) -> str:
        kind = "device-local" if self.device_local else "host"
        return (
            f"{kind} heap {self.index} ({size_text(self.size)}, budget {size_text(self.budget)}, "
            f"{size_text(self.used)} in use)"
        )


def size_text(n: int) -> str:
    """Bytes in MiB below 1 GiB, else in GiB."""
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def memory_types(props) -> list[MemoryType]:
    """The memory types of a ``VkPhysicalDeviceMemoryProperties``."""
    return [
        MemoryType(i, props.memoryTypes[i].heapIndex, props.memoryTypes[i].propertyFlags)
        for i in range(props.memoryTypeCount)
    ]


def heap_is_device_local(props, heap: int) -> bool:
    return bool(props.memoryHeaps[heap].flags & HEAP_DEVICE_LOCAL)


def device_local_heaps(props) -> set[int]:
    return {i for i in range(props.memoryHeapCount) if heap_is_device_local(props, i)}


def pick_type(types: list[MemoryType], bits: int, role: str, device_local_heaps: set[int]) -> MemoryType:
    """The memory type for ``role`` among the types allowed by ``bits``.

    ``device``: the first DEVICE_LOCAL type. ``host``: host-visible and coherent memory for data the GPU reads
    (weights, a spilled KV cache), off the device-local heaps if any such type exists, uncached first.
    ``staging``: host-visible and coherent memory the CPU reads or writes often, cached first.
    """
    allowed = [t for t in types if bits & (1 << t.index)]
    hv = HOST_VISIBLE | HOST_COHERENT
    if role == "device":
        ranked = [[t for t in allowed if t.flags & DEVICE_LOCAL]]
    elif role == "host":
        off = [t for t in allowed if t.flags & hv == hv and t.heap not in device_local_heaps]
        on = [t for t in allowed if t.flags & hv == hv and t.heap in device_local_heaps]
        ranked = [
            [t for t in off if not t.flags & HOST_CACHED],
            off,
            [t for t in on if not t.flags & DEVICE_LOCAL],
            on,
        ]
    elif role == "staging":
        ranked = [[t for t in allowed if t.flags & (hv | HOST_CACHED) == hv | HOST_CACHED],
                  [t for t in allowed if t.flags & hv == hv]]  # fmt: skip
    else:
        raise ValueError(f"unknown memory role {role!r}")
    for candidates in ranked:
        if candidates:
            return candidates[0]
    raise LookupError(f"no Vulkan memory type for {role} buffers (types: {[hex(t.flags) for t in allowed]})")


def read_heaps(dev: VulkanDevice) -> tuple[list[Heap], str]:
    """Every heap's size, budget and use now, and where the budget came from."""
    vk = dev.vk
    if BUDGET_EXT in dev.features.extensions:
        budget = vk.VkPhysicalDeviceMemoryBudgetPropertiesEXT()
        props2 = vk.VkPhysicalDeviceMemoryProperties2(pNext=budget)
        vk.vkGetPhysicalDeviceMemoryProperties2(dev.physical, props2)
        props = props2.memoryProperties
        heaps = [
            Heap(
                i,
                int(props.memoryHeaps[i].size),
                heap_is_device_local(props, i),
                int(budget.heapBudget[i]),
                int(budget.heapUsage[i]),
            )
            for i in range(props.memoryHeapCount)
        ]
        return heaps, BUDGET_EXT
    props = dev.memory_properties
    heaps = [
        Heap(
            i,
            int(props.memoryHeaps[i].size),
            heap_is_device_local(props, i),
            int(props.memoryHeaps[i].size),
            dev.allocated.get(i, 0),
        )
        for i in range(props.memoryHeapCount)
    ]
    return heaps, "heap sizes (no VK_EXT_memory_budget)"
