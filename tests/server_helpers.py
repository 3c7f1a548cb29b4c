"""Helpers of the server tests: a server on a free loopback port in a thread, an openai client for it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import openai
import uvicorn

from workbench.runtime.engine import Engine
from workbench.runtime.scheduler import Scheduler
from workbench.serve import create_app

MODEL_ID = "tiny-test"


@contextmanager
def running(engine: Engine, api_key: str | None = None, **sched) -> Iterator[tuple[str, Scheduler]]:
    """A server over ``Scheduler(engine, **sched)`` in a thread; yields (base_url, scheduler)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    scheduler = Scheduler(engine, **sched)
    config = uvicorn.Config(create_app(scheduler, MODEL_ID, api_key=api_key), log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    assert server.started, "server did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", scheduler
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def wait_idle(sched: Scheduler, timeout: float = 10.0) -> bool:
    deadline = time.time() + timeout
    while sched.has_work() and time.time() < deadline:
        time.sleep(0.02)
    return not sched.has_work()
