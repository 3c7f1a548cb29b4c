#!/usr/bin/env python
"""Regenerate the tiny Gemma 3n checkpoints under tests/fixtures/gemma3n/ and their transformers logits in
tests/fixtures/gemma3n_transformers.json (the oracle of tests/test_gemma3n.py).

Each config in ``CONFIGS`` becomes a random ``Gemma3nForCausalLM`` (CPU torch, fp32, eager attention),
randomized after construction so that every path matters: norm weights 1 + noise (a wrong 1 + w shows), the
AltUp ``correct_output_scale`` (zero at init: the per-layer embedding would vanish) around 1, the modality
router at scale sqrt(hidden) (its input is RMSNorm(x) / hidden), the AltUp coefficients small noise, the
rest ~1/sqrt(fan in). The post-norms (after attention, MLP, LAuReL and the per-layer embedding) are scaled
by 0.3 and the AltUp coefficients kept at 0.05: with full-size branches and 0.2 coefficients the streams
grow tenfold over 15 layers and the random model amplifies float32 rounding to ~1e-3 in the logits (its own
prefill and token-by-token logits differed by 1.3e-3), too near the 5e-4 the tests check; so scaled, a
float64 run of the same model differs from float32 by ~2e-5. Weights are rounded to float16 before anything is computed, so the float16 directory
saved (``config.json``, ``model.safetensors``, and the tests' tiny ``tokenizer.model``) holds exactly the
weights the logits come from. For two prompts of each (a short one and one crossing the sliding window
three times) it records, at chosen positions, the whole logits row of one prefill with a cache and of
token-by-token decoding with the cache, and a 12-token greedy continuation with each step's top-2 margin.
transformers 5.24 shares KV with or without a cache; the script checks that a no-cache forward agrees.

With ``--llama-cpp DIR`` (the ``vendor/llama.cpp`` folder of the llama-cpp-python sdist, whose
``convert_hf_to_gguf.py`` needs torch, transformers and sentencepiece) it also converts the checkpoints of
``GGUF_CONFIGS`` with llama.cpp's own converter to ``tests/fixtures/gemma3n/<name>.gguf`` (f16): the
ground truth for the GGUF names and metadata the loader reads.

Dev-only: needs the ``reference`` extra (CPU torch, transformers >= 5.24); runs offline.

    HF_HUB_OFFLINE=1 python scripts/make_gemma3n_reference.py [--out-dir tests/fixtures] [--llama-cpp DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from reference_record import greedy  # noqa: E402
from tiny import tiny_vocab  # noqa: E402

from workbench.models import spm_proto as P  # noqa: E402

VOCAB = 300  # the tests' tiny tokenizer (tests/tiny.py)
GREEDY_STEPS = 12
PROMPT_SEED = 20261127
COEF_SCALE, POST_NORM_SCALE = 0.05, 0.3  # a random model that does not amplify rounding (see above)
GGUF_CONFIGS = ("e2b_pattern", "llama_cpp_layout")  # converted by llama.cpp's converter with --llama-cpp
GGUF_ONLY = ("llama_cpp_layout",)  # kept only as the converter's GGUF (its PLE table makes the folder 5 MB)
COMMON = dict(
    vocab_size=VOCAB,
    vocab_size_per_layer_input=VOCAB,
    max_position_embeddings=256,
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=1,
    altup_num_inputs=4,
    hidden_activation="gelu_pytorch_tanh",
)
# name -> (seed, Gemma3nTextConfig fields). Layer types default to global every 5th layer.
CONFIGS: dict[str, tuple[int, dict]] = {
    # E2B's pattern scaled down to 15 layers: global 4, 9, 14; layers 10-14 share the KV of 8 (sliding)
    # and 9 (global); layers 0-4 sparse (E2B: 30 layers, 20-29 share, 0-9 sparse); GQA groups of 4
    "e2b_pattern": (
        1,
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=15,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=8,
            sliding_window=8,
            num_kv_shared_layers=5,
            activation_sparsity_pattern=[0.95] * 5 + [0.0] * 10,
            hidden_size_per_layer_input=8,
            laurel_rank=4,
            final_logit_softcapping=30.0,
        ),
    ),
    # no sharing, a sparse global layer and another sparsity (0.8), other RoPE bases, eps, a tight softcap
    "gqa_softcap": (
        2,
        dict(
            hidden_size=64,
            intermediate_size=[64] * 4,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"] * 2,
            num_kv_shared_layers=0,
            activation_sparsity_pattern=[0.95, 0.8, 0.0, 0.0],
            hidden_size_per_layer_input=16,
            laurel_rank=8,
            rms_norm_eps=1e-5,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 200_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 5_000.0},
            },
            final_logit_softcapping=3.0,
        ),
    ),
    # alternating layer types, the last two layers sharing (4 <- 2, 5 <- 3), two sparse layers
    "shared_alternating": (
        3,
        dict(
            hidden_size=64,
            intermediate_size=64,
            num_hidden_layers=6,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=6,
            layer_types=["sliding_attention", "full_attention"] * 3,
            num_kv_shared_layers=2,
            activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0, 0.0, 0.0],
            hidden_size_per_layer_input=8,
            laurel_rank=4,
            final_logit_softcapping=30.0,
        ),
    ),
    # The layout llama.cpp's gemma3n graph hard-codes (src/models/gemma3n.cpp and models.h of its source):
    # layers 20+ reuse the KV of layers 18 (sliding) and 19 (global), the first 10 layers are sparse at 0.95,
    # the per-layer input is 256 wide and LAuReL rank 64. A smaller model would be run wrongly by llama.cpp,
    # so this one is what its greedy tokens are compared on (tests/test_gemma3n_llama_cpp.py).
    "llama_cpp_layout": (
        4,
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=25,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            sliding_window=8,
            num_kv_shared_layers=5,
            activation_sparsity_pattern=[0.95] * 10 + [0.0] * 15,
            hidden_size_per_layer_input=256,
            laurel_rank=64,
            final_logit_softcapping=30.0,
        ),
    ),
}


def prompts(window: int) -> dict[str, list[int]]:
    """A 6-token prompt and one of 3 windows + 3 tokens, of ids past the special tokens."""
    rng = np.random.default_rng(PROMPT_SEED)
    return {
        "short": [2, *rng.integers(6, VOCAB, size=5).tolist()],
        "long": [2, *rng.integers(6, VOCAB, size=3 * window + 2).tolist()],
    }


def positions(n: int, window: int) -> list[int]:
    """Rows recorded: the first, both sides of the window's first edge, past the second, the last."""
    return sorted({p for p in (0, window - 1, window, window + 1, 2 * window + 1, n - 1) if p < n})


