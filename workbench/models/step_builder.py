"""What every architecture's ``build_graph`` shares: the step's checks, op and tensor collection, the head.

An architecture module (``gemma3.py``, ``gemma3n.py``) describes its layers with :meth:`StepBuilder.add`
and :meth:`StepBuilder.act`; the checks of the step's sizes and weights, and the output norm, LM head and
logit soft cap that end every Gemma step, are written once here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..ops.graph import Graph, Op, TensorSpec, WeightSpec
from .config import ModelConfig
from .weights import MissingTensorError


class StepBuilder:
    """Collects the ops and activation tensors of one step of ``n_tokens`` tokens (logits for ``n_logits``)."""

    def __init__(
        self,
        config: ModelConfig,
        weights: Mapping[str, WeightSpec],
        n_tokens: int,
        n_logits: int,
        required: Iterable[str],
        model: str = "model",
    ):
        if n_tokens < 1 or not 1 <= n_logits <= n_tokens:
            raise ValueError(f"a step needs 1 <= n_logits ({n_logits}) <= n_tokens ({n_tokens})")
        missing = [w for w in required if w not in weights]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise MissingTensorError(f"{model} is missing tensor {missing[0]!r}{more}")
        self.config, self.weights = config, weights
        self.n_tokens, self.n_logits = n_tokens, n_logits
        self.ops: list[Op] = []
        self.tensors: dict[str, TensorSpec] = {}

    def act(self, name: str, cols: int, rows: int | None = None) -> str:
        """Declare activation ``name`` of ``rows`` (default: the step's tokens) x ``cols``; return its name."""
        self.tensors[name] = TensorSpec((self.n_tokens if rows is None else rows, cols))
        return name

    def add(
        self, name: str, kind: str, inputs, outputs, weights=(), layer: int | None = None, **attrs: Any
    ) -> None:
        """Append op ``name`` of ``kind`` (attributes ``attrs``, layer ``layer``) to the step."""
        self.ops.append(Op(name, kind, tuple(inputs), tuple(outputs), tuple(weights), attrs, layer))

    def head(self, x: str) -> Graph:
        """End the step on ``x`` (the rows that need logits, hidden wide): the output norm, the LM head (tied
        to the embedding or not) and the final soft cap where the model has one; the finished graph."""
        c, r = self.config, self.n_logits
        xn = self.act("x.final", c.hidden, r)
        self.add("output_norm", "rmsnorm", [x], [xn], ["output_norm.weight"], eps=c.rms_eps)
        head = "token_embd.weight" if c.tie_embeddings else "output.weight"
        logits = self.act("logits", c.vocab_size, r)
        if c.final_logit_softcap:
            raw = self.act("logits.raw", c.vocab_size, r)
            self.add("lm_head", "matmul", [xn], [raw], [head])
            self.add("logit_softcap", "softcap", [raw], [logits], (), cap=float(c.final_logit_softcap))
        else:
            self.add("lm_head", "matmul", [xn], [logits], [head])
        used = {wn for op in self.ops for wn in op.weights}
        return Graph(c, self.n_tokens, r, self.ops, self.tensors, {k: self.weights[k] for k in used})
