"""Tiny random Gemma 3 models in the layouts of the large sizes, shared by the tests and by
scripts/make_layout_reference.py (which records transformers' logits for them in
tests/fixtures/gemma3_layouts_transformers.json).

- ``LAYOUT_27B``: the 27B's attention layout: GQA groups of 2 (4 query heads, 2 KV heads), head_dim 128,
  query_pre_attn_scalar 168 (scale 168^-0.5, not head_dim^-0.5), x8 linear RoPE scaling on the global
  layers, a 16-token sliding window that the prompts cross.
- ``LAYOUT_4B``: a ``Gemma3ForConditionalGeneration`` directory as the Hub ships 4B-12B: its
  ``text_config`` (``HUB_TEXT_CONFIG``) gives only hidden/FFN sizes, layers, RoPE scaling and the window,
  leaving heads (8), KV heads (4), head_dim (256), the vocabulary (262,208) and query_pre_attn_scalar
  (256) to transformers' defaults; text weights under ``language_model``, plus vision tensors to ignore.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from tiny import TINY, tiny_weights, write_tiny_hf

from workbench.models.export import hf_name, write_safetensors

LAYOUT_27B = TINY.with_(
    name="tiny-27b-layout",
    n_layers=4,
    hidden=192,
    ffn=384,
    head_dim=128,
    context_length=256,
    sliding_window=16,
    sliding_window_pattern=2,
    query_pre_attn_scalar=168,
    rope_scale_global=8.0,
)  # TINY's 4 query heads, 2 KV heads and 300-token vocabulary
HUB_TEXT_CONFIG = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "model_type": "gemma3_text",
    "num_hidden_layers": 6,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "sliding_window": 16,
}
LAYOUT_4B = TINY.with_(
    name="tiny-4b-layout",
    n_layers=6,
    hidden=32,
    ffn=64,
    n_heads=8,
    n_kv_heads=4,
    head_dim=256,
    vocab_size=262_208,
    context_length=131_072,
    sliding_window=16,
    sliding_window_pattern=6,
    query_pre_attn_scalar=256,
    rope_scale_global=8.0,
)
LAYOUTS = {"27b": LAYOUT_27B, "4b": LAYOUT_4B}
SEED = 27
# where each style keeps the text model and the vision tower: the Hub's files, and newer transformers' saves
STYLES = {
    "hub": ("language_model.model.", "vision_tower.vision_model."),
    "transformers5": ("model.language_model.", "model.vision_tower."),
}
VISION_CONFIG = {
    "model_type": "siglip_vision_model",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": 28,
    "patch_size": 14,
    "vision_use_head": False,
}


def layout_weights(layout: str) -> dict[str, np.ndarray]:
    """The fixture's weights of a layout (GGUF names, float32)."""
    return tiny_weights(LAYOUTS[layout], seed=SEED)


def weights_digest(weights: dict[str, np.ndarray]) -> str:
    """SHA-256 over names and float32 bytes, so a fixture notices when its weights are made differently."""
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode())
        h.update(np.ascontiguousarray(weights[name], dtype="<f4").tobytes())
    return h.hexdigest()


def _vision_tensors(vision_prefix: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A few vision-tower and projector tensors; one is named like a text layer's q_proj."""
    shapes = {
        f"{vision_prefix}embeddings.patch_embedding.weight": (32, 3, 14, 14),
        f"{vision_prefix}embeddings.position_embedding.weight": (4, 32),
        f"{vision_prefix}encoder.layers.0.self_attn.q_proj.weight": (32, 32),
        f"{vision_prefix}post_layernorm.weight": (32,),
        "multi_modal_projector.mm_input_projection_weight": (32, HUB_TEXT_CONFIG["hidden_size"]),
        "multi_modal_projector.mm_soft_emb_norm.weight": (32,),
    }
    top = "model." if vision_prefix.startswith("model.") else ""
    return {
        (top + n if n.startswith("multi_modal") else n): rng.standard_normal(s).astype(np.float32)
        for n, s in shapes.items()
    }


def write_conditional_hf(
    folder: Path, weights: dict[str, np.ndarray], style: str = "hub", text_config: dict | None = None
) -> Path:
    """A ``Gemma3ForConditionalGeneration`` directory: Hub-style config.json, tokenizer.model, and one
    safetensors file with the text weights under ``language_model`` (``style``) and vision tensors."""
    text_prefix, vision_prefix = STYLES[style]
    write_tiny_hf(folder, weights, config=LAYOUT_4B)  # the tokenizer, then config and weights replaced
    (folder / "model.safetensors").unlink()
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "boi_token_index": 255_999,
        "eoi_token_index": 256_000,
        "image_token_index": 262_144,
        "mm_tokens_per_image": 4,
        "eos_token_id": [1, 106],
        "text_config": dict(HUB_TEXT_CONFIG if text_config is None else text_config),
        "vision_config": VISION_CONFIG,
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    tensors = {}
    for name, w in weights.items():
        hf, is_norm = hf_name(name)
        value = w - np.float32(1.0) if is_norm else w
        tensors[text_prefix + hf.removeprefix("model.")] = value
    tensors.update(_vision_tensors(vision_prefix, np.random.default_rng(SEED)))
    write_safetensors(
        folder / "model.safetensors", {n: (v.shape, lambda v=v: v) for n, v in tensors.items()}, "float32"
    )
    return folder
