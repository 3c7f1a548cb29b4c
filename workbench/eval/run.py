"""Evaluate a model variant (re-quantized, sparse) against the unmodified model, accuracy and speed.

Accuracy, on the evaluation text cut into windows of ``window`` tokens (each its own sequence, BOS first),
run in chunks of ``chunk`` tokens with every row's logits (``Engine.forward(..., logits="all")``): the
variant's and the reference's perplexity, KL(reference || variant) and top-1 agreement of next-token
distributions; then greedy continuations of prompts taken from the text, compared token by token.

Speed, measured here: greedy decode tokens/s of the variant and of the reference after a prompt of
``speed_prompt`` text tokens, alternating in one run (median of ``repeats``), and ``profile_repeats``
profiled decodes of each (alternating, median) giving the FFN block's op time per token (the ops
``blk.N.ffn*`` and ``blk.N.post_ffw*``: norm, FFN, post-norm, residual) and the attention ops' time per
token (``blk.N.attn``), so the two compare side by side. For N:M sparse weights, the variant is also timed
against its dense twin (the same pruned values stored dense in the same format), decode tokens/s and the
time of the ops that multiply N:M weights: the speed of the kernels that skip the pruned weights.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from tqdm.auto import tqdm

from ..instrument.profiler import Profiler
from ..models.model import Model
from ..models.registry import DEFAULT_MODEL
from ..runtime.engine import Engine
from ..runtime.sampling import SamplingParams
from ..sparsity.apply import build_variant
from ..sparsity.nm import dense_twin, nm_weight_count
from .ffn_ops import ffn_layer_times
from .metrics import TokenMetrics, greedy_agreement
from .op_names import ATTN_OP, FFN_OP
from .text import DEFAULT_TEXT, eval_tokens, load_text, prompts_from_text


@dataclass
class EvalConfig:
    """What to evaluate and how much: defaults fit a 270M model on 2 cores in a few minutes."""

    model: str = DEFAULT_MODEL
    quant: str = "native"
    sparsity: str = "none"
    backend: str = "cpu"
    ref_backend: str | None = None  # the reference's backend (default: the same)
    text: str = DEFAULT_TEXT
    tokens: int = 1024  # text tokens scored
    window: int = 512  # tokens per sequence (a fresh KV cache per window)
    chunk: int = 128  # tokens per forward call
    prompts: int = 4  # greedy-continuation prompts
    continuation: int = 16  # tokens generated per prompt
    speed_tokens: int = 32  # decode tokens per timed run (0: no speed measurement)
    repeats: int = 3
    profile_repeats: int = 1  # profiled decodes of each side for the FFN op time (median)
    ffn_layer_repeats: int = 0  # >0: also time one layer's FFN ops side by side (warm caches, cpu only)
    threads: int | None = None
    tune: str | None = None
    speed_prompt: int = 16  # text tokens (after BOS) before the timed decodes (long: attention-bound)

    def __post_init__(self) -> None:
        for name in ("tokens", "window", "chunk", "repeats", "profile_repeats", "speed_prompt"):
            if getattr(self, name) < 1:
                raise ValueError(f"eval {name} must be >= 1, got {getattr(self, name)}")
        for name in ("prompts", "continuation", "speed_tokens", "ffn_layer_repeats"):
            if getattr(self, name) < 0:
                raise ValueError(f"eval {name} must be >= 0, got {getattr(self, name)}")


def _engine(model: Model, backend: str, cfg: EvalConfig) -> Engine:
    opts: dict[str, Any] = {}
    if cfg.threads:
        opts["threads"] = cfg.threads
    if cfg.tune:
        opts["tune"] = cfg.tune
    return Engine(model, backend, prefill_chunk=cfg.chunk, **opts)


def score_text(
    ref: Engine, var: Engine, ids: list[int], bos: list[int], cfg: EvalConfig, progress: bool
) -> TokenMetrics:
    """Accumulate :class:`TokenMetrics` over ``ids`` in windows (each starting with ``bos``) and chunks."""
    tm = TokenMetrics()
    windows = [bos + ids[s : s + cfg.window] for s in range(0, len(ids), cfg.window)]
    total = sum(len(w) - 1 for w in windows)
    with tqdm(total=total, desc="eval text", unit="tok", disable=not progress) as bar:
        for win in windows:
            seq_ref, seq_var = ref.new_sequence(len(win)), var.new_sequence(len(win))
            for s in range(0, len(win) - 1, cfg.chunk):
                piece = win[s : s + cfg.chunk]
                targets = win[s + 1 : s + 1 + len(piece)]
                rows = len(targets)  # the window's last token has no target
                tm.add(ref.forward(seq_ref, piece, logits="all")[:rows],
                       var.forward(seq_var, piece, logits="all")[:rows], targets)  # fmt: skip
                bar.update(rows)
    return tm


def _continuations(engine: Engine, prompts: list[str], n: int) -> list[list[int]]:
    greedy = SamplingParams()
    return [engine.generate(p, n, greedy, stop_ids=()).output_ids for p in prompts]


def _decode_ops(engine: Engine, prompt: list[int], n: int):
    """The decode rows of one profiled greedy decode, and its number of decode steps."""
    prof = Profiler()
    engine.observer = prof
    try:
        engine.generate(prompt, n, SamplingParams(), stop_ids=())
    finally:
        engine.observer = None
    df = prof.dataframe()
    dec = df[df["phase"] == "decode"]
    steps = dec["step"].nunique()
    if not steps:
        raise ValueError("the profiled decode ran no decode step (speed_tokens must be >= 2)")
    return dec, steps


def _op_ms_per_token(engine: Engine, prompt: list[int], n: int) -> dict[str, float]:
    """FFN block and attention op time (ms) per decode token in one profiled greedy decode."""
    dec, steps = _decode_ops(engine, prompt, n)
    return {k: 1e3 * float(dec[dec["op"].str.match(rx)]["host_s"].sum()) / steps
            for k, rx in (("ffn", FFN_OP), ("attn", ATTN_OP))}  # fmt: skip


def _decode_tok_s(
    engines: dict[str, Engine], prompt: list[int], cfg: EvalConfig, desc: str, progress: bool
) -> dict[str, float]:
    """Greedy decode tokens/s of each engine after a warm-up, alternating, median of ``cfg.repeats``."""
    greedy = SamplingParams()
    for (
        e
    ) in engines.values():  # warm-up: compile kernels, fill caches (e.g. the sparse kernel's transposed down)
        e.generate(prompt, 2, greedy, stop_ids=())
    runs: dict[str, list[float]] = {k: [] for k in engines}
    for _ in tqdm(range(cfg.repeats), desc=desc, unit="run", disable=not progress):
        for key, e in engines.items():
            runs[key].append(e.generate(prompt, cfg.speed_tokens, greedy, stop_ids=()).decode_tok_s)
    return {k: statistics.median(v) for k, v in runs.items()}


def measure_speed(
    ref: Engine, var: Engine, prompt: list[int], cfg: EvalConfig, progress: bool
) -> dict[str, float]:
    """Decode tokens/s of both (alternating, medians) and their FFN and attention op time per token;
    ratios variant/ref."""
    n = cfg.speed_tokens
    tok_s = _decode_tok_s({"ref": ref, "var": var}, prompt, cfg, "decode speed", progress)
    prof: dict[str, list[dict[str, float]]] = {"ref": [], "var": []}
    for _ in range(cfg.profile_repeats):  # alternating, like the timed runs
        for key, e in (("ref", ref), ("var", var)):
            prof[key].append(_op_ms_per_token(e, prompt, n))
    ffn = {k: statistics.median(r["ffn"] for r in v) for k, v in prof.items()}
    attn = {k: statistics.median(r["attn"] for r in v) for k, v in prof.items()}
    return {
        "decode_tok_s": tok_s["var"],
        "decode_tok_s_ref": tok_s["ref"],
        "decode_ratio": tok_s["var"] / tok_s["ref"],
        "ffn_ms_per_token": ffn["var"],
        "ffn_ms_per_token_ref": ffn["ref"],
        "ffn_speedup": ffn["ref"] / ffn["var"],
        "attn_ms_per_token": attn["var"],
        "attn_ms_per_token_ref": attn["ref"],
        "attn_speedup": attn["ref"] / attn["var"] if attn["var"] else float("nan"),
        "prompt_tokens": len(prompt),
        "gen_tokens": n,
        "repeats": cfg.repeats,
        "profile_repeats": cfg.profile_repeats,
    }


def measure_nm_speed(
    twin: Engine, var: Engine, prompt: list[int], cfg: EvalConfig, progress: bool
) -> dict[str, float]:
    """The N:M kernels against the same pruned weights stored dense in the same value format (``twin``,
    :func:`workbench.sparsity.nm.dense_twin`): decode tokens/s alternating (medians), and the time per
    token of the ops that multiply N:M weights (profiled, alternating, medians)."""
    n = cfg.speed_tokens
    tok_s = _decode_tok_s({"twin": twin, "var": var}, prompt, cfg, "N:M vs dense speed", progress)
    op_ms: dict[str, list[float]] = {"twin": [], "var": []}
    for _ in range(cfg.profile_repeats):
        dec, steps = _decode_ops(var, prompt, n)
        names = set(dec[dec["weights"].str.contains("-nm")]["op"])
        op_ms["var"].append(1e3 * float(dec[dec["op"].isin(names)]["host_s"].sum()) / steps)
        dec, steps = _decode_ops(twin, prompt, n)
        op_ms["twin"].append(1e3 * float(dec[dec["op"].isin(names)]["host_s"].sum()) / steps)
    ms = {k: statistics.median(v) for k, v in op_ms.items()}
    return {
        "nm_decode_tok_s": tok_s["var"],
        "nm_dense_twin_decode_tok_s": tok_s["twin"],
        "nm_decode_ratio": tok_s["var"] / tok_s["twin"],
        "nm_ops_ms_per_token": ms["var"],
        "nm_dense_twin_ops_ms_per_token": ms["twin"],
        "nm_ops_speedup": ms["twin"] / ms["var"] if ms["var"] else float("nan"),
        "nm_ops": len(names),
    }


def _matmul_bytes(model: Model) -> int:
    return sum(
        t.nbytes for name, t in model.weights.items() if getattr(t, "rows", 0) > 1 and "norm" not in name
    )


def evaluate(cfg: EvalConfig, model: Model | None = None, progress: bool = True) -> dict[str, Any]:
    """Accuracy (and speed) of ``cfg.quant`` / ``cfg.sparsity`` against the unmodified model."""
    from ..models.registry import load

    base = model if model is not None else load(cfg.model)
    variant = build_variant(base, cfg.quant, cfg.sparsity, progress)
    text, text_label = load_text(cfg.text)
    tok = base.tokenizer
    ids = eval_tokens(tok, text, cfg.tokens)
    bos = [tok.bos_id] if tok.add_bos else []
    ref = _engine(base, cfg.ref_backend or cfg.backend, cfg)
    var = _engine(variant, cfg.backend, cfg)
    try:
        accuracy = score_text(ref, var, ids, bos, cfg, progress).summary()
        if cfg.prompts and cfg.continuation:
            prompts = prompts_from_text(text, cfg.prompts)
            accuracy.update(greedy_agreement(_continuations(ref, prompts, cfg.continuation),
                                             _continuations(var, prompts, cfg.continuation)))  # fmt: skip
        speed_ids = ids if cfg.speed_prompt <= len(ids) else eval_tokens(tok, text, cfg.speed_prompt)
        prompt = bos + speed_ids[: cfg.speed_prompt]
        speed = measure_speed(ref, var, prompt, cfg, progress) if cfg.speed_tokens > 1 else {}
        if speed and nm_weight_count(variant):
            twin = _engine(dense_twin(variant), cfg.backend, cfg)
            try:
                speed.update(measure_nm_speed(twin, var, prompt, cfg, progress))
            finally:
                twin.close()
        if cfg.ffn_layer_repeats:
            speed.update(ffn_layer_times(ref, var, base.config.n_layers // 2, cfg.ffn_layer_repeats))
        device, ref_device = var.backend.device.label(), ref.backend.device.label()
    finally:
        ref.close()
        var.close()
    return {
        "model": base.source,
        "synthetic": base.kind == "synthetic",
        "quant": cfg.quant,
        "sparsity": cfg.sparsity,
        "backend": cfg.backend,
        "device": device,
        "reference": {"model": "the unmodified model (native weights, dense)", "device": ref_device},
        "text": text_label,
        "variant": variant.notes,
        "weight_bytes": _matmul_bytes(variant),
        "weight_bytes_ref": _matmul_bytes(base),
        "accuracy": accuracy,
        "speed": speed,
        "how": f"measured on {device} (reference on {ref_device})"
        + ("" if speed else "; speed not measured"),
        "config": asdict(cfg),
    }
