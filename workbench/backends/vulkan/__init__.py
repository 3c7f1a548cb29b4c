"""The Vulkan backend (see :mod:`.backend`): GLSL kernels in ``shaders/``, driven through the ``vulkan`` binding."""

from .backend import VulkanBackend

__all__ = ["VulkanBackend"]
