"""Device buffers: device-local storage, host-visible staging/readback, uploads through a staging ring.

Out-of-memory is a :class:`DeviceOutOfMemoryError` naming the request and the device's memory; buffers
larger than the device's ``maxStorageBufferRange`` are refused here (callers split tensors first).
"""

from __future__ import annotations

import numpy as np

from .device import DeviceOutOfMemoryError, VulkanDevice

STAGING_BYTES = 32 << 20


class Buffer:
    """One VkBuffer with its own memory. ``host`` buffers are mapped (``array`` is a uint8 view)."""

    def __init__(self, dev: VulkanDevice, size: int, host: bool = False, name: str = ""):
        vk = dev.vk
        self.dev, self.size, self.host, self.name = dev, max(int(size), 16), host, name
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
        if host:
            want = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
            prefer = want | vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT
        else:
            want = prefer = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
        mtype = _memory_type(dev, req.memoryTypeBits, prefer, want)
        try:
            self.memory = vk.vkAllocateMemory(
                dev.device, vk.VkMemoryAllocateInfo(allocationSize=req.size, memoryTypeIndex=mtype), None
            )
        except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory):
            vk.vkDestroyBuffer(dev.device, self.handle, None)
            raise DeviceOutOfMemoryError(
                f"out of {'host-visible' if host else 'device'} memory allocating {name or 'a buffer'} of "
                f"{self.size / 2**20:.1f} MiB on {dev.features.name} "
                f"(device-local heap {dev.features.device_local_bytes / 2**30:.1f} GiB)"
            ) from None
        vk.vkBindBufferMemory(dev.device, self.handle, self.memory, 0)
        self.array: np.ndarray | None = None
        if host:
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
        self.handle = None


def _memory_type(dev: VulkanDevice, bits: int, prefer: int, want: int) -> int:
    props = dev.memory_properties
    for flags in (prefer, want):
        for i in range(props.memoryTypeCount):
            if bits & (1 << i) and props.memoryTypes[i].propertyFlags & flags == flags:
                return i
    raise DeviceOutOfMemoryError(f"no Vulkan memory type with flags {want:#x} on {dev.features.name}")


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
