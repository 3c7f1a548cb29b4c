"""Load test of a running server with the official ``openai`` client: concurrent streaming clients for a
while; counts errors, checks every stream against the same request run alone, samples the server's RSS.
With ``kill_every_s`` one client is killed mid-stream that often (its connection reset, see
:mod:`workbench.serve.killed_client`) and replaced; the other streams must not notice.

``python -m workbench.serve.loadtest --url http://127.0.0.1:8006/v1 --clients 32 --seconds 120 [--kill-every 3]``
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import httpx

from .killed_client import stream_then_reset

DEFAULT_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "The largest planet in the solar system",
    "1, 2, 3, 4, 5,",
    "Water boils at",
)


def _client(base_url: str, api_key: str | None, timeout_s: float):
    try:
        import openai
    except ImportError:
        raise RuntimeError("the load test needs the openai client: pip install -e '.[dev]'") from None
    return openai.OpenAI(base_url=base_url, api_key=api_key or "none", timeout=timeout_s, max_retries=0)


def stream_text(client, model: str, prompt: str, max_tokens: int) -> tuple[str, str | None]:
    """One streamed greedy completion: its text and finish reason."""
    parts, finish = [], None
    for chunk in client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True
    ):
        if chunk.choices:
            parts.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
    return "".join(parts), finish


def server_rss_bytes(base_url: str) -> int:
    """The server's resident set size from its /metrics (0 if not reported)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    text = httpx.get(f"{root}/metrics", timeout=10).text
    m = re.search(r"^workbench_process_resident_memory_bytes (\S+)$", text, re.M)
    return int(float(m.group(1))) if m else 0


def run_load(
    base_url: str,
    model: str,
    *,
    clients: int = 32,
    seconds: float = 120.0,
    max_tokens: int = 32,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    api_key: str | None = None,
    rss_every_s: float = 5.0,
    timeout_s: float = 600.0,
    kill_every_s: float | None = None,
    kill_max_tokens: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """``clients`` threads stream completions of ``prompts`` (each client cycles through them) until
    ``seconds`` have passed; the reference text of each prompt is first fetched alone (one request at a time).

    With ``kill_every_s``, every that many seconds the next client to start a request is killed instead: it
    streams a longer completion (``kill_max_tokens``, default 8 x ``max_tokens``, so that it is still
    generating when killed) and resets its connection after 2-4 events (``seed`` picks how many), then a new
    client takes its place. Errors and mismatches count the other clients' requests only."""
    if clients < 1 or seconds <= 0 or not prompts or (kill_every_s is not None and kill_every_s <= 0):
        raise ValueError("need clients >= 1, seconds > 0, kill_every_s > 0 and at least one prompt")
    ref_client = _client(base_url, api_key, timeout_s)
    alone = {p: stream_text(ref_client, model, p, max_tokens)[0] for p in dict.fromkeys(prompts)}
    lock = threading.Lock()
    done: Counter[str] = Counter()
    errors: list[str] = []
    mismatches: list[dict[str, str]] = []
    latencies: list[float] = []
    kill_failures: list[str] = []
    rng = random.Random(seed)
    kill_tokens = kill_max_tokens or 8 * max_tokens
    stop_at = time.perf_counter() + seconds
    next_kill = [time.perf_counter() + kill_every_s if kill_every_s else float("inf")]

    def kill_due() -> bool:
        with lock:
            if time.perf_counter() < next_kill[0]:
                return False
            next_kill[0] += kill_every_s
            return True

    def killed_client(prompt: str) -> None:
        with lock:
            events = rng.randint(2, 4)
        try:
            stream_then_reset(base_url, model, prompt, kill_tokens, events, api_key, timeout_s)
        except Exception as e:  # a kill that never reached the stream is reported, not silently skipped
            with lock:
                kill_failures.append(f"{type(e).__name__}: {e}")
            return
        with lock:
            done["killed"] += 1

    def client_loop(i: int) -> None:
        client = _client(base_url, api_key, timeout_s)
        j = 0
        while j == 0 or time.perf_counter() < stop_at:  # every client sends at least one request
            prompt = prompts[(i + j) % len(prompts)]
            j += 1
            if kill_due():
                killed_client(prompt)
                client = _client(base_url, api_key, timeout_s)  # the client that replaces the killed one
                continue
            t0 = time.perf_counter()
            try:
                text, _ = stream_text(client, model, prompt, max_tokens)
            except Exception as e:  # every failure is counted and reported, none is retried
                with lock:
                    errors.append(f"client {i}: {type(e).__name__}: {e}")
                continue
            with lock:
                latencies.append(time.perf_counter() - t0)
                done["requests"] += 1
                if text != alone[prompt]:
                    mismatches.append({"prompt": prompt, "got": text, "alone": alone[prompt]})

    rss = [(0.0, server_rss_bytes(base_url))]
    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(clients)]
    t_start = time.perf_counter()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(min(rss_every_s, 0.5))
        now = time.perf_counter() - t_start
        if now - rss[-1][0] >= rss_every_s:
            rss.append((now, server_rss_bytes(base_url)))
    wall = time.perf_counter() - t_start
    rss.append((wall, server_rss_bytes(base_url)))
    lat = sorted(latencies)
    return {
        "clients": clients,
        "seconds": seconds,
        "wall_s": wall,
        "max_tokens": max_tokens,
        "requests": done["requests"],
        "errors": len(errors),
        "error_samples": errors[:10],
        "mismatches": len(mismatches),
        "mismatch_samples": mismatches[:5],
        "killed": done["killed"],
        "kill_failures": len(kill_failures),
        "kill_failure_samples": kill_failures[:5],
        "requests_per_s": done["requests"] / wall,
        "latency_p50_s": lat[len(lat) // 2] if lat else None,
        "latency_max_s": lat[-1] if lat else None,
        "rss_bytes": rss,
        "rss_growth_bytes": rss[-1][1] - rss[0][1],
        "rss_growth_after_warmup_bytes": rss[-1][1] - next(b for t, b in rss if t >= wall / 4),
        "how": "measured (host wall clock; RSS from the server's /metrics)",
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.serve.loadtest", description=__doc__)
    p.add_argument("--url", default="http://127.0.0.1:8006/v1")
    p.add_argument("--model", default=None, help="model id (default: the server's first /v1/models entry)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--api-key", default=None)
    p.add_argument("--kill-every", type=float, default=None, metavar="SECONDS",
                   help="kill one client mid-stream this often (its connection reset), replaced by a new one")  # fmt: skip
    args = p.parse_args(argv)
    model = args.model or _client(args.url, args.api_key, 30).models.list().data[0].id
    res = run_load(args.url, model, clients=args.clients, seconds=args.seconds, max_tokens=args.max_tokens,
                   api_key=args.api_key, kill_every_s=args.kill_every)  # fmt: skip
    json.dump(res, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0 if res["errors"] == res["mismatches"] == res["kill_failures"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
