"""Device buffers: device-local storage, host-visible staging/readback, uploads through a staging ring.

Out-of-memory is a :class:`DeviceOutOfMemoryError` naming the request and the device's memory; buffers
larger than the device's ``maxStorageBufferRange`` are refused here (callers split tensors first).
"""

from __future__ import annotations

import sys

import numpy as np

from .device import DeviceOutOfMemoryError, VulkanDevice
from .heaps import MemoryType, device_local_heaps, memory_types, pick_type, read_heaps

STAGING_BYTES = 32 << 20
ALL_TYPES = (1 << 32) - 1  # every memory type allowed (planning, before a buffer exists)


class Buffer:
    """One VkBuffer with its own memory, of a memory ``role`` (:func:`.heaps.pick_type`).

    ``device`` (the default): device-local. ``staging`` (``host=True``): host-visible, for the CPU to read and
    write. ``host``: host-visible memory that the GPU reads (weights placed off the device-local heap).
    ``staging`` and ``host`` buffers are mapped (``array`` is a uint8 view). ``spill=True``: a device buffer
    that goes to host-visible memory when the device-local heap has no room for it (its budget, or the
    driver's answer); the bytes are counted in ``dev.spilled`` and said once on stderr.
    """

    def __init__(self, dev: VulkanDevice, size: int, host: bool = False, name: str = "",
                 role: str | None = None, spill: bool = False):  # fmt: skip
        vk = dev.vk
        role = role or ("staging" if host else "device")
        self.dev, self.size, self.host, self.name = dev, max(int(size), 16), role != "device", name
        limit = dev.features.max_storage_buffer_range
        if self.size > limit:
            raise ValueError(
                f"buffer {name or '?'} of {self.size / 2**20:.1f} MiB exceeds the device's "
                f"maxStorageBufferRange ({limit / 2**20:.0f} MiB); split it"
            )
        usage = (
            vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT
            | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
            | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
        )
        self.handle = vk.vkCreateBuffer(
            dev.device,
            vk.VkBufferCreateInfo(size=self.size, usage=usage, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE),
            None,
        )
        req = vk.vkGetBufferMemoryRequirements(dev.device, self.handle)
        try:
            mtype, self.memory = _place(dev, role, spill, req, self.size, name)
        except DeviceOutOfMemoryError:
            vk.vkDestroyBuffer(dev.device, self.handle, None)
            raise
        vk.vkBindBufferMemory(dev.device, self.handle, self.memory, 0)
        self.memory_type, self.heap, self.allocated = mtype.index, mtype.heap, int(req.size)
        self.spilled = role == "device" and mtype.index != role_type(dev, "device", req.memoryTypeBits).index
        self.host = self.host or self.spilled
        dev.allocated[self.heap] = dev.allocated.get(self.heap, 0) + self.allocated
        if self.spilled:
            if not dev.spilled:
                print(f"vulkan backend: {name or 'a buffer'} ({self.size / 2**20:.1f} MiB) and later buffers "
                      "without device-local room go to host-visible memory (slower): "
                      f"{_heaps_text(dev)}", file=sys.stderr)  # fmt: skip
            dev.spilled += self.allocated
        self.array: np.ndarray | None = None
        if self.host:
            ptr = vk.vkMapMemory(dev.device, self.memory, 0, self.size, 0)
            self.array = np.frombuffer(ptr, dtype=np.uint8, count=self.size)

    def view(self, dtype) -> np.ndarray:
        if self.array is None:
            raise ValueError(f"buffer {self.name} is not host-visible")
        return self.array.view(dtype)

    def destroy(self) -> None:
        vk, dev = self.dev.vk, self.dev
        if self.handle is None or dev.device is None:
            return
        if self.array is not None:
            self.array = None
            vk.vkUnmapMemory(dev.device, self.memory)
        vk.vkDestroyBuffer(dev.device, self.handle, None)
        vk.vkFreeMemory(dev.device, self.memory, None)
        dev.allocated[self.heap] -= self.allocated
        if self.spilled:
            dev.spilled -= self.allocated
        self.handle = None


