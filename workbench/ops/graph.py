"""The forward step as data: named ops over named tensors, built once per step shape."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from ..models.config import ModelConfig


@dataclass(frozen=True)
class TensorSpec:
    """An activation tensor of the step: its shape for this step shape and dtype."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class WeightSpec:
    """What the graph needs to know of a weight: its storage type name, shape and bytes."""

    type: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class Op:
    """One op of the step graph.

    ``inputs``/``outputs`` name activation tensors of the graph, ``weights`` name model weights, and
    ``attrs`` hold the op kind's static parameters (eps, head counts, RoPE base, layer, window, ...).
    """

    name: str
    kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    weights: tuple[str, ...] = ()
    attrs: Mapping[str, Any] = field(default_factory=dict)
    layer: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "attrs", MappingProxyType(dict(self.attrs)))

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)


STEP_INPUTS = ("tokens", "positions", "logit_rows")


@dataclass
class Graph:
    """The ops of one forward step for ``n_tokens`` tokens, producing logits for ``n_logits`` rows."""

    config: ModelConfig
    n_tokens: int
    n_logits: int
    ops: list[Op]
    tensors: dict[str, TensorSpec]
    weights: dict[str, WeightSpec]
    outputs: tuple[str, ...] = ("logits",)
    rewrites: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Every op reads tensors that exist and were produced earlier; names are unique."""
        seen_ops: set[str] = set()
        produced = set(STEP_INPUTS)
        for op in self.ops:
            if op.name in seen_ops:
                raise ValueError(f"graph: duplicate op name {op.name!r}")
            seen_ops.add(op.name)
            for t in op.inputs:
                if t not in produced:
                    raise ValueError(f"graph: op {op.name!r} reads {t!r} before it is produced")
            for t in op.outputs:
                if t not in self.tensors:
                    raise ValueError(f"graph: op {op.name!r} writes undeclared tensor {t!r}")
                produced.add(t)
            for w in op.weights:
                if w not in self.weights:
                    raise ValueError(f"graph: op {op.name!r} uses unknown weight {w!r}")
        for t in self.outputs:
            if t not in produced:
                raise ValueError(f"graph: output {t!r} is never produced")

    def op(self, name: str) -> Op:
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(f"graph has no op {name!r}")

    def kinds(self) -> Counter[str]:
        return Counter(op.kind for op in self.ops)

    def last_use(self) -> dict[str, int]:
        """Index of the last op reading each tensor (for buffer reuse)."""
        last: dict[str, int] = {}
        for i, op in enumerate(self.ops):
            for t in op.inputs:
                last[t] = i
        for t in self.outputs:
            last[t] = len(self.ops)
        return last

    def describe(self) -> str:
        kinds = ", ".join(f"{k} x{n}" for k, n in sorted(self.kinds().items()))
        return f"Graph({self.n_tokens} tokens -> {self.n_logits} logit rows: {len(self.ops)} ops: {kinds})"
