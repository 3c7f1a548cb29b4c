"""Write Gemma 3 and Gemma 3n GGUF files (synthetic models, tests, conversions) through ``gguf.GGUFWriter``.

Tensors are given in numpy order: float arrays are stored as F32/F16, and ``uint8`` arrays of raw quant
blocks are stored as-is with their GGML type, so files are readable by llama.cpp too. Tensor data are
streamed one tensor at a time (a tensor may be given as a function that produces it), so a 16 GB model
is written without holding it in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from ..quant.formats import FORMATS, GGMLType
from .config import ModelConfig


@dataclass
class VocabSpec:
    """Tokenizer data as GGUF stores it."""

    tokens: Sequence[str]
    scores: Sequence[float]
    types: Sequence[int]
    bos_id: int = 2
    eos_id: int = 1
    unk_id: int = 3
    pad_id: int = 0
    add_bos: bool = True


@dataclass
class TensorSource:
    """A tensor to write: its GGML type, numpy-order value shape, and a function returning its data.

    ``chunks``, if given, yields the stored data in row blocks instead (raw blocks for quantized types),
    written one after the other, so a tensor larger than memory (Gemma 3n's per-layer table) streams.
    """

    type: GGMLType
    shape: tuple[int, ...]
    produce: Callable[[], np.ndarray]
    chunks: Callable[[], Iterator[np.ndarray]] | None = None

    @classmethod
    def of(cls, qtype: GGMLType, data: np.ndarray) -> TensorSource:
        if data.dtype == np.uint8 and qtype not in (GGMLType.F32, GGMLType.F16):
            cols = data.shape[-1] // FORMATS[qtype].block_bytes * FORMATS[qtype].block_elems
            return cls(qtype, (*data.shape[:-1], cols), lambda: data)
        return cls(qtype, tuple(data.shape), lambda: data)


def write_gguf(
    path: str | Path,
    config: ModelConfig,
    tensors: Mapping[str, tuple[GGMLType, np.ndarray | TensorSource]],
    vocab: VocabSpec,
    *,
    name: str = "",
    extra: Mapping[str, str | int | float] | None = None,
    on_tensor: Callable[[str, int], None] | None = None,
) -> Path:
    """Write a GGUF file with the Gemma 3 (or Gemma 3n, as llama.cpp's converter writes it) metadata of
    ``config``.

    ``tensors`` maps GGUF names to ``(type, data)``: float data (numpy shape) for F32/F16, or ``uint8``
    raw blocks of shape (rows, bytes per row) for quantized types; ``data`` may be a :class:`TensorSource`
    whose ``produce()`` is called only when the tensor is written.
    """
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    c = config
    w = GGUFWriter(str(tmp), c.arch)
    w.add_name(name or c.name)
    w.add_context_length(c.context_length)
    w.add_embedding_length(c.hidden)
    w.add_block_count(c.n_layers)
    w.add_feed_forward_length([c.ffn] * c.n_layers if c.arch == "gemma3n" else c.ffn)
    w.add_head_count(c.n_heads)
    w.add_head_count_kv(c.n_kv_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_layer_norm_rms_eps(c.rms_eps)
    w.add_rope_freq_base(c.rope_base_global)
    w.add_sliding_window(c.sliding_window)
    if c.arch == "gemma3n":
        _gemma3n_metadata(w, c)
    elif c.sliding_window_pattern != 6 or any(
        t != ("global" if (i + 1) % 6 == 0 else "sliding") for i, t in enumerate(c.layer_types)
    ):
        w.add_array("gemma3.attention.sliding_window_pattern", [t == "sliding" for t in c.layer_types])
    if c.rope_scale_global != 1.0:
        w.add_string(f"{c.arch}.rope.scaling.type", "linear")
        w.add_float32(f"{c.arch}.rope.scaling.factor", c.rope_scale_global)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(list(vocab.tokens))
    w.add_token_scores([float(s) for s in vocab.scores])
    w.add_token_types([int(t) for t in vocab.types])
    w.add_bos_token_id(vocab.bos_id)
    w.add_eos_token_id(vocab.eos_id)
    w.add_unk_token_id(vocab.unk_id)
    w.add_pad_token_id(vocab.pad_id)
    w.add_add_bos_token(vocab.add_bos)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    for k, v in (extra or {}).items():
        if isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        else:
            w.add_float32(k, float(v))
    sources = {
        n: d if isinstance(d, TensorSource) else TensorSource.of(q, d) for n, (q, d) in tensors.items()
    }
    for tname, src in sources.items():
        fmt = FORMATS[src.type]
        if src.type in (GGMLType.F32, GGMLType.F16):
            dt = np.dtype(np.float32 if src.type == GGMLType.F32 else np.float16)
            w.add_tensor_info(tname, src.shape, dt, int(np.prod(src.shape)) * dt.itemsize)
        else:
            rows = int(np.prod(src.shape[:-1])) if len(src.shape) > 1 else 1
            byte_shape = (*src.shape[:-1], fmt.nbytes(src.shape[-1]))
            w.add_tensor_info(
                tname,
                byte_shape,
                np.dtype(np.uint8),
                rows * byte_shape[-1],
                raw_dtype=GGMLQuantizationType(int(src.type)),
            )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for tname, src in sources.items():
        if src.chunks is not None:
            w.write_tensor_data(_Streamed(tname, src, on_tensor))
            continue
        data = src.produce()
        if src.type == GGMLType.F32:
            data = np.ascontiguousarray(data, dtype=np.float32)
        elif src.type == GGMLType.F16 and data.dtype != np.uint8:
            data = np.ascontiguousarray(data, dtype=np.float16)
        else:
            data = np.ascontiguousarray(data, dtype=np.uint8)
        if on_tensor is not None:
            on_tensor(tname, data.nbytes)
        w.write_tensor_data(data)
    w.close()
    tmp.replace(path)
    return path


class _Streamed:
    """What ``GGUFWriter.write_tensor_data`` needs of an array (``nbytes``, ``tofile``), fed by a source's
    ``chunks`` one block of rows at a time."""

    def __init__(self, name: str, src: TensorSource, on_tensor: Callable[[str, int], None] | None) -> None:
        fmt = FORMATS[src.type]
        rows = int(np.prod(src.shape[:-1])) if len(src.shape) > 1 else 1
        self.name, self.src, self.on_tensor = name, src, on_tensor
        self.nbytes = rows * fmt.nbytes(src.shape[-1])

    def tofile(self, fout) -> None:
        written = 0
        for chunk in self.src.chunks():
            chunk = np.ascontiguousarray(chunk)
            chunk.tofile(fout)
            written += chunk.nbytes
            if self.on_tensor is not None:
                self.on_tensor(self.name, chunk.nbytes)
        if written != self.nbytes:
            raise ValueError(f"{self.name}: its chunks hold {written} bytes, its shape needs {self.nbytes}")


def _gemma3n_metadata(w: GGUFWriter, c: ModelConfig) -> None:
    """The keys llama.cpp's converter adds for Gemma 3n (``Gemma3NModel.set_gguf_parameters``)."""
    w.add_rope_freq_base_swa(c.rope_base_local)
    if c.final_logit_softcap:
        w.add_final_logit_softcapping(c.final_logit_softcap)
    w.add_altup_active_idx(0)
    w.add_altup_num_inputs(c.altup_inputs)
    w.add_embedding_length_per_layer_input(c.ple_dim)
    w.add_shared_kv_layers(c.kv_shared_layers)
    # Phi^-1 of each layer's sparsity, as the converter computes it (float32): -inf on dense layers
    w.add_activation_sparsity_scale(
        [
            float(np.float32(NormalDist().inv_cdf(float(np.float32(s))))) if s > 0 else -np.inf
            for s in c.activation_sparsity
        ]
    )
    w.add_sliding_window_pattern([t == "sliding" for t in c.layer_types])


__all__ = ["TensorSource", "VocabSpec", "write_gguf"]
