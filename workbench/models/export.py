"""Export a loaded model as a Hugging Face directory (config.json, model.safetensors, tokenizer.model).

Weights are dequantized to float32 (or stored as float16/bfloat16) and norms written in Hugging Face's
convention (``w``, the model using ``1 + w``). The safetensors file is streamed tensor by tensor, so
exporting never holds more than one dequantized tensor in memory.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from .model import Model

_HF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_NORMS = {"attn_q_norm", "attn_k_norm", "attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"}
_DTYPES = {
    "float32": ("F32", np.dtype("<f4")),
    "float16": ("F16", np.dtype("<f2")),
    "bfloat16": ("BF16", None),
}


def hf_name(gguf_name: str) -> tuple[str, bool]:
    """(Hugging Face name, is-norm) of a GGUF tensor name."""
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight", False
    if gguf_name == "output_norm.weight":
        return "model.norm.weight", True
    if gguf_name == "output.weight":
        return "lm_head.weight", False
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _HF_NAMES:
        return f"model.layers.{parts[1]}.{_HF_NAMES[parts[2]]}.weight", parts[2] in _NORMS
    raise KeyError(f"no Hugging Face name for tensor {gguf_name!r}")


def _encode(values: np.ndarray, dtype: str) -> bytes:
    if dtype == "bfloat16":
        bits = np.ascontiguousarray(values, dtype="<f4").view("<u4")
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
        return rounded.astype("<u2").tobytes()
    return np.ascontiguousarray(values, dtype=_DTYPES[dtype][1]).tobytes()


def write_safetensors(path: Path, tensors: dict[str, tuple[tuple[int, ...], callable]], dtype: str) -> None:
    """Write ``name -> (shape, producer)`` where ``producer()`` returns float32 values, one at a time."""
    code, _ = _DTYPES[dtype]
    item = 4 if dtype == "float32" else 2
    header, offset = {}, 0
    for name, (shape, _) in tensors.items():
        n = int(np.prod(shape)) * item
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, (_, produce) in tensors.items():
            f.write(_encode(produce(), dtype))
    tmp.replace(path)


def export_hf(model: Model, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Write ``model`` as a Hugging Face Gemma 3 directory; returns the directory."""
    if dtype not in _DTYPES:
        raise ValueError(f"export dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_hf_config()
    cfg["torch_dtype"] = dtype
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    tensors = {}
    for name, t in model.weights.items():
        hf, is_norm = hf_name(name)

        def produce(t=t, is_norm=is_norm) -> np.ndarray:
            v = t.dequantize()
            return v - np.float32(1.0) if is_norm else v

        tensors[hf] = (t.shape, produce)
    write_safetensors(out / "model.safetensors", tensors, dtype)
    (out / "tokenizer.model").write_bytes(model.tokenizer.sp.serialized_model_proto())
    tok_cfg = {
        "add_bos_token": model.tokenizer.add_bos,
        "add_eos_token": False,
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    return out
