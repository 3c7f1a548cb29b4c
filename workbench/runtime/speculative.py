"""Speculative decoding (greedy): a cheap draft proposes k tokens, the model verifies them in one step.

The verification step feeds the last token and the k drafts as one multi-row step with logits for all k+1
rows; the drafts are accepted up to the first one that differs from the model's own argmax, which is taken
instead (or, when all k are accepted, the argmax after the last draft). The KV cache is then truncated to
the accepted tokens (the sliding rings have ``k`` slots of slack, so the rollback is exact). The output is
therefore the model's own greedy output, token for token, as long as the backend's multi-row logits equal
its single-row logits (the numpy backend: to float32 rounding; see the README for the cpu backend).

Draft sources (``propose(context, k) -> list[int]``):

* :class:`NgramDrafter`: prompt lookup: the tokens that followed the latest earlier occurrence of the
  context's last n-gram (free; strong on repetitive text, code, extraction).
* :class:`ModelDrafter`: a cheaper configuration of the same model decoding greedily from its own KV cache:
  its first layers only (:func:`layer_skip_model`) or its weights re-quantized (e.g. int4); see
  :func:`make_drafter`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from ..models.model import Model
from .engine import Engine


class Drafter(Protocol):
    name: str

    def propose(self, context: Sequence[int], k: int) -> list[int]: ...


class NgramDrafter:
    """Prompt-lookup drafting: match the last ``n`` tokens (``max_ngram`` down to ``min_ngram``) earlier in
    the context and propose the ``k`` tokens that followed the latest match (that has ``k`` after it)."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram ({min_ngram}) <= max_ngram ({max_ngram})")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.name = f"ngram:{min_ngram}-{max_ngram}"

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        ctx = np.asarray(context, dtype=np.int64)
        n_ctx = len(ctx)
        for n in range(min(self.max_ngram, n_ctx - 1), self.min_ngram - 1, -1):
            tail = ctx[n_ctx - n :]
            windows = np.lib.stride_tricks.sliding_window_view(ctx[: n_ctx - 1], n)
            hits = np.flatnonzero((windows == tail).all(axis=1))
            if len(hits):
                # the latest match with k tokens after it (a later one may have fewer), else the earliest
                full = hits[hits + n + k <= n_ctx]
                start = int(full[-1] if len(full) else hits[0]) + n
                return ctx[start : start + k].tolist()
        return []


class ModelDrafter:
    """Greedy drafts from a cheaper model that shares the vocabulary (a configuration of the same model).

    It keeps its own KV cache in step with the context it is asked about (common prefix kept, the rest
    truncated and fed again), so each call costs about k small decode steps.
    """

    def __init__(self, model: Model, name: str, backend: str = "numpy", **backend_options: Any):
        self.engine = Engine(model, backend, **backend_options)
        self.name = name
        self._seq = None

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        ctx = list(context)
        if k < 1:
            return []
        if self._seq is None or self._seq.cache.max_len < len(ctx) + k:
            self._seq = self.engine.new_sequence(min(self.engine.max_context, 2 * (len(ctx) + k) + 64))
        seq = self._seq
        same = 0
        for a, b in zip(seq.tokens, ctx, strict=False):
            if a != b:
                break
            same += 1
        same = min(same, len(ctx) - 1)  # feed at least the last token to get its logits
        seq.cache.truncate(same)
        del seq.tokens[same:]
        logits = self.engine.forward(seq, ctx[same:])
        out = [int(np.argmax(logits))]
        while len(out) < k and seq.cache.length + 1 <= seq.cache.max_len:
            out.append(int(np.argmax(self.engine.forward(seq, [out[-1]]))))
        return out


def layer_skip_model(model: Model, n_layers: int) -> Model:
    """The model's first ``n_layers`` layers, then its final norm and head (the same weights)."""
    if not 1 <= n_layers < model.config.n_layers:
        raise ValueError(f"draft layers must be in 1..{model.config.n_layers - 1}, got {n_layers}")
    c = model.config
    config = replace(c, n_layers=n_layers, layer_types=c.layer_types[:n_layers], name=f"{c.name}-draft")
    return Model(config, model.weights, model.tokenizer, model.source, model.kind)


