"""A client killed mid-stream, for fault tests of a running server: a streaming completion over a raw socket,
cut after a few events with a TCP reset (``SO_LINGER`` 0), as the socket of a killed process is cut.

The server must notice, cancel that request and free its sequence, while every other stream goes on as if
nothing happened (see :func:`workbench.serve.loadtest.run_load`, ``kill_every_s``).
"""

from __future__ import annotations

import json
import socket
import struct
from urllib.parse import urlsplit


class KillFailed(RuntimeError):
    """The request never streamed (an error status, or the stream ended before the kill)."""


def stream_then_reset(
    base_url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    events: int,
    api_key: str | None = None,
    timeout_s: float = 60.0,
) -> int:
    """Start a streamed greedy completion at ``base_url`` (``http://host:port/v1``), read ``events`` SSE
    events, then reset the connection; returns the events read (raises :class:`KillFailed` otherwise)."""
    url = urlsplit(base_url)
    body = json.dumps(
        {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    ).encode()
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    head = (
        f"POST {url.path.rstrip('/')}/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{auth}\r\n"
    )
    sock = socket.create_connection((url.hostname, url.port or 80), timeout=timeout_s)
    try:
        sock.sendall(head.encode() + body)
        data = b""
        while data.count(b"data: ") < events:
            part = sock.recv(65536)
            if not part:
                raise KillFailed(f"the server ended the response first: {data[:200]!r}")
            data += part
            status, crlf, _ = data.partition(b"\r\n")
            if crlf and not status.startswith(b"HTTP/1.1 200"):
                raise KillFailed(f"no stream: {status.decode(errors='replace')}")
            if b"[DONE]" in data:
                raise KillFailed("the stream ended before the kill")
        return data.count(b"data: ")
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
