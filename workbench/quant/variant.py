"""A model variant: the same model with other weights (re-quantized, pruned) and rewritten step graphs.

Backends see an ordinary :class:`Model`; the variant's ``graph()`` applies its rewrites (sparse FFN,
attention variants) to every step graph, and ``describe()`` says what was changed and from what source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..models.model import Model
from ..models.weights import Weights
from ..ops.graph import Graph

GraphRewrite = Callable[[Graph], Graph]


@dataclass
class VariantModel(Model):
    """``base`` with ``weights`` replaced and ``rewrites`` applied to each step graph; ``notes`` say how."""

    rewrites: tuple[GraphRewrite, ...] = ()
    notes: dict[str, Any] = field(default_factory=dict)

    def graph(self, n_tokens: int, n_logits: int = 1) -> Graph:
        key = (n_tokens, n_logits)
        g = self._graphs.get(key)
        if g is None:
            g = super().graph(n_tokens, n_logits)
            for rewrite in self.rewrites:
                g = rewrite(g)
            self._graphs[key] = g
        return g

    def describe(self) -> dict:
        return {**super().describe(), "variant": self.notes}


def make_variant(
    model: Model,
    weights: Weights | None = None,
    rewrites: tuple[GraphRewrite, ...] = (),
    notes: dict[str, Any] | None = None,
) -> VariantModel:
    """A variant of ``model`` (itself possibly a variant: its rewrites and notes are kept, then extended)."""
    base_rewrites = model.rewrites if isinstance(model, VariantModel) else ()
    base_notes = dict(model.notes) if isinstance(model, VariantModel) else {}
    fields = {k: getattr(model, k) for k in ("config", "weights", "tokenizer", "source", "kind")}
    if weights is not None:
        fields["weights"] = weights
    return VariantModel(
        **fields, rewrites=base_rewrites + tuple(rewrites), notes={**base_notes, **(notes or {})}
    )
