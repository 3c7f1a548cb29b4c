"""Vulkan devices: the loader, device enumeration and selection, feature detection, the logical device.

``list_devices()`` describes every physical device without creating one; ``VulkanDevice`` opens one
(by index or name substring), enables the features our shaders use, and optionally the Khronos validation
layer with a messenger that collects every validation message (tests fail on any error).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..base import BackendUnavailableError

INSTALL_HINT = (
    "install the Vulkan loader and a driver: apt-get install libvulkan1 mesa-vulkan-drivers "
    "(plus your GPU vendor's driver), and pip install vulkan"
)
VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"
DEVICE_TYPES = {0: "other", 1: "integrated-gpu", 2: "discrete-gpu", 3: "virtual-gpu", 4: "cpu"}
SUBGROUP_OPS = ("basic", "vote", "arithmetic", "ballot", "shuffle", "shuffle_relative", "clustered", "quad")


class DeviceLostError(RuntimeError):
    """The Vulkan device was lost (driver reset, GPU hang); create a new backend to continue."""


class DeviceOutOfMemoryError(MemoryError):
    """A device allocation failed; the message says how much was asked and what the device has."""


def load_vulkan():
    """The ``vulkan`` module, or :class:`BackendUnavailableError` naming what to install."""
    try:
        import vulkan as vk
    except ImportError as e:  # the Python binding is missing
        raise BackendUnavailableError(f"Python package 'vulkan' is missing ({e}); {INSTALL_HINT}") from None
    except OSError as e:  # the binding loads libvulkan.so.1 at import
        raise BackendUnavailableError(f"Vulkan loader not found ({e}); {INSTALL_HINT}") from None
    return vk


@dataclass(frozen=True)
class DeviceFeatures:
    """What a physical device offers that the backend cares about."""

    index: int
    name: str
    type: str
    vendor_id: int
    api_version: str
    driver_version: int
    subgroup_size: int
    subgroup_ops: tuple[str, ...]
    subgroup_size_control: bool  # the feature on and compute among its stages: a pipeline may require a size
    min_subgroup_size: int
    max_subgroup_size: int
    fp16: bool
    int8: bool
    int64: bool
    storage_8bit: bool
    storage_16bit: bool
    timestamps: bool
    timestamp_period_ns: float
    cooperative_matrix: bool
    coopmat_f16: bool  # 16x16x16 fp16 x fp16 -> fp32 cooperative matrices at subgroup scope
    memory_model: bool
    int_dot: bool  # shaderIntegerDotProduct (Vulkan 1.3): the integer matvec (Q8_ACT) can run
    int_dot_fast: bool  # 4x8-bit packed signed dot products are hardware accelerated (its default)
    max_storage_buffer_range: int
    max_shared_memory: int
    max_invocations: int
    max_workgroup_size: tuple[int, int, int]
    max_workgroup_count: tuple[int, int, int]
    max_push_constants: int
    device_local_bytes: int
    extensions: tuple[str, ...] = field(default=(), repr=False)
    device_id: int = 0
    driver_name: str = ""  # VkPhysicalDeviceDriverProperties (Vulkan 1.2): e.g. "NVIDIA", "llvmpipe"
    driver_info: str = ""  # the driver's own version text, e.g. "580.159.04", "Mesa 24.0.5"
    max_workgroup_subgroups: int = 0  # subgroups of a workgroup whose pipeline requires a subgroup size

    @property
    def is_cpu(self) -> bool:
        return self.type == "cpu"

    @property
    def driver_version_text(self) -> str:
        """``driver_version`` decoded as the vendor packs it (NVIDIA 10.8.8.6 bits, Intel on Windows 18.14,
        others as a Vulkan version)."""
        v = self.driver_version
        if self.vendor_id == 0x10DE:
            return f"{v >> 22}.{(v >> 14) & 0xFF}.{(v >> 6) & 0xFF}.{v & 0x3F}"
        if self.vendor_id == 0x8086 and sys.platform == "win32":
            return f"{v >> 14}.{v & 0x3FFF}"
        return _version(v)

    def driver(self) -> dict[str, Any]:
        """The driver as a run record names it."""
        return {
            "api": "vulkan",
            "device": self.name,
            "vendor_id": f"0x{self.vendor_id:04x}",
            "device_id": f"0x{self.device_id:04x}",
            "driver_name": self.driver_name,
            "driver_info": self.driver_info,
            "driver_version": self.driver_version_text,
            "api_version": self.api_version,
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extensions")
        return d


def _version(v: int) -> str:
    return f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


API_1_3 = (1 << 22) | (3 << 12)  # VK_MAKE_API_VERSION(0, 1, 3, 0): integer dot products are core from here
COOPMAT_FN = "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"


def _coopmat_f16(vk, instance, pd) -> bool:
    """Whether the device lists 16x16x16 fp16 x fp16 -> fp32 subgroup-scope cooperative matrices."""
    ffi = vk.ffi
    raw = vk.lib.vkGetInstanceProcAddr(instance, COOPMAT_FN.encode())
    if raw == ffi.NULL:
        return False
    fn = ffi.cast(f"PFN_{COOPMAT_FN}", raw)
    count = ffi.new("uint32_t*")
    if fn(pd, count, ffi.NULL) != vk.VK_SUCCESS or not count[0]:
        return False
    props = ffi.new("VkCooperativeMatrixPropertiesKHR[]", count[0])
    for i in range(count[0]):
        props[i].sType = vk.VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR
    if fn(pd, count, props) != vk.VK_SUCCESS:
        return False
    f16, f32 = vk.VK_COMPONENT_TYPE_FLOAT16_KHR, vk.VK_COMPONENT_TYPE_FLOAT32_KHR
    return any(
        (p.MSize, p.NSize, p.KSize) == (16, 16, 16)
        and (p.AType, p.BType, p.CType, p.ResultType) == (f16, f16, f32, f32)
        and p.scope == vk.VK_SCOPE_SUBGROUP_KHR
        for p in props[0 : count[0]]
    )


def _features(vk, instance, pd, index: int) -> DeviceFeatures:
    f13 = vk.VkPhysicalDeviceVulkan13Features()
    f12 = vk.VkPhysicalDeviceVulkan12Features(pNext=f13)
    f11 = vk.VkPhysicalDeviceVulkan11Features(pNext=f12)
    feats = vk.VkPhysicalDeviceFeatures2(pNext=f11)
    vk.vkGetPhysicalDeviceFeatures2(pd, feats)
    dot = vk.VkPhysicalDeviceShaderIntegerDotProductProperties()
    sg_ctl = vk.VkPhysicalDeviceSubgroupSizeControlProperties(pNext=dot)
    sg = vk.VkPhysicalDeviceSubgroupProperties(pNext=sg_ctl)
    drv = vk.VkPhysicalDeviceDriverProperties(pNext=sg)
    props2 = vk.VkPhysicalDeviceProperties2(pNext=drv)
    vk.vkGetPhysicalDeviceProperties2(pd, props2)
    p, lim = props2.properties, props2.properties.limits
    exts = tuple(sorted(e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(pd, None)))
    queues = vk.vkGetPhysicalDeviceQueueFamilyProperties(pd)
    q = _compute_queue(vk, queues)
    mem = vk.vkGetPhysicalDeviceMemoryProperties(pd)
    local = [
        mem.memoryHeaps[i].size
        for i in range(mem.memoryHeapCount)
        if mem.memoryHeaps[i].flags & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT
    ]
    ops = tuple(n for i, n in enumerate(SUBGROUP_OPS) if sg.supportedOperations & (1 << i))
    return DeviceFeatures(
        index=index,
        name=vk.ffi.string(p.deviceName).decode() if not isinstance(p.deviceName, str) else p.deviceName,
        type=DEVICE_TYPES.get(p.deviceType, "other"),
        vendor_id=p.vendorID,
        api_version=_version(p.apiVersion),
        driver_version=p.driverVersion,
        subgroup_size=sg.subgroupSize,
        subgroup_ops=ops,
        subgroup_size_control=bool(f13.subgroupSizeControl)
        and bool(sg_ctl.requiredSubgroupSizeStages & vk.VK_SHADER_STAGE_COMPUTE_BIT),
        min_subgroup_size=sg_ctl.minSubgroupSize or sg.subgroupSize,
        max_subgroup_size=sg_ctl.maxSubgroupSize or sg.subgroupSize,
        max_workgroup_subgroups=sg_ctl.maxComputeWorkgroupSubgroups,
        fp16=bool(f12.shaderFloat16),
        int8=bool(f12.shaderInt8),
        int64=bool(feats.features.shaderInt64),
        storage_8bit=bool(f12.storageBuffer8BitAccess),
        storage_16bit=bool(f11.storageBuffer16BitAccess),
        timestamps=q is not None and queues[q].timestampValidBits > 0,
        timestamp_period_ns=float(lim.timestampPeriod),
        cooperative_matrix="VK_KHR_cooperative_matrix" in exts,
        coopmat_f16="VK_KHR_cooperative_matrix" in exts
        and bool(f12.vulkanMemoryModel and f12.shaderFloat16)
        and _coopmat_f16(vk, instance, pd),
        memory_model=bool(f12.vulkanMemoryModel),
        int_dot=p.apiVersion >= API_1_3 and bool(f13.shaderIntegerDotProduct),
        int_dot_fast=p.apiVersion >= API_1_3
        and bool(f13.shaderIntegerDotProduct and dot.integerDotProduct4x8BitPackedSignedAccelerated),
        max_storage_buffer_range=int(lim.maxStorageBufferRange),
        max_shared_memory=int(lim.maxComputeSharedMemorySize),
        max_invocations=int(lim.maxComputeWorkGroupInvocations),
        max_workgroup_size=tuple(int(x) for x in lim.maxComputeWorkGroupSize),
        max_workgroup_count=tuple(int(x) for x in lim.maxComputeWorkGroupCount),
        max_push_constants=int(lim.maxPushConstantsSize),
        device_local_bytes=int(max(local, default=0)),
        extensions=exts,
        device_id=p.deviceID,
        driver_name=_text(vk, drv.driverName),
        driver_info=_text(vk, drv.driverInfo),
    )


def _text(vk, chars) -> str:
    """A fixed-size char array of a Vulkan struct as text (the binding gives str or a cdata array)."""
    return chars if isinstance(chars, str) else vk.ffi.string(chars).decode(errors="replace")


def _compute_queue(vk, queues) -> int | None:
    for i, q in enumerate(queues):
        if q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT:
            return i
    return None


def _instance(vk, validation: bool):
    app = vk.VkApplicationInfo(
        pApplicationName="workbench", pEngineName="workbench", apiVersion=vk.VK_MAKE_VERSION(1, 3, 0)
    )
    layers, exts = [], []
    if validation:
        have = {lay.layerName for lay in vk.vkEnumerateInstanceLayerProperties()}
        if VALIDATION_LAYER not in have:
            raise BackendUnavailableError(
                f"Vulkan validation requested but {VALIDATION_LAYER} is not installed "
                "(apt-get install vulkan-validationlayers)"
            )
        layers, exts = [VALIDATION_LAYER], ["VK_EXT_debug_utils"]
    info = vk.VkInstanceCreateInfo(
        pApplicationInfo=app,
        enabledLayerCount=len(layers),
        ppEnabledLayerNames=layers or None,
        enabledExtensionCount=len(exts),
        ppEnabledExtensionNames=exts or None,
    )
    try:
        return vk.vkCreateInstance(info, None)
    except vk.VkError as e:
        raise BackendUnavailableError(
            f"cannot create a Vulkan instance ({type(e).__name__}); {INSTALL_HINT}"
        ) from None


def list_devices() -> list[DeviceFeatures]:
    """Every Vulkan physical device with its features (no logical device is created)."""
    vk = load_vulkan()
    inst = _instance(vk, validation=False)
    try:
        return [_features(vk, inst, pd, i) for i, pd in enumerate(vk.vkEnumeratePhysicalDevices(inst))]
    finally:
        vk.vkDestroyInstance(inst, None)


def select_device(devices: list[DeviceFeatures], selector: str | int | None) -> DeviceFeatures:
    """The device named by ``selector``: an index, a case-insensitive name substring, or None/``auto``
    (the first discrete GPU, then integrated, then any other; CPU drivers such as lavapipe last)."""
    if not devices:
        raise BackendUnavailableError(f"no Vulkan device found; {INSTALL_HINT}")
    if selector is None or selector == "auto" or selector == "":
        rank = {"discrete-gpu": 0, "integrated-gpu": 1, "virtual-gpu": 2, "other": 3, "cpu": 4}
        return min(devices, key=lambda d: (rank[d.type], d.index))
    text = str(selector)
    if text.isdigit():
        i = int(text)
        if i >= len(devices):
            raise ValueError(f"Vulkan device index {i} out of range (devices: {_names(devices)})")
        return devices[i]
    hits = [d for d in devices if text.lower() in d.name.lower()]
    if not hits:
        raise ValueError(f"no Vulkan device matches {text!r} (devices: {_names(devices)})")
    return hits[0]


def subgroup_size_error(f: DeviceFeatures, size: int) -> str | None:
    """Why pipelines on device ``f`` cannot require subgroups of ``size`` (0: no requirement), or None."""
    if size == 0:
        return None
    if not f.subgroup_size_control:
        return f"subgroup_size={size}: {f.name} cannot set the subgroup size of compute shaders (it runs {f.subgroup_size})"
    if size & (size - 1) or not f.min_subgroup_size <= size <= f.max_subgroup_size:
        return (
            f"subgroup_size={size} must be a power of two from {f.min_subgroup_size} to {f.max_subgroup_size} "
            f"on {f.name} (or 0: the driver's choice)"
        )
    return None


def _names(devices: list[DeviceFeatures]) -> str:
    return ", ".join(f"{d.index}: {d.name}" for d in devices)


class VulkanDevice:
    """An open logical device with one compute queue, a command pool and (optionally) validation.

    ``validation_messages`` collects (severity, text) of every validation message; ``check_validation()``
    raises if any was an error.
    """

    def __init__(
        self, selector: str | int | None = None, validation: bool | None = None, subgroup_size: int = 0
    ):
        """``subgroup_size``: the size every pipeline requires (VK_EXT_subgroup_size_control, core in Vulkan
        1.3), e.g. 32 or 64 on RADV; 0 leaves it to the driver. The features then report that size, so every
        tile and workgroup is computed for it."""
        vk = self.vk = load_vulkan()
        if validation is None:
            validation = os.environ.get("WORKBENCH_VK_VALIDATION", "") not in ("", "0")
        self.validation = validation
        self.validation_messages: list[tuple[str, str]] = []
        self.instance = _instance(vk, validation)
        self._messenger = None
        if validation:
            self._install_messenger()
        physical = vk.vkEnumeratePhysicalDevices(self.instance)
        feats = [_features(vk, self.instance, pd, i) for i, pd in enumerate(physical)]
        self.features = select_device(feats, selector)
        problem = subgroup_size_error(self.features, subgroup_size)
        if problem:
            raise ValueError(problem)
        self.required_subgroup_size = subgroup_size
        if subgroup_size:
            self.features = replace(self.features, subgroup_size=subgroup_size)
        self.physical = physical[self.features.index]
        queues = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        self.queue_family = _compute_queue(vk, queues)
        if self.queue_family is None:
            raise BackendUnavailableError(f"Vulkan device {self.features.name} has no compute queue")
        self._create_device()
        self.memory_properties = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        self.allocated: dict[int, int] = {}  # bytes of live buffers per heap (memory.Buffer keeps it)
        self.spilled = 0  # bytes of buffers that wanted device-local memory and went to host-visible memory
        self.command_pool = vk.vkCreateCommandPool(
            self.device,
            vk.VkCommandPoolCreateInfo(
                queueFamilyIndex=self.queue_family,
                flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
            ),
            None,
        )
        self.fence = vk.vkCreateFence(self.device, vk.VkFenceCreateInfo(), None)
        self._submit_infos: dict[tuple, tuple] = {}
        self.spin_s = float(os.environ.get("WORKBENCH_VK_SPIN_S", "0.02"))  # poll the fence this long
        self.lost = False

    def _install_messenger(self) -> None:
        vk = self.vk

        def callback(severity, types, data, user):
            text = vk.ffi.string(data.pMessage).decode(errors="replace")
            level = "error" if severity & vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT else "warning"
            self.validation_messages.append((level, text))
            return 0

        self._callback = callback
        create = vk.vkGetInstanceProcAddr(self.instance, "vkCreateDebugUtilsMessengerEXT")
        info = vk.VkDebugUtilsMessengerCreateInfoEXT(
            messageSeverity=vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT
            | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
            messageType=vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT
            | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT,
            pfnUserCallback=callback,
        )
        self._messenger = create(self.instance, info, None)

    def _create_device(self) -> None:
        vk, f = self.vk, self.features
        exts = ["VK_KHR_cooperative_matrix"] if f.coopmat_f16 else []
        coop = vk.VkPhysicalDeviceCooperativeMatrixFeaturesKHR(cooperativeMatrix=vk.VK_TRUE) if exts else None
        # Vulkan 1.3 features only where enabled (a 1.2 device rejects the struct)
        f13 = (
            vk.VkPhysicalDeviceVulkan13Features(
                pNext=coop,
                shaderIntegerDotProduct=vk.VK_TRUE if f.int_dot else vk.VK_FALSE,
                subgroupSizeControl=vk.VK_TRUE if self.required_subgroup_size else vk.VK_FALSE,
            )
            if f.int_dot or self.required_subgroup_size
            else None
        )
        f12 = vk.VkPhysicalDeviceVulkan12Features(
            pNext=f13 or coop,
            shaderFloat16=vk.VK_TRUE if f.fp16 else vk.VK_FALSE,
            shaderInt8=vk.VK_TRUE if f.int8 else vk.VK_FALSE,
            storageBuffer8BitAccess=vk.VK_TRUE if f.storage_8bit else vk.VK_FALSE,
            vulkanMemoryModel=vk.VK_TRUE if f.coopmat_f16 else vk.VK_FALSE,
        )
        f11 = vk.VkPhysicalDeviceVulkan11Features(
            pNext=f12, storageBuffer16BitAccess=vk.VK_TRUE if f.storage_16bit else vk.VK_FALSE
        )
        core = vk.VkPhysicalDeviceFeatures2(  # the KV binding is an array indexed per workgroup
            pNext=f11,
            features=vk.VkPhysicalDeviceFeatures(shaderStorageBufferArrayDynamicIndexing=vk.VK_TRUE),
        )
        self._feature_chain = (core, f11, f12, f13, coop)  # keep the pNext chain alive
        queue_info = vk.VkDeviceQueueCreateInfo(
            queueFamilyIndex=self.queue_family, queueCount=1, pQueuePriorities=[1.0]
        )
        info = vk.VkDeviceCreateInfo(
            pNext=core,
            queueCreateInfoCount=1,
            pQueueCreateInfos=[queue_info],
            enabledExtensionCount=len(exts),
            ppEnabledExtensionNames=exts or None,
        )
        try:
            self.device = vk.vkCreateDevice(self.physical, info, None)
        except vk.VkError as e:
            raise BackendUnavailableError(f"cannot open Vulkan device {f.name}: {type(e).__name__}") from None
        self.queue = vk.vkGetDeviceQueue(self.device, self.queue_family, 0)

    # -- submission ------------------------------------------------------------------------------
    def submit_and_wait(self, command_buffers: list, timeout_s: float | None = None) -> None:
        """Submit command buffers to the compute queue and wait for them (``timeout_s``: 60 s on GPUs, 15 min
        on CPU drivers, whose steps on a loaded host can take minutes); device loss is a clear error."""
        vk = self.vk
        if timeout_s is None:
            timeout_s = 900.0 if self.features.is_cpu else 60.0
        if self.lost:
            raise DeviceLostError("the Vulkan device was lost earlier; create a new backend")
        key = tuple(id(c) for c in command_buffers)
        info = self._submit_infos.get(key)
        if info is None:
            info = vk.VkSubmitInfo(commandBufferCount=len(command_buffers), pCommandBuffers=command_buffers)
            self._submit_infos[key] = (info, command_buffers)  # keep the buffers' handles alive with it
        else:
            info = info[0]
        try:
            vk.vkQueueSubmit(self.queue, 1, [info], self.fence)
            if not self._spin(timeout_s):
                vk.vkWaitForFences(self.device, 1, [self.fence], vk.VK_TRUE, int(timeout_s * 1e9))
            vk.vkResetFences(self.device, 1, [self.fence])
        except vk.VkErrorDeviceLost:
            self.lost = True
            raise DeviceLostError(
                f"Vulkan device {self.features.name} was lost while running a step; "
                "create a new backend (the process can continue)"
            ) from None
        except vk.VkTimeout:
            self.lost = True
            raise DeviceLostError(
                f"a step on {self.features.name} did not finish in {timeout_s:.0f} s"
            ) from None

    def _spin(self, timeout_s: float) -> bool:
        """Poll the fence for up to ``spin_s`` (a blocking wait adds tens of microseconds of wake-up latency
        to every step on GPU drivers); False when still pending. CPU drivers (lavapipe) are never spun on:
        they need the cores."""
        if self.spin_s <= 0 or self.features.is_cpu:
            return False
        vk, lib = self.vk, self.vk.lib
        end = time.perf_counter() + min(self.spin_s, timeout_s)
        while True:
            status = lib.vkGetFenceStatus(self.device, self.fence)
            if status == vk.VK_SUCCESS:
                return True
            if status != vk.VK_NOT_READY:
                raise vk.VkErrorDeviceLost() if status == vk.VK_ERROR_DEVICE_LOST else vk.VkError()
            if time.perf_counter() > end:
                return False

    def check_validation(self) -> None:
        errors = [m for level, m in self.validation_messages if level == "error"]
        if errors:
            raise RuntimeError(f"{len(errors)} Vulkan validation error(s); first: {errors[0]}")

    def close(self) -> None:
        vk = self.vk
        if getattr(self, "device", None) is None:
            return
        with contextlib.suppress(vk.VkError):
            vk.vkDeviceWaitIdle(self.device)
        vk.vkDestroyFence(self.device, self.fence, None)
        vk.vkDestroyCommandPool(self.device, self.command_pool, None)
        vk.vkDestroyDevice(self.device, None)
        self.device = None
        if self._messenger is not None:
            destroy = vk.vkGetInstanceProcAddr(self.instance, "vkDestroyDebugUtilsMessengerEXT")
            destroy(self.instance, self._messenger, None)
        vk.vkDestroyInstance(self.instance, None)
