"""Tiny random Gemma 3 models written by tests: an HF directory and the same weights as a GGUF file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from workbench.models import spm_proto as P
from workbench.models.config import ModelConfig
from workbench.models.export import hf_name, write_safetensors
from workbench.models.gemma3 import weight_shapes
from workbench.models.gguf_writer import VocabSpec, write_gguf
from workbench.quant.formats import GGMLType

TINY = ModelConfig(
    name="tiny",
    n_layers=3,
    hidden=64,
    ffn=96,
    n_heads=4,
    n_kv_heads=2,
    head_dim=16,
    vocab_size=300,
    context_length=256,
    sliding_window=8,
    sliding_window_pattern=3,
    query_pre_attn_scalar=16,
)


def tiny_vocab() -> VocabSpec:
    """pad/eos/bos/unk, two chat markers, 256 byte pieces, then a few normal pieces."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    types = [P.CONTROL] * 3 + [P.UNKNOWN] + [P.CONTROL] * 2
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [P.BYTE] * 256
    normal = ["\u2581", "\u2581the", "e", "t", "a", "o", "\u2581a", "th", "he", "in", "er", "an", "re", "on"]
    while len(tokens) + len(normal) < TINY.vocab_size:
        normal.append(f"x{len(normal)}")
    tokens += normal[: TINY.vocab_size - len(tokens)]
    types += [P.NORMAL] * (TINY.vocab_size - len(types))
    scores = [0.0 if t == P.BYTE else (-float(i) if t == P.NORMAL else -1000.0) for i, t in enumerate(types)]
    return VocabSpec(tokens, scores, types)


def tiny_weights(config: ModelConfig = TINY, seed: int = 0) -> dict[str, np.ndarray]:
    """Float32 weights in GGUF naming; norm weights in the model's convention (the used 1 + w)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in weight_shapes(config).items():
        if name.split(".")[-2].endswith("norm"):
            out[name] = (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    return out


def write_tiny_gguf(
    path: Path, weights: dict[str, np.ndarray] | None = None, config: ModelConfig = TINY
) -> Path:
    weights = weights if weights is not None else tiny_weights(config)
    return write_gguf(path, config, {n: (GGMLType.F32, w) for n, w in weights.items()}, tiny_vocab())


def write_tiny_hf(
    folder: Path,
    weights: dict[str, np.ndarray] | None = None,
    dtype: str = "float32",
    shards: int = 1,
    config: ModelConfig = TINY,
) -> Path:
    """An HF directory: config.json, tokenizer.model, safetensors (``shards`` files + index when > 1)."""
    weights = weights if weights is not None else tiny_weights(config)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config.to_hf_config()))
    v = tiny_vocab()
    (folder / "tokenizer.model").write_bytes(
        P.model_proto(
            v.tokens,
            v.scores,
            v.types,
            unk_id=3,
            bos_id=2,
            eos_id=1,
            pad_id=0,
            special_pieces={"unk": "<unk>", "bos": "<bos>", "eos": "<eos>", "pad": "<pad>"},
        )
    )
    items = []
    for name, w in weights.items():
        hf, is_norm = hf_name(name)
        items.append((hf, w.shape, (lambda w=w, n=is_norm: w - np.float32(1.0) if n else w)))
    if shards == 1:
        write_safetensors(folder / "model.safetensors", {n: (s, f) for n, s, f in items}, dtype)
        return folder
    weight_map = {}
    for k in range(shards):
        part = items[k::shards]
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(folder / fname, {n: (s, f) for n, s, f in part}, dtype)
        weight_map.update({n: fname for n, _, _ in part})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    return folder