def role_type(dev: VulkanDevice, role: str, bits: int = ALL_TYPES) -> MemoryType:
    """The memory type buffers of ``role`` use on ``dev`` (``bits``: the types a buffer allows)."""
    props = dev.memory_properties
    return pick_type(memory_types(props), bits, role, device_local_heaps(props))


def _heap_free(dev: VulkanDevice, heap: int) -> int:
    return read_heaps(dev)[0][heap].free


def _heaps_text(dev: VulkanDevice) -> str:
    heaps, source = read_heaps(dev)
    return "; ".join(h.describe() for h in heaps) + f"; budgets from {source}"


def _place(dev: VulkanDevice, role: str, spill: bool, req, size: int, name: str):
    """The memory type and a fresh allocation for a buffer (see :class:`Buffer` for ``spill``)."""
    what = f"{name or 'a buffer'} of {size / 2**20:.1f} MiB on {dev.features.name}"
    try:
        roles = [role, "host"] if spill and role == "device" else [role]
        types = [role_type(dev, r, req.memoryTypeBits) for r in roles]
    except LookupError as e:
        raise DeviceOutOfMemoryError(f"{e}: cannot allocate {what}") from None
    if len(types) == 2 and _heap_free(dev, types[0].heap) < req.size:
        types = types[1:]  # the device-local heap's budget has no room left
    for mtype in types:
        try:
            memory = dev.vk.vkAllocateMemory(
                dev.device,
                dev.vk.VkMemoryAllocateInfo(allocationSize=req.size, memoryTypeIndex=mtype.index),
                None,
            )
            return mtype, memory
        except (dev.vk.VkErrorOutOfDeviceMemory, dev.vk.VkErrorOutOfHostMemory):
            continue  # the driver's answer: the next type, if any
    if len(roles) > 1:
        raise DeviceOutOfMemoryError(
            f"no room in device-local or host-visible memory for {what} ({_heaps_text(dev)})"
        )
    kind = "device" if role == "device" else "host-visible"
    raise DeviceOutOfMemoryError(f"out of {kind} memory allocating {what} ({_heaps_text(dev)})")


class Transfers:
    """Copies between host arrays and device buffers through one reusable staging buffer."""

    def __init__(self, dev: VulkanDevice):
        vk = dev.vk
        self.dev = dev
        self.staging = Buffer(dev, STAGING_BYTES, host=True, name="staging")
        self.cmd = vk.vkAllocateCommandBuffers(
            dev.device,
            vk.VkCommandBufferAllocateInfo(
                commandPool=dev.command_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1
            ),
        )[0]

    def _copy(self, src: Buffer, dst: Buffer, src_off: int, dst_off: int, size: int) -> None:
        vk = self.dev.vk
        vk.vkBeginCommandBuffer(
            self.cmd, vk.VkCommandBufferBeginInfo(flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT)
        )
        vk.vkCmdCopyBuffer(
            self.cmd,
            src.handle,
            dst.handle,
            1,
            [vk.VkBufferCopy(srcOffset=src_off, dstOffset=dst_off, size=size)],
        )
        vk.vkEndCommandBuffer(self.cmd)
        self.dev.submit_and_wait([self.cmd])

    def upload(self, dst: Buffer, data: np.ndarray, offset: int = 0) -> None:
        """Write ``data`` (any dtype, C-contiguous) into ``dst`` at byte ``offset``."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if offset + raw.size > dst.size:
            raise ValueError(
                f"upload of {raw.size} bytes at {offset} overflows buffer {dst.name} ({dst.size})"
            )
        if dst.host:
            dst.array[offset : offset + raw.size] = raw
            return
        for start in range(0, raw.size, STAGING_BYTES):
            chunk = raw[start : start + STAGING_BYTES]
            self.staging.array[: chunk.size] = chunk
            self._copy(self.staging, dst, 0, offset + start, chunk.size)

    def destroy(self) -> None:
        self.staging.destroy()
