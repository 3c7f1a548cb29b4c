"""workbench: run and study Gemma 3 inference on heterogeneous silicon (numpy, numba CPU, Vulkan, NPU).

import workbench as wb
model = wb.load("gemma3-270m")
engine = wb.Engine(model, backend="numpy")
print(engine.generate("The capital of France is", max_tokens=20).text)
"""

from __future__ import annotations

import os

from . import blas_env  # noqa: F401  (before numpy loads OpenBLAS: see workbench.blas_env)

# before numba is imported anywhere (see workbench.numba_jit)
os.environ.setdefault("NUMBA_SLP_VECTORIZE", "1")

from .models.config import ModelConfig
from .models.model import Model
from .models.registry import load
from .runtime.engine import Engine, GenerationResult
from .runtime.sampling import SamplingParams

__version__ = "0.1.0"

__all__ = ["Engine", "GenerationResult", "Model", "ModelConfig", "SamplingParams", "__version__", "load"]
