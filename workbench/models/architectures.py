"""Each supported architecture's graph builder and weight layout, chosen by ``ModelConfig.arch``.

Callers that serve every architecture (a loaded :class:`~.model.Model`) use these; the modules of one
architecture (``gemma3``, ``gemma3n``) describe it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

from ..ops.graph import Graph, WeightSpec
from . import gemma3, gemma3n
from .config import ModelConfig

MODULES: dict[str, ModuleType] = {"gemma3": gemma3, "gemma3n": gemma3n}


def module(config: ModelConfig) -> ModuleType:
    return MODULES[config.arch]


def build_graph(
    config: ModelConfig, weights: Mapping[str, WeightSpec], n_tokens: int, n_logits: int
) -> Graph:
    """The forward step of ``config``'s architecture (see ``gemma3.build_graph``)."""
    return module(config).build_graph(config, weights, n_tokens, n_logits)


def required_weights(config: ModelConfig) -> list[str]:
    return module(config).required_weights(config)


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    return module(config).weight_shapes(config)
