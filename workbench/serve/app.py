"""The OpenAI-compatible HTTP server: FastAPI routes over a continuous-batching :class:`Scheduler`.

The scheduler steps in its own thread; each request's tokens reach its handler through an asyncio queue.
A client that disconnects (mid-stream or while waiting for a full answer) cancels its request, and its
sequence is freed before the next step. Errors use OpenAI's ``{"error": {...}}`` body, unexpected ones
included (500). ``/health`` says ``ok``, ``degraded`` (requests failed by errors lately; still serving) or
``down`` (the scheduler thread is gone: 503, and so are new requests).
"""

from __future__ import annotations

import asyncio
import hmac
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from ..runtime.scheduler import QueueFullError, Request, Scheduler
from . import protocol as P
from .metrics import render
from .stops import StopText

DEFAULT_CHAT_MAX_TOKENS = 1024  # chat requests without max_tokens stop here (or at the context limit)
DEFAULT_COMPLETION_MAX_TOKENS = 16  # as OpenAI's /v1/completions
DISCONNECT_POLL_S = 0.5


class Server:
    """What the routes share: the scheduler and its thread, the served model id, the API key, counters."""

    def __init__(self, scheduler: Scheduler, model_id: str, api_key: str | None, max_body_bytes: int):
        self.scheduler, self.model_id, self.api_key = scheduler, model_id, api_key
        self.max_body_bytes = max_body_bytes
        self.engine = scheduler.engine
        self.tokenizer = scheduler.engine.tokenizer
        self.responses: Counter[tuple[str, int]] = Counter()
        self.started = int(time.time())
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.scheduler.serve_forever, name="scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.scheduler.stop()
        if self._thread is not None:
            self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        """Whether the scheduler thread runs (requests would wait forever without it)."""
        return self._thread is not None and self._thread.is_alive()

    def health(self) -> tuple[int, dict[str, Any]]:
        """HTTP status and body of ``/health``: ok, degraded (recent request errors), down (no scheduler)."""
        h = self.scheduler.health()
        status = "down" if not self.alive else "degraded" if h["errors_recent"] else "ok"
        dev = self.engine.backend.device
        body = {"status": status, "model": self.model_id, "backend": self.engine.backend.name,
                "device": dev.label(), **self.scheduler.snapshot(), **h}  # fmt: skip
        return (503 if status == "down" else 200), body

    # -- request handling ----------------------------------------------------------------------------
    def check_auth(self, request: HttpRequest) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        token = given[7:] if given.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(token.encode(), self.api_key.encode()):
            raise P.ApiError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')",
                             kind="authentication_error", code="invalid_api_key")  # fmt: skip

    async def body(self, request: HttpRequest) -> dict[str, Any]:
        self.check_auth(request)
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > self.max_body_bytes:
            raise P.ApiError(413, f"request body of {size} bytes exceeds the limit of {self.max_body_bytes}")
        raw = b""
        async for part in request.stream():
            raw += part
            if len(raw) > self.max_body_bytes:
                raise P.ApiError(413, f"request body exceeds the limit of {self.max_body_bytes} bytes")
        return P.parse_json(raw)

    def check_model(self, job: P.Job) -> None:
        if job.model != self.model_id:
            raise P.ApiError(404, f"model {job.model!r} not found; this server serves {self.model_id!r}",
                             "model", code="model_not_found")  # fmt: skip

    def prompt_ids(self, job: P.Job, messages: list[dict[str, str]] | None) -> list[int]:
        if job.prompt_ids is not None:
            return job.prompt_ids
        text = self.tokenizer.chat_prompt(messages) if messages is not None else job.prompt_text
        return self.tokenizer.encode(text)

    async def generate(self, request: HttpRequest, job: P.Job, ids: list[int]):
        room = self.engine.max_context - len(ids)
        if job.max_tokens is None:
            default = DEFAULT_CHAT_MAX_TOKENS if job.kind == "chat" else DEFAULT_COMPLETION_MAX_TOKENS
            job.max_tokens = max(1, min(default, room))
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int | None, str]] = asyncio.Queue()

        def on_update(req: Request, token: int | None, text: str) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (token, text))

        req = Request(ids, job.max_tokens, job.sampling, self.tokenizer.stop_ids, on_update)
        if not self.alive:
            raise P.ApiError(503, "the scheduler is not running; see /health", kind="server_error")
        try:
            self.scheduler.submit(req)
        except QueueFullError as e:
            retry = f"{max(1, round(e.retry_after_s))}"
            raise P.ApiError(429, f"server busy: {e}; retry after {retry} s", kind="rate_limit_error",
                             code=e.code, headers={"Retry-After": retry}) from None  # fmt: skip
        except ValueError as e:
            raise P.ApiError(400, str(e), "max_tokens" if "max_tokens" in str(e) else "prompt") from None
        rid = P.new_id(job.kind)
        if job.stream:
            return StreamingResponse(self._stream(job, rid, req, queue), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip
        return await self._collect(request, job, rid, req, queue)

    async def _events(self, req: Request, queue: asyncio.Queue, stops: StopText) -> AsyncIterator[str]:
        """The request's new text as it comes; cancels the request when a stop string is hit."""
        while True:
            token, text = await queue.get()
            if token is None:
                rest = stops.flush()
                if rest:
                    yield rest
                return
            out = stops.push(text)
            if out:
                yield out
            if stops.stopped:
                self.scheduler.cancel(req)
                return

    def _finish_reason(self, req: Request, stops: StopText) -> str:
        if stops.stopped or req.finish_reason == "stop":
            return "stop"
        return str(req.finish_reason)

    async def _stream(self, job: P.Job, rid: str, req: Request, queue: asyncio.Queue) -> AsyncIterator[bytes]:
        stops = StopText(job.stop)
        try:
            yield P.sse(P.chunk(job, rid, None, None, first=True))
            async for text in self._events(req, queue, stops):
                yield P.sse(P.chunk(job, rid, text, None))
            if req.finish_reason == "error":
                yield P.sse(
                    {"error": {"message": req.error, "type": "server_error", "param": None, "code": None}}
                )
            else:
                yield P.sse(P.chunk(job, rid, None, self._finish_reason(req, stops)))
                if job.include_usage:
                    yield P.sse(P.usage_chunk(job, rid, len(req.prompt_ids), len(req.output_ids)))
            yield P.sse("[DONE]")
        finally:  # the client went away (or we are done): free the sequence
            if not req.done:
                self.scheduler.cancel(req)

    async def _collect(self, request: HttpRequest, job: P.Job, rid: str, req: Request, queue: asyncio.Queue):
        stops = StopText(job.stop)
        parts: list[str] = []
        events = self._events(req, queue, stops)
        try:
            while True:
                nxt = asyncio.ensure_future(events.__anext__())
                while not nxt.done():
                    await asyncio.wait({nxt}, timeout=DISCONNECT_POLL_S)
                    if not nxt.done() and await request.is_disconnected():
                        nxt.cancel()
                        self.scheduler.cancel(req)
                        return JSONResponse({"error": "client disconnected"}, status_code=499)
                try:
                    parts.append(nxt.result())
                except StopAsyncIteration:
                    break
        finally:
            if not req.done:
                self.scheduler.cancel(req)
        if req.finish_reason == "error":
            raise P.ApiError(500, f"generation failed: {req.error}", kind="server_error")
        body = P.full_response(job, rid, "".join(parts), self._finish_reason(req, stops), len(req.prompt_ids),
                               len(req.output_ids))  # fmt: skip
        return JSONResponse(body)


def create_app(
    scheduler: Scheduler, model_id: str, *, api_key: str | None = None, max_body_bytes: int = 4 << 20
) -> FastAPI:
    """The app; the scheduler thread starts and stops with it (FastAPI lifespan)."""
    server = Server(scheduler, model_id, api_key, max_body_bytes)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.start()
        yield
        server.stop()

    app = FastAPI(title="workbench", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = server

    @app.exception_handler(P.ApiError)
    async def api_error(request: HttpRequest, e: P.ApiError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(Exception)
    async def internal_error(request: HttpRequest, e: Exception):  # the server logs it (re-raised)
        err = P.ApiError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error")
        return JSONResponse(err.body(), status_code=500)

    @app.middleware("http")
    async def count(request: HttpRequest, call_next):
        response = await call_next(request)
        server.responses[(request.url.path, response.status_code)] += 1
        return response

    @app.get("/health")
    async def health():
        status, body = server.health()
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def metrics():
        text = render(server.scheduler, server.responses, server.engine.backend.device.label())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(request: HttpRequest):
        server.check_auth(request)
        card = {"id": model_id, "object": "model", "created": server.started, "owned_by": "workbench"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(request: HttpRequest):
        job = P.parse_completion(await server.body(request))
        server.check_model(job)
        ids = server.prompt_ids(job, None)
        return await server.generate(request, job, ids)

    @app.post("/v1/chat/completions")
    async def chat(request: HttpRequest):
        job, messages = P.parse_chat(await server.body(request))
        server.check_model(job)
        return await server.generate(request, job, server.prompt_ids(job, messages))

    return app
