"""A loaded model: config, native weights and tokenizer, with the step graphs built from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..ops.graph import Graph, WeightSpec
from .config import ModelConfig
from .gemma3 import build_graph
from .gguf import GGUFFile
from .safetensors_dir import load_hf_dir
from .tokenizer import Tokenizer
from .weights import QTensor, Weights


@dataclass
class Model:
    """Everything the engine needs from a model source.

    ``kind`` is ``gguf``, ``hf`` or ``synthetic`` (random weights of the real shapes: results on it say so).
    """

    config: ModelConfig
    weights: Weights
    tokenizer: Tokenizer
    source: str
    kind: str
    _graphs: dict[tuple[int, int], Graph] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def synthetic(self) -> bool:
        return self.kind == "synthetic"

    def weight_specs(self) -> dict[str, WeightSpec]:
        return {n: WeightSpec(t.type.name, t.shape, t.nbytes) for n, t in self.weights.items()}

    def graph(self, n_tokens: int, n_logits: int = 1) -> Graph:
        """The step graph for this shape (built once, then reused)."""
        key = (n_tokens, n_logits)
        g = self._graphs.get(key)
        if g is None:
            g = self._graphs[key] = build_graph(self.config, self.weight_specs(), n_tokens, n_logits)
        return g

    def describe(self) -> dict:
        c = self.config
        return {
            "name": c.name,
            "source": self.source,
            "kind": self.kind,
            "params": c.n_params(),
            "weights_bytes": self.weights.nbytes,
            "layers": c.n_layers,
            "hidden": c.hidden,
            "ffn": c.ffn,
            "heads": c.n_heads,
            "kv_heads": c.n_kv_heads,
            "head_dim": c.head_dim,
            "vocab": c.vocab_size,
            "context": c.context_length,
            "sliding_window": c.sliding_window,
            "global_layers": [i for i in range(c.n_layers) if not c.is_sliding(i)],
        }


def _gguf_loader(gguf: GGUFFile, name: str):
    return lambda: gguf.tensor_data(name)


def load_gguf(path: str | Path, kind: str = "gguf", name: str = "") -> Model:
    gguf = GGUFFile(path)
    if gguf.metadata.get("workbench.synthetic"):  # written by `workbench synth`: random weights
        kind = "synthetic"
    config = ModelConfig.from_gguf_metadata(gguf.metadata, name=name)
    tensors = {
        n: QTensor(n, info.type, info.shape, _gguf_loader(gguf, n)) for n, info in gguf.tensors.items()
    }
    return Model(config, Weights(tensors, str(path)), Tokenizer.from_gguf(gguf), str(path), kind)


def load_hf(path: str | Path) -> Model:
    config, tensors = load_hf_dir(path)
    return Model(config, Weights(tensors, str(path)), Tokenizer.from_hf_dir(path), str(path), "hf")
