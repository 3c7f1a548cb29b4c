"""A loaded model: config, native weights and tokenizer, with the step graphs built from them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..ops.graph import Graph, WeightSpec
from .architectures import build_graph, required_weights
from .config import ModelConfig
from .gguf import GGUFFile
from .gguf_config import config_from_gguf
from .safetensors_dir import load_hf_dir
from .tokenizer import Tokenizer
from .validate import Fields
from .weights import QTensor, Weights


class TokenizerLoader:
    """How to build a model's tokenizer when it is first needed (describing a model needs none)."""

    def __init__(self, build: Callable[[], Tokenizer]):
        self.build = build


class _LazyTokenizer:
    """The ``tokenizer`` field of :class:`Model`: a :class:`Tokenizer`, or a :class:`TokenizerLoader`
    run on first access (its error, e.g. no tokenizer file, raised then and again on each access)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = f"_{name}_value"

    def __get__(self, obj: Any, owner: type | None = None) -> Tokenizer:
        if obj is None:
            raise AttributeError("tokenizer")  # no class-level default: the field is required
        value = obj.__dict__[self.slot]
        if isinstance(value, TokenizerLoader):
            value = obj.__dict__[self.slot] = value.build()
        return value

    def __set__(self, obj: Any, value: Tokenizer | TokenizerLoader) -> None:
        obj.__dict__[self.slot] = value


@dataclass(repr=False)
class Model:
    """Everything the engine needs from a model source.

    ``kind`` is ``gguf``, ``hf`` or ``synthetic`` (random weights of the real shapes: results on it say so).
    ``tokenizer`` may be given as a :class:`TokenizerLoader`: it is built on first use. ``metadata`` is
    the GGUF file's key/values (empty for other sources).
    """

    config: ModelConfig
    weights: Weights
    tokenizer: Tokenizer = _LazyTokenizer()  # a descriptor that gives no default: the field is required
    source: str
    kind: str
    _graphs: dict[tuple[int, int], Graph] = field(default_factory=dict, repr=False)
    metadata: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:  # without the tokenizer: showing a model must not build it
        return f"{type(self).__name__}({self.config.name!r}, {self.kind}, {self.source!r})"

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
        extra = {}
        if c.arch == "gemma3n":
            extra = {
                "altup_inputs": c.altup_inputs,
                "laurel_rank": c.laurel_rank,
                "per_layer_embedding": {"width": c.ple_dim, "rows": c.ple_vocab_size},
                "kv_shared_layers": {i: c.kv_layer(i) for i in range(c.n_layers) if not c.owns_kv(i)},
                "sparse_layers": {i: s for i, s in enumerate(c.activation_sparsity) if s > 0},
            }
        return {
            "name": c.name,
            "arch": c.arch,
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
            **extra,
        }


def _gguf_loader(gguf: GGUFFile, name: str):
    return lambda: gguf.tensor_data(name)


def load_gguf(path: str | Path, kind: str = "gguf", name: str = "") -> Model:
    """A GGUF file's config and tensor index, checked; tensor data and tokenizer are read when used."""
    gguf = GGUFFile(path)
    if Fields(gguf.metadata, str(path)).integer("workbench.synthetic", 0, lo=0):  # written by `synth`
        kind = "synthetic"
    shapes = {n: (n, info.shape) for n, info in gguf.tensors.items()}
    config = config_from_gguf(gguf.metadata, shapes, str(path), name=name)
    used = set(required_weights(config))  # Gemma 3n files may hold K/V that sharing layers never use
    tensors = {
        n: QTensor(n, info.type, info.shape, _gguf_loader(gguf, n))
        for n, info in gguf.tensors.items()
        if config.arch != "gemma3n" or n in used
    }
    tokenizer = TokenizerLoader(lambda: Tokenizer.from_gguf(gguf))
    return Model(config, Weights(tensors, str(path)), tokenizer, str(path), kind, metadata=gguf.metadata)


def load_hf(path: str | Path) -> Model:
    """A Hugging Face directory's config and tensor headers, checked; data and tokenizer read when used."""
    config, tensors = load_hf_dir(path)
    tokenizer = TokenizerLoader(lambda: Tokenizer.from_hf_dir(path))
    return Model(config, Weights(tensors, str(path)), tokenizer, str(path), "hf")