def randomize(model, seed: int) -> None:
    """Random weights on every path, rounded to float16 (see the module docstring)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    hidden = model.config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = p.shape
            noise = torch.randn(shape, generator=g)
            if name.endswith("correct_output_scale"):
                value = 1.0 + 0.3 * noise
            elif name.endswith("modality_router.weight"):
                value = noise * math.sqrt(hidden)
            elif name.endswith(("prediction_coefs.weight", "correction_coefs.weight")):
                value = COEF_SCALE * noise
            elif p.ndim == 1:  # norm weights, used as stored (no 1 + w)
                value = (1.0 + 0.2 * noise) * (POST_NORM_SCALE if ".post_" in name else 1.0)
            else:
                value = noise / math.sqrt(shape[-1])
            p.copy_(value.half().float())


def logits_of(model, ids: list[int], cache: bool) -> np.ndarray:
    """All rows of one forward pass over ``ids`` (with a fresh cache or none), float32."""
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=cache).logits[0].float().numpy()


def token_by_token(model, ids: list[int]) -> np.ndarray:
    """The logits of each token fed alone after the cache of the ones before it."""
    import torch

    rows, cache = [], None
    with torch.no_grad():
        for t in ids:
            out = model(torch.tensor([[t]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            rows.append(out.logits[0, -1].float().numpy())
    return np.stack(rows)


def write_tokenizer(folder: Path) -> None:
    v = tiny_vocab()
    specials = {"unk": "<unk>", "bos": "<bos>", "eos": "<eos>", "pad": "<pad>"}
    proto = P.model_proto(v.tokens, v.scores, v.types, unk_id=3, bos_id=2, eos_id=1, pad_id=0,
                          special_pieces=specials)  # fmt: skip
    (folder / "tokenizer.model").write_bytes(proto)


def rows(logits: np.ndarray, where: list[int]) -> dict[str, list[float]]:
    return {str(p): [round(float(x), 6) for x in logits[p]] for p in where}


def write_json(path: Path, data: dict) -> None:
    """Indented JSON with each list of numbers on one line (a logits row is a line, not 300)."""
    text = json.dumps(data, indent=1)
    text = re.sub(
        r"\[\s+([-+0-9.eE,\s]+?)\s+\]",
        lambda m: "[" + " ".join(m.group(1).split()) + "]",
        text,
    )
    path.write_text(text + "\n")
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)", file=sys.stderr)


def add_unused_kv(folder: Path, config, seed: int) -> None:
    """Random K/V projections and K norms for the KV-sharing layers, as the Hub's Gemma 3n checkpoints carry:
    transformers 5.24 neither makes nor reads them, but llama.cpp's loader requires them in every layer."""
    from safetensors.numpy import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    rng = np.random.default_rng(seed)
    hidden, kv = config.hidden_size, config.num_key_value_heads * config.head_dim
    for i, mode in enumerate(config.kv_sharing_modes):
        if mode == "reuse":
            pre = f"model.layers.{i}.self_attn."
            for name, shape in (("k_proj.weight", (kv, hidden)), ("v_proj.weight", (kv, hidden))):
                tensors[pre + name] = (rng.standard_normal(shape) / np.sqrt(hidden)).astype(np.float16)
            tensors[pre + "k_norm.weight"] = np.ones(config.head_dim, np.float16)
    save_file(tensors, path, metadata={"format": "pt"})


