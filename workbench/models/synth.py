"""Synthetic models: valid GGUF files with random weights of the real shapes and quant formats.

They let speed be studied for models whose weights are not here (Gemma 3 1B to 27B, Gemma 3n E2B and
E4B); results on them are labeled synthetic. Quant formats per tensor follow llama.cpp's rules for each
file type (``llama-quantize``, ``src/llama-quant.cpp``: Q4_K_M gives some layers Q6_K, falls back to
Q5_0/Q8_0 when a row is not a multiple of 256, leaves Gemma 3n's AltUp, LAuReL and per-layer projection
tensors as the converter wrote them, ...), so the bytes moved per token match a real quantized file. Big
tensors are generated and written in blocks of rows, so an E4B (several GB) is written in bounded memory.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from ..paths import cache_dir
from ..quant.formats import FORMATS, QK_K, GGMLType
from . import gemma3n
from .bundled import default_model_path
from .config import ModelConfig, UnsupportedModelError, preset
from .gemma3 import required_weights, weight_shapes
from .gguf import GGUFFile
from .gguf_writer import TensorSource, VocabSpec, write_gguf
from .vocab import fit_vocab, generated_vocab, read_vocab_file, vocab_from_gguf, write_vocab_file

QUANTS = ("f32", "f16", "q8_0", "q5_0", "q4_0", "q6_k", "q4_k_m")
_FALLBACK = {GGMLType.Q4_K: GGMLType.Q5_0, GGMLType.Q5_K: GGMLType.Q5_1, GGMLType.Q6_K: GGMLType.Q8_0}


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


BASE_TYPES = {
    "f32": GGMLType.F32,
    "f16": GGMLType.F16,
    "q8_0": GGMLType.Q8_0,
    "q5_0": GGMLType.Q5_0,
    "q4_0": GGMLType.Q4_0,
    "q6_k": GGMLType.Q6_K,
    "q4_k_m": GGMLType.Q4_K,
}
# Gemma 3n tensors llama-quantize never quantizes (``tensor_allows_quantization``: names with "altup",
# "laurel" or "per_layer_model_proj"); they keep the converter's type: F32 for the AltUp coefficient
# matrices (as llama.cpp's converter writes them), F16 for the rest (its f16 output).
GEMMA3N_KEPT_F32 = ("altup_correct_coef", "altup_predict_coef")
GEMMA3N_KEPT = (
    "altup_proj",
    "altup_unembd_proj",
    "altup_router",
    "laurel_l",
    "laurel_r",
    "per_layer_model_proj",
)


def file_weights(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Numpy-order shape of every tensor a GGUF of ``config`` holds, in file order.

    For Gemma 3n that is every weight the model uses plus the K/V projections and K norm of the sharing
    layers, which the graph never reads: Google's checkpoints (and so llama.cpp's converter) carry them,
    and llama.cpp's loader requires them in every layer.
    """
    if config.arch != "gemma3n":
        shapes = weight_shapes(config)
        return {n: shapes[n] for n in required_weights(config)}
    used = gemma3n.weight_shapes(config)
    kv = {"attn_k": (config.kv_dim, config.hidden), "attn_v": (config.kv_dim, config.hidden)}
    kv["attn_k_norm"] = (config.head_dim,)
    out: dict[str, tuple[int, ...]] = {}
    for name in gemma3n.required_weights(config):
        out[name] = used[name]
        layer = name.split(".")[1] if name.startswith("blk.") else None
        if layer is not None and name.endswith(".proj.weight") and not config.owns_kv(int(layer)):
            for k, shape in kv.items():  # after each sharing layer's last weight
                out[f"blk.{layer}.{k}.weight"] = shape
    return out


def _gemma3n_plan(config: ModelConfig, quant: str) -> dict[str, GGMLType]:
    """llama-quantize's choice for each Gemma 3n tensor. Q4_K_M: the tied token embedding and the
    per-layer table (both "token_embd" to llama.cpp, and tied to the output) Q6_K; ``attn_v`` and
    ``ffn_down`` Q6_K on the layers ``use_more_bits`` picks (every layer has an ``attn_v`` in the file);
    the rest Q4_K; AltUp, LAuReL and the per-layer projection kept; norms and vectors F32."""
    base, n = BASE_TYPES[quant], config.n_layers
    plan: dict[str, GGMLType] = {}
    for name, shape in file_weights(config).items():
        kind = name.split(".")[-2]
        layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
        if len(shape) < 2 or kind.endswith("norm") or kind in GEMMA3N_KEPT_F32 or quant == "f32":
            plan[name] = GGMLType.F32
            continue
        if kind in GEMMA3N_KEPT:
            plan[name] = GGMLType.F16
            continue
        t = base
        embedding = kind in ("token_embd", "per_layer_token_embd")
        if quant == "q4_k_m" and (embedding or (kind in ("attn_v", "ffn_down") and _use_more_bits(layer, n))):
            t = GGMLType.Q6_K
        if FORMATS[t].block_elems == QK_K and shape[-1] % QK_K:
            t = _FALLBACK.get(t, GGMLType.Q8_0)
        plan[name] = t
    return plan


