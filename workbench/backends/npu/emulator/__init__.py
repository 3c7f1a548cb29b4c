"""The AIE emulator: executes NPU schedules functionally (numpy, NPU numerics) and times them with the
cost model. Everything it reports is ``emulated``."""

from ..cost import Estimate, estimate
from . import kernels, numerics

__all__ = ["Estimate", "estimate", "kernels", "numerics"]