def convert(llama_cpp: Path, folder: Path, out: Path) -> None:
    """``folder`` as an f16 GGUF file by llama.cpp's ``convert_hf_to_gguf.py`` (its bundled gguf-py)."""
    cmd = [sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(folder), "--outtype", "f16"]
    subprocess.run([*cmd, "--outfile", str(out)], check=True, cwd=llama_cpp, capture_output=True)
    print(f"{out.name}: by llama.cpp's converter ({out.stat().st_size / 1024:.0f} KiB)", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=ROOT / "tests" / "fixtures")
    ap.add_argument("--llama-cpp", type=Path, help="vendor/llama.cpp of the llama-cpp-python sdist")
    ap.add_argument("--only", nargs="+", choices=sorted(CONFIGS), help="regenerate these; keep the others")
    args = ap.parse_args()
    import torch
    import transformers
    from transformers import Gemma3nForCausalLM, Gemma3nTextConfig

    torch.set_num_threads(os.cpu_count() or 2)
    out = {
        "description": "Logits of tiny random Gemma 3n models (tests/fixtures/gemma3n/<name>, float16 "
        "weights) from Hugging Face transformers in fp32 on CPU, eager attention: whole rows at chosen "
        "positions of a prefill and of token-by-token decoding with the cache, and greedy continuations. "
        "Made by scripts/make_gemma3n_reference.py.",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "models": {},
    }
    json_path = args.out_dir / "gemma3n_transformers.json"
    if args.only:
        out["models"] = json.loads(json_path.read_text())["models"]
    for name, (seed, fields) in CONFIGS.items():
        if args.only and name not in args.only:
            continue
        config = Gemma3nTextConfig(**COMMON, **fields)
        torch.manual_seed(seed)
        model = Gemma3nForCausalLM(config).eval()
        model.config._attn_implementation = "eager"
        randomize(model, seed)
        entry = {
            "shared_layers": [i for i, m in enumerate(config.kv_sharing_modes) if m == "reuse"],
            "sparse_layers": [i for i, s in enumerate(config.activation_sparsity_pattern) if s > 0],
            "prompts": {},
        }
        window = config.sliding_window
        for pname, ids in prompts(window).items():
            prefill = logits_of(model, ids, cache=True)
            no_cache = float(np.abs(logits_of(model, ids, cache=False) - prefill).max())
            assert no_cache < 1e-5, f"{name}/{pname}: no-cache logits differ by {no_cache}"
            steps = token_by_token(model, ids)
            drift = float(np.abs(steps - prefill).max())
            greedy_ids, margins = greedy(model, ids, GREEDY_STEPS)
            where = positions(len(ids), window)
            entry["prompts"][pname] = {
                "ids": ids,
                "prefill": rows(prefill, where),
                "token_by_token": rows(steps, where),
                "greedy": greedy_ids,
                "greedy_margins": margins,
                "transformers_prefill_vs_token_by_token": drift,
            }
            print(f"{name}/{pname}: {len(ids)} tokens, prefill vs token by token {drift:.2g}, "
                  f"greedy {greedy_ids}", file=sys.stderr)  # fmt: skip
        folder = args.out_dir / "gemma3n" / name
        shutil.rmtree(folder, ignore_errors=True)
        model.half().save_pretrained(folder)
        write_tokenizer(folder)
        for extra in ("generation_config.json",):
            (folder / extra).unlink(missing_ok=True)
        size = sum(f.stat().st_size for f in folder.iterdir())
        print(f"{name}: {folder} ({size / 1024:.0f} KiB)", file=sys.stderr)
        out["models"][name] = entry
        if name in GGUF_ONLY:
            add_unused_kv(folder, config, seed)
        if args.llama_cpp and name in GGUF_CONFIGS:
            convert(args.llama_cpp, folder, folder.with_suffix(".gguf"))
        if name in GGUF_ONLY:
            if not args.llama_cpp:
                raise SystemExit(f"{name} is kept only as a GGUF: give --llama-cpp DIR")
            shutil.rmtree(folder)
    write_json(json_path, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
