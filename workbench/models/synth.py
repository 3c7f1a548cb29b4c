"""Synthetic models: valid GGUF files with random weights of the real shapes and quant formats.

They let speed be studied for models whose weights are not here (Gemma 3 1B to 27B); results on them are
labeled synthetic. Quant formats per tensor follow llama.cpp's rules for each file type (Q4_K_M gives some
layers Q6_K, falls back to Q5_0/Q8_0 when a row is not a multiple of 256, ...), so the bytes moved per
token match a real quantized file.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ..paths import cache_dir
from ..quant.formats import FORMATS, QK_K, GGMLType
from .config import ModelConfig, preset
from .gemma3 import required_weights
from .gguf_writer import TensorSource, VocabSpec, write_gguf

QUANTS = ("f32", "f16", "q8_0", "q5_0", "q4_0", "q6_k", "q4_k_m")
_FALLBACK = {GGMLType.Q4_K: GGMLType.Q5_0, GGMLType.Q5_K: GGMLType.Q5_1, GGMLType.Q6_K: GGMLType.Q8_0}


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def quant_plan(config: ModelConfig, quant: str) -> dict[str, GGMLType]:
    """GGML type of every weight for a file type (``q4_k_m``, ``q8_0``, ``f16``, ...)."""
    quant = quant.lower()
    if quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r} (known: {', '.join(QUANTS)})")
    plan: dict[str, GGMLType] = {}
    base = {
        "f32": GGMLType.F32,
        "f16": GGMLType.F16,
        "q8_0": GGMLType.Q8_0,
        "q5_0": GGMLType.Q5_0,
        "q4_0": GGMLType.Q4_0,
        "q6_k": GGMLType.Q6_K,
        "q4_k_m": GGMLType.Q4_K,
    }[quant]
    n = config.n_layers
    for name in required_weights(config):
        kind = name.split(".")[-2]
        if kind.endswith("norm"):
            plan[name] = GGMLType.F32
            continue
        t = base
        if quant == "q4_k_m":
            layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
            if name == "token_embd.weight" and config.tie_embeddings:
                t = GGMLType.Q6_K  # the tied embedding is the output matrix
            elif kind in ("attn_v", "ffn_down") and _use_more_bits(layer, n):
                t = GGMLType.Q6_K
        cols = (
            config.hidden
            if kind not in ("attn_output", "ffn_down")
            else (config.q_dim if kind == "attn_output" else config.ffn)
        )
        if FORMATS[t].block_elems == QK_K and cols % QK_K:
            t = _FALLBACK.get(t, GGMLType.Q8_0)
        plan[name] = t
    return plan


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    c = config
    shapes = {
        "token_embd": (c.vocab_size, c.hidden),
        "attn_q": (c.q_dim, c.hidden),
        "attn_k": (c.kv_dim, c.hidden),
        "attn_v": (c.kv_dim, c.hidden),
        "attn_output": (c.hidden, c.q_dim),
        "ffn_gate": (c.ffn, c.hidden),
        "ffn_up": (c.ffn, c.hidden),
        "ffn_down": (c.hidden, c.ffn),
        "attn_q_norm": (c.head_dim,),
        "attn_k_norm": (c.head_dim,),
        "output": (c.vocab_size, c.hidden),
    }
    return {n: shapes.get(n.split(".")[-2], (c.hidden,)) for n in required_weights(config)}


def random_blocks(qtype: GGMLType, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random quant blocks with sane scales (small positive f16), shape (rows, bytes per row)."""
    fmt = FORMATS[qtype]
    nb = cols // fmt.block_elems
    raw = rng.integers(0, 256, size=(rows, nb, fmt.block_bytes), dtype=np.uint8)
    scale_offsets = {
        GGMLType.Q8_0: [0],
        GGMLType.Q5_0: [0],
        GGMLType.Q4_0: [0],
        GGMLType.Q5_1: [0, 2],
        GGMLType.Q4_1: [0, 2],
        GGMLType.Q4_K: [0, 2],
        GGMLType.Q5_K: [0, 2],
        GGMLType.Q6_K: [208],
    }[qtype]
    for off in scale_offsets:
        d = rng.uniform(2e-4, 2e-3, size=(rows, nb)).astype("<f2")
        raw[:, :, off : off + 2] = d.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, nb * fmt.block_bytes)


def _source(name: str, qtype: GGMLType, shape: tuple[int, ...], seed: int) -> TensorSource:
    def produce() -> np.ndarray:
        rng = np.random.default_rng(seed)
        if name.split(".")[-2].endswith("norm"):
            return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        if qtype in (GGMLType.F32, GGMLType.F16):
            return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
        return random_blocks(qtype, shape[0], shape[-1], rng)

    return TensorSource(qtype, shape, produce)


def default_vocab(vocab_size: int) -> VocabSpec:
    """Gemma 3's vocabulary from the bundled model, padded with unused control tokens to ``vocab_size``."""
    from .gguf import GGUFFile
    from .registry import default_model_path

    meta = GGUFFile(default_model_path()).metadata
    tokens = meta["tokenizer.ggml.tokens"].tolist()[:vocab_size]
    scores = np.asarray(meta["tokenizer.ggml.scores"], dtype=np.float32)[:vocab_size].tolist()
    types = np.asarray(meta["tokenizer.ggml.token_type"]).astype(int)[:vocab_size].tolist()
    for i in range(len(tokens), vocab_size):
        tokens.append(f"<unused_synthetic_{i}>")
        scores.append(-1000.0)
        types.append(3)
    return VocabSpec(tokens, scores, types)


def write_synthetic(
    config: ModelConfig, quant: str, out: str | Path, seed: int = 0, progress: bool = True
) -> Path:
    """Write a synthetic GGUF for ``config`` quantized as ``quant``; returns its path."""
    plan = quant_plan(config, quant)
    shapes = weight_shapes(config)
    tensors = {n: (plan[n], _source(n, plan[n], shapes[n], seed * 100003 + i)) for i, n in enumerate(plan)}
    total = sum(FORMATS[t].nbytes(int(np.prod(shapes[n]))) for n, t in plan.items())
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(
            total=total, unit="B", unit_scale=True, desc=f"synth {config.name} {quant}", file=sys.stderr
        )
    try:
        return write_gguf(
            out,
            config,
            tensors,
            default_vocab(config.vocab_size),
            name=f"synthetic {config.name}",
            extra={"workbench.synthetic": 1, "general.file_type_name": quant},
            on_tensor=(lambda _n, nb: bar.update(nb)) if bar else None,
        )
    finally:
        if bar:
            bar.close()


def parse_spec(spec: str) -> tuple[ModelConfig, str]:
    """``gemma3-1b`` or ``gemma3-1b:q8_0`` -> (config, quant); the default quant is q4_k_m."""
    name, _, quant = spec.partition(":")
    return preset(name), (quant or "q4_k_m").lower()


def synthetic_model_path(spec: str) -> Path:
    """Path of the cached synthetic GGUF for ``spec`` (written on first use)."""
    config, quant = parse_spec(spec)
    quant_plan(config, quant)  # validate before any work
    path = cache_dir("synth") / f"{config.name}-{quant}.gguf"
    if not path.exists():
        print(f"workbench: writing synthetic model {config.name} ({quant}) to {path}", file=sys.stderr)
        write_synthetic(config, quant, path)
    return path
