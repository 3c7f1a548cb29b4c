"""The engine: prefill and decode with a KV cache on one backend, sampling, streaming and timing."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends import Backend, Step, make_backend
from ..backends.base import OpObserver
from ..models.model import Model
from .kv_cache import ContextLimitError
from .sampling import SamplingParams, make_sampler


@dataclass
class GenerationResult:
    """One generation: ids, text, why it stopped, and how fast each phase ran (measured, host wall time)."""

    input_ids: list[int]
    output_ids: list[int]
    text: str
    finish_reason: str
    backend: str
    device: str
    prefill_s: float
    decode_s: float
    first_token_s: float
    token_latencies_s: list[float] = field(default_factory=list)
    top_logits: dict[str, list] | None = None

    @property
    def prefill_tok_s(self) -> float:
        return len(self.input_ids) / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        """Tokens per second of the decode steps (the first token comes from prefill and is not counted)."""
        n = len(self.token_latencies_s)
        return n / self.decode_s if self.decode_s > 0 and n else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = {
            "input_ids": self.input_ids,
            "output_ids": self.output_ids,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "backend": self.backend,
            "device": self.device,
            "prefill_tokens": len(self.input_ids),
            "decode_tokens": len(self.token_latencies_s),
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "time_to_first_token_s": self.first_token_s,
            "prefill_tok_s": self.prefill_tok_s,
            "decode_tok_s": self.decode_tok_s,
            "timing": "measured (host wall clock)",
        }
        if self.top_logits is not None:
            d["top_logits"] = self.top_logits
        return d


@dataclass
class SequenceState:
    """A sequence being generated: its KV cache and its tokens so far."""

    cache: Any
    tokens: list[int] = field(default_factory=list)


class Engine:
    """Runs a model on a backend. ``backend`` is a name (``numpy``, ``cpu``, ``vulkan``, ``npu``, ``auto``)."""

    def __init__(
        self,
        model: Model,
        backend: str | Backend = "numpy",
        *,
        max_context: int | None = None,
        prefill_chunk: int = 512,
        observer: OpObserver | None = None,
        **backend_options: Any,
    ):
        self.model = model
        self.backend = (
            backend if isinstance(backend, Backend) else make_backend(backend, model, **backend_options)
        )
        self.max_context = min(max_context or model.config.context_length, model.config.context_length)
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.prefill_chunk = prefill_chunk
        self.observer = observer
        self._step_index = 0

    @property
    def tokenizer(self):
        return self.model.tokenizer

    def new_sequence(self, max_len: int | None = None, slack: int = 0) -> SequenceState:
        return SequenceState(
            self.backend.new_cache(min(max_len or self.max_context, self.max_context), slack)
        )

    # -- forward ---------------------------------------------------------------------------------
    def forward(
        self,
        seq: SequenceState,
        tokens: Sequence[int],
        logits: str | Sequence[int] = "last",
        phase: str | None = None,
    ) -> np.ndarray:
        """Run ``tokens`` through the model after what ``seq`` holds.

        ``logits``: ``"last"`` returns the last token's logits (vocab,); ``"all"`` every token's (T, vocab);
        indices into ``tokens`` return those rows in increasing order (k, vocab). Long inputs run in chunks of
        ``prefill_chunk`` tokens.
        """
        tokens = list(tokens)
        if not tokens:
            raise ValueError("forward needs at least one token")
        seq.cache.check_room(len(tokens))
        n, c = len(tokens), self.prefill_chunk
        if isinstance(logits, str):
            wanted = np.arange(n) if logits == "all" else np.array([n - 1])
        else:
            wanted = np.unique(np.asarray(logits, dtype=np.int64).reshape(-1))
            if len(wanted) == 0 or wanted.min() < 0 or wanted.max() >= n:
                raise ValueError(f"logit rows must be indices in 0..{n - 1}")
        phase = phase or ("decode" if n == 1 else "prefill")
        outs = []
        for start in range(0, n, c):
            chunk = tokens[start : start + c]
            local = wanted[(wanted >= start) & (wanted < start + len(chunk))] - start
            # a chunk with no wanted row still computes its last row's logits (a graph needs one output row)
            out = self._run(seq, chunk, local if len(local) else "last", phase)
            if len(local):
                outs.append(out)
        rows = np.concatenate(outs)
        return rows[-1] if logits == "last" else rows

    def _run(self, seq: SequenceState, chunk: list[int], logits: str | np.ndarray, phase: str) -> np.ndarray:
        out = self.run_step(Step.single(seq.cache, chunk, seq.cache.length, logits, phase))
        seq.tokens.extend(chunk)
        return out

    def run_step(self, step: Step, greedy: bool | str = False) -> Any:
        """Run one step (one or several sequences, see :mod:`workbench.runtime.batch`); its logit rows, or with
        ``greedy`` the argmax token of the last row, with ``greedy="rows"`` the argmax of every row (both
        sampled on the device where the backend can)."""
        step.index = self._step_index
        graph = self.backend.prepare_graph(self.model.graph(step.n_tokens, len(step.logit_rows)))
        b = self.backend
        run = b.run_argmax if greedy == "rows" else b.run_greedy if greedy else b.run
        if self.observer is None:
            out = run(graph, step)
        else:
            t0 = time.perf_counter()
            out = run(graph, step, self.observer)
            self.observer.on_step(step, graph, self.backend, t0, time.perf_counter() - t0)
        self._step_index += 1
        return out

    def greedy_step(self, seq: SequenceState, token: int) -> int:
        """Run one decode token and return the argmax of its logits (sampled on the device where the backend
        can, so only the token id comes back)."""
        seq.cache.check_room(1)
        nxt = self.run_step(Step.single(seq.cache, [token], seq.cache.length, "last", "decode"), greedy=True)
        seq.tokens.append(token)
        return int(nxt)

    # -- generation ------------------------------------------------------------------------------
    def encode_prompt(self, prompt: str | Sequence[int], chat: bool = False) -> list[int]:
        if isinstance(prompt, str):
            text = self.tokenizer.chat_prompt(prompt) if chat else prompt
            return self.tokenizer.encode(text)
        return [int(t) for t in prompt]

    def stream(
        self,
        prompt: str | Sequence[int],
        max_tokens: int = 64,
        sampling: SamplingParams | None = None,
        *,
        chat: bool = False,
        stop_ids: Sequence[int] | None = None,
        top_logits: int = 0,
        result: list[GenerationResult] | None = None,
    ) -> Iterator[tuple[int, str]]:
        """Yield ``(token id, new text)`` as tokens are generated; the final result is appended to ``result``."""
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        sampling = sampling or SamplingParams()
        ids = self.encode_prompt(prompt, chat)
        if not ids:
            raise ValueError("the prompt is empty (no tokens); give some text or enable BOS")
        if len(ids) >= self.max_context:
            raise ContextLimitError(
                f"prompt of {len(ids)} tokens does not fit the context limit of {self.max_context} tokens"
            )
        stops = set(self.tokenizer.stop_ids if stop_ids is None else stop_ids)
        sample = make_sampler(sampling)
        seq = self.new_sequence()
        decoder = self.tokenizer.stream()
        t0 = time.perf_counter()
        logits = self.forward(seq, ids)
        prefill_s = time.perf_counter() - t0
        top = None
        if top_logits:
            order = np.argsort(-logits, kind="stable")[:top_logits]
            top = {"ids": order.tolist(), "logits": logits[order].astype(float).tolist()}
        out: list[int] = []
        latencies: list[float] = []
        finish = "length"
        first_token_s = 0.0
        decode_s = 0.0
        device_greedy = sampling.greedy and sampling.repetition_penalty == 1.0
        next_tok: int | None = None
        while len(out) < max_tokens:
            tok = sample(logits, ids + out) if next_tok is None else next_tok
            if not out:
                first_token_s = time.perf_counter() - t0
            out.append(tok)
            if tok in stops:
                finish = "stop"
                break
            text = decoder.push(tok)
            if text:
                yield tok, text
            if len(out) >= max_tokens:
                break
            if seq.cache.length + 1 > seq.cache.max_len:
                finish = "context"
                break
            ts = time.perf_counter()
            if device_greedy:
                next_tok = self.greedy_step(seq, tok)
            else:
                logits = self.forward(seq, [tok], phase="decode")
            dt = time.perf_counter() - ts
            latencies.append(dt)
            decode_s += dt
        tail = decoder.flush()
        if tail:
            yield -1, tail
        if result is not None:
            dev = self.backend.device
            text = self.tokenizer.decode([t for t in out if t not in stops])
            result.append(
                GenerationResult(
                    ids,
                    out,
                    text,
                    finish,
                    self.backend.name,
                    dev.label(),
                    prefill_s,
                    decode_s,
                    first_token_s,
                    latencies,
                    top,
                )
            )

    def generate(
        self,
        prompt: str | Sequence[int],
        max_tokens: int = 64,
        sampling: SamplingParams | None = None,
        *,
        chat: bool = False,
        on_text: Callable[[str], None] | None = None,
        stop_ids: Sequence[int] | None = None,
        top_logits: int = 0,
    ) -> GenerationResult:
        """Generate up to ``max_tokens`` tokens after ``prompt`` (text or ids); ``on_text`` receives text as it streams."""
        result: list[GenerationResult] = []
        for _, text in self.stream(
            prompt, max_tokens, sampling, chat=chat, stop_ids=stop_ids, top_logits=top_logits, result=result
        ):
            if on_text is not None:
                on_text(text)
        return result[0]

    def close(self) -> None:
        self.backend.close()