def quant_plan(config: ModelConfig, quant: str) -> dict[str, GGMLType]:
    """GGML type of every tensor of the file for a file type (``q4_k_m``, ``q8_0``, ``f16``, ...)."""
    quant = quant.lower()
    if quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r} (known: {', '.join(QUANTS)})")
    if config.arch == "gemma3n":
        return _gemma3n_plan(config, quant)
    plan: dict[str, GGMLType] = {}
    base = BASE_TYPES[quant]
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


CHUNK_BYTES = 64 << 20  # tensors larger than this are generated and written in blocks of rows


def _source(name: str, qtype: GGMLType, shape: tuple[int, ...], seed: int) -> TensorSource:
    def produce() -> np.ndarray:
        rng = np.random.default_rng(seed)
        if name.split(".")[-2].endswith("norm"):
            return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        if qtype in (GGMLType.F32, GGMLType.F16):
            return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
        return random_blocks(qtype, shape[0], shape[-1], rng)

    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    row_bytes = FORMATS[qtype].nbytes(shape[-1])
    if rows * row_bytes <= CHUNK_BYTES or qtype in (GGMLType.F32, GGMLType.F16):
        return TensorSource(qtype, shape, produce)
    step = max(32, CHUNK_BYTES // row_bytes // 32 * 32)

    def chunks():
        rng = np.random.default_rng(seed)
        for r in range(0, rows, step):
            yield random_blocks(qtype, min(step, rows - r), shape[-1], rng)

    return TensorSource(qtype, shape, produce, chunks)


VOCAB_ENV = "WORKBENCH_VOCAB"
GENERATED = "generated"


def bundled_vocab() -> VocabSpec:
    """Gemma 3's vocabulary from the bundled model package, or an error that says what to do without it."""
    try:
        path = default_model_path()
    except UnsupportedModelError as e:
        raise UnsupportedModelError(
            f"synthetic models take Gemma 3's vocabulary from the bundled model, but {e}. Without it: on a "
            f"machine that has it run `workbench synth --write-vocab gemma3-vocab.json.gz`, copy that file "
            f"here and pass `--vocab gemma3-vocab.json.gz` (or set {VOCAB_ENV}=PATH); or pass "
            f"`--vocab {GENERATED}` for a generated vocabulary (byte tokens only: same speed, but text "
            f"tokenizes byte by byte)"
        ) from None
    return vocab_from_gguf(GGUFFile(path))


def synthetic_vocab(vocab_size: int, source: str | Path | None = None) -> tuple[VocabSpec, str]:
    """(vocabulary of ``vocab_size`` tokens, its label) for a synthetic model.

    ``source`` is a vocabulary file (``workbench synth --write-vocab``), ``generated``, or None for
    ``$WORKBENCH_VOCAB`` if set, else the bundled model. Vocabularies are padded with unused control tokens
    (or cut) to ``vocab_size``. The label (``bundled``, ``file``, ``generated``) is stored in the GGUF.
    """
    source = source if source is not None else os.environ.get(VOCAB_ENV) or None
    if source is None:
        vocab, label = bundled_vocab(), "bundled"
    elif str(source) == GENERATED:
        print(
            "workbench: WARNING: synthetic model with a GENERATED vocabulary, not Gemma 3's: token ids of "
            "text differ from the real models' (speed does not)",
            file=sys.stderr,
        )
        vocab, label = generated_vocab(), GENERATED
    else:
        vocab, label = read_vocab_file(source), "file"
    return fit_vocab(vocab, vocab_size), label


def write_bundled_vocab(out: str | Path) -> Path:
    """Write the bundled model's vocabulary as a vocabulary file (for machines without the package)."""
    vocab = bundled_vocab()
    return write_vocab_file(vocab, out, source=default_model_path().name)


def write_synthetic(
    config: ModelConfig,
    quant: str,
    out: str | Path,
    seed: int = 0,
    progress: bool = True,
    vocab: str | Path | None = None,
) -> Path:
    """Write a synthetic GGUF for ``config`` quantized as ``quant``; returns its path.

    ``vocab`` is where the tokenizer comes from (see :func:`synthetic_vocab`).
    """
    plan = quant_plan(config, quant)
    spec, vocab_label = synthetic_vocab(config.vocab_size, vocab)
    shapes = file_weights(config)
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
            spec,
            name=f"synthetic {config.name}" + (" (generated vocabulary)" if vocab_label == GENERATED else ""),
            extra={"workbench.synthetic": 1, "workbench.vocab": vocab_label, "general.file_type_name": quant},
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
    """Path of the cached synthetic GGUF for ``spec`` (written on first use; vocabulary as
    :func:`synthetic_vocab` finds it, so ``$WORKBENCH_VOCAB`` serves machines without the bundled model)."""
    config, quant = parse_spec(spec)
    quant_plan(config, quant)  # validate before any work
    generated = os.environ.get(VOCAB_ENV) == GENERATED
    path = cache_dir("synth") / f"{config.name}-{quant}{'-generated-vocab' if generated else ''}.gguf"
    if not path.exists():
        print(f"workbench: writing synthetic model {config.name} ({quant}) to {path}", file=sys.stderr)
        write_synthetic(config, quant, path)
    return path