def make_drafter(spec: str, model: Model, backend: str = "numpy", **backend_options: Any) -> Drafter:
    """A draft source from its spec: ``ngram`` or ``ngram:MIN-MAX`` (prompt lookup), ``layers:N`` (the first
    N layers of ``model``), ``quant:SPEC`` (``model`` re-quantized, e.g. ``quant:int4-g32``)."""
    kind, _, arg = spec.partition(":")
    if kind == "ngram":
        lo, _, hi = (arg or "1-3").partition("-")
        try:
            return NgramDrafter(int(hi or lo), int(lo))
        except ValueError:
            raise ValueError(f"bad n-gram range in draft spec {spec!r} (expected ngram:MIN-MAX)") from None
    if kind == "layers":
        if not arg.isdigit():
            raise ValueError(f"draft spec {spec!r}: expected layers:N")
        draft = layer_skip_model(model, int(arg))
        return ModelDrafter(draft, f"layers:{arg}/{model.config.n_layers}", backend, **backend_options)
    if kind == "quant":
        from ..quant.requant import requantize

        if not arg:
            raise ValueError(f"draft spec {spec!r}: expected quant:SPEC (e.g. quant:int4-g32)")
        return ModelDrafter(
            requantize(model, arg, progress=False), f"quant:{arg}", backend, **backend_options
        )
    raise ValueError(f"unknown draft source {spec!r} (ngram[:MIN-MAX], layers:N, quant:SPEC)")


@dataclass
class SpeculativeResult:
    """Output ids and how the speculation went (times measured, host wall clock)."""

    input_ids: list[int]
    output_ids: list[int]
    finish_reason: str
    drafter: str
    k: int
    prefill_s: float
    decode_s: float
    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    accepted_per_step: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def decode_tok_s(self) -> float:
        """Tokens after the first (which comes from prefill) per second of the decode phase."""
        n = len(self.output_ids) - 1
        return n / self.decode_s if self.decode_s > 0 and n > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "input_ids": self.input_ids,
            "output_ids": self.output_ids,
            "finish_reason": self.finish_reason,
            "drafter": self.drafter,
            "k": self.k,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "decode_tok_s": self.decode_tok_s,
            "verify_steps": self.verify_steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_step": (len(self.output_ids) - 1) / self.verify_steps if self.verify_steps else 0.0,
            "draft_s": self.draft_s,
            "timing": "measured (host wall clock)",
        }


def speculative_generate(
    engine: Engine,
    prompt: str | Sequence[int],
    max_tokens: int,
    drafter: Drafter,
    k: int = 4,
    *,
    stop_ids: Sequence[int] | None = None,
) -> SpeculativeResult:
    """Greedy generation of up to ``max_tokens`` tokens with ``k`` drafted tokens verified per step."""
    if k < 1:
        raise ValueError(f"k (draft tokens per step) must be >= 1, got {k}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    ids = engine.encode_prompt(prompt)
    if not ids:
        raise ValueError("the prompt is empty (no tokens)")
    need = len(ids) + max_tokens + k
    if need > engine.max_context:
        raise ValueError(
            f"prompt of {len(ids)} tokens + max_tokens {max_tokens} + k {k} exceeds the context limit of "
            f"{engine.max_context} tokens"
        )
    stops = set(engine.tokenizer.stop_ids if stop_ids is None else stop_ids)
    seq = engine.new_sequence(need, slack=k)
    t0 = time.perf_counter()
    out = [int(np.argmax(engine.forward(seq, ids)))]
    res = SpeculativeResult(ids, out, "length", drafter.name, k, time.perf_counter() - t0, 0.0)
    t1 = time.perf_counter()
    while len(out) < max_tokens and out[-1] not in stops:
        td = time.perf_counter()
        drafts = [int(t) for t in drafter.propose(ids + out, min(k, max_tokens - len(out)))][:k]
        res.draft_s += time.perf_counter() - td
        base = seq.cache.length
        rows = engine.forward(seq, [out[-1], *drafts], logits="all" if drafts else "last")
        preds = np.argmax(rows.reshape(len(drafts) + 1, -1), axis=-1)
        n_ok = 0
        while n_ok < len(drafts) and preds[n_ok] == drafts[n_ok]:
            n_ok += 1
        seq.cache.truncate(base + 1 + n_ok)
        del seq.tokens[base + 1 + n_ok :]
        res.verify_steps += 1
        res.drafted += len(drafts)
        res.accepted += n_ok
        res.accepted_per_step.append(n_ok)
        for t in [*drafts[:n_ok], int(preds[n_ok])]:
            out.append(t)
            if t in stops or len(out) >= max_tokens:
                break
    res.decode_s = time.perf_counter() - t1
    if out[-1] in stops:
        res.finish_reason = "stop"
    return res
