"""The OpenAI wire format: request bodies checked into :class:`Job` settings, and response objects built.

Only what this server implements is accepted (``n`` = 1, no logprobs, no tools); anything else is a
:class:`ApiError` naming the field, which the app returns as OpenAI's ``{"error": {...}}`` body.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ..runtime.sampling import SamplingParams

MAX_STOP_STRINGS = 4
# OpenAI fields this server does not implement, and the values that ask for nothing (accepted)
NO_OP_VALUES: dict[str, tuple[Any, ...]] = {"logprobs": (False,), "top_logprobs": (0,), "tools": ([],),
                                            "functions": ([],), "suffix": ("",), "logit_bias": ({},),
                                            "echo": (False,)}  # fmt: skip


class ApiError(Exception):
    """An error answer: HTTP ``status`` and OpenAI's error object."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None, headers: dict[str, str] | None = None):  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class Job:
    """A checked request: what to generate and how to answer."""

    kind: str  # "completion" | "chat"
    model: str
    prompt_text: str | None
    prompt_ids: list[int] | None
    max_tokens: int | None
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    stop: list[str]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; Python's extensions NaN and Infinity are refused (not JSON)."""
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _number(body: dict, name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ApiError(400, f"{name} must be a number, got {v!r}", name)
    if v < lo or v > hi or (lo_open and v == lo):
        side = "(" if lo_open else "["
        raise ApiError(400, f"{name} must be in {side}{lo}, {hi}], got {v}", name)
    return float(v)


def _int(body: dict, name: str, lo: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(400, f"{name} must be an integer, got {v!r}", name)
    if v < lo:
        raise ApiError(400, f"{name} must be >= {lo}, got {v}", name)
    return v


def _flag(body: dict, name: str) -> bool:
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ApiError(400, f"{name} must be true or false, got {v!r}", name)
    return v


def _unsupported(body: dict) -> None:
    """OpenAI fields this server does not implement: refused unless absent or set to their no-op value,
    so that a client never silently gets something other than what it asked for."""
    for name, no_op in NO_OP_VALUES.items():
        v = body.get(name)
        if v is not None and not any(type(v) is type(n) and v == n for n in no_op):
            raise ApiError(400, f"{name} is not supported by this server", name)
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, 0.0, -2.0, 2.0) != 0.0:
            raise ApiError(400, f"{name} is not supported by this server (use repetition_penalty)", name)
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError(400, f"user must be a string, got {user!r}", "user")


def _common(body: dict, kind: str) -> dict[str, Any]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model is required (a string; see GET /v1/models)", "model")
    for name in ("n", "best_of"):
        if _int(body, name, 1) not in (None, 1):
            raise ApiError(400, f"only {name}=1 is supported", name)
    _unsupported(body)
    max_tokens = _int(body, "max_completion_tokens", 1) if kind == "chat" else None
    max_tokens = max_tokens or _int(body, "max_tokens", 1)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ApiError(400, f"seed must be an integer, got {seed!r}", "seed")
    try:
        sampling = SamplingParams(
            temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
            top_k=int(_int(body, "top_k", 0) or 0),
            min_p=_number(body, "min_p", 0.0, 0.0, 0.999),
            repetition_penalty=_number(body, "repetition_penalty", 1.0, 0.01, 10.0),
            seed=seed,
        )
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, "stop must be a non-empty string or a list of them", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise ApiError(400, f"at most {MAX_STOP_STRINGS} stop strings", "stop")
    stream = _flag(body, "stream")
    opts = body.get("stream_options")
    opts = {} if opts is None else opts
    if not isinstance(opts, dict):
        raise ApiError(400, f"stream_options must be an object, got {opts!r}", "stream_options")
    try:
        include_usage = _flag(opts, "include_usage")
    except ApiError as e:
        raise ApiError(400, f"stream_options.{e.message}", "stream_options") from None
    return {"model": model, "max_tokens": max_tokens, "sampling": sampling, "stream": stream,
            "include_usage": include_usage, "stop": stops}  # fmt: skip


def parse_completion(body: dict[str, Any]) -> Job:
    """``/v1/completions``: ``prompt`` is a string, a one-element list of strings, or a list of token ids."""
    common = _common(body, "completion")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError(400, "prompt is empty", "prompt")
        return Job("completion", prompt_text=prompt, prompt_ids=None, **common)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return Job("completion", prompt_text=None, prompt_ids=[int(t) for t in prompt], **common)
    raise ApiError(400, "prompt must be a non-empty string or a list of token ids (one prompt per request)",
                   "prompt")  # fmt: skip


def _content(m: dict, i: int) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for p in c:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise ApiError(400, f"messages[{i}].content: only text parts are supported", "messages")
            parts.append(p["text"])
        return "".join(parts)
    raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts", "messages")


def parse_chat(body: dict[str, Any]) -> tuple[Job, list[dict[str, str]]]:
    """``/v1/chat/completions``: the job and the messages (roles system, user, assistant)."""
    common = _common(body, "chat")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
            raise ApiError(400, f"messages[{i}] needs a role of system, user or assistant", "messages")
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": _content(m, i)})
    return Job("chat", prompt_text=None, prompt_ids=None, **common), out


# -- responses ---------------------------------------------------------------------------------------------
def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip


def full_response(job: Job, rid: str, text: str, finish: str, n_prompt: int, n_out: int) -> dict[str, Any]:
    created = int(time.time())
    if job.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                  "logprobs": None}  # fmt: skip
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": job.model, "choices": [choice],
            "usage": usage(n_prompt, n_out)}  # fmt: skip


def chunk(job: Job, rid: str, text: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
    """One streamed chunk: a piece of text, or (``finish`` set) the last one."""
    created = int(time.time())
    if job.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        if text:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": job.model, "choices": [choice]}


def usage_chunk(job: Job, rid: str, n_prompt: int, n_out: int) -> dict[str, Any]:
    obj = "chat.completion.chunk" if job.kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": job.model, "choices": [],
            "usage": usage(n_prompt, n_out)}  # fmt: skip


def sse(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
