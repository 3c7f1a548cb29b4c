"""llama.cpp (llama-cpp-python) as the comparison: a child process that times prefill and greedy decode.

Running it in a child process keeps its threads and memory apart from ours while runs alternate in the
same process tree; the child reports its timings and its own peak RSS.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from .. import blas_env
from .timing import RunTiming

WORKER = Path(__file__).with_name("llama_worker.py")

INSTALL_HINT = (
    "llama.cpp comparison needs llama-cpp-python: pip install -e '.[bench]' "
    "(it compiles llama.cpp for this CPU; about 5-10 minutes on two cores)"
)


class LlamaCppUnavailable(RuntimeError):
    pass


def llama_cpp_version() -> str:
    try:
        import llama_cpp
    except ImportError:
        raise LlamaCppUnavailable(INSTALL_HINT) from None
    return getattr(llama_cpp, "__version__", "?")


class LlamaCppRunner:
    """Drives ``python llama_worker.py`` over a pipe (one JSON request per line). The worker runs as a script,
    without importing workbench, and with the environment as the user set it: OpenMP's spin as libgomp
    sets it, not as :mod:`workbench.blas_env` does for our threads."""

    def __init__(self, model_path: str, threads: int, n_ctx: int):
        self.version = llama_cpp_version()
        self.threads = threads
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), model_path, str(threads), str(n_ctx)],
            env=blas_env.foreign_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        ready = self._read()
        if not ready.get("ready"):
            raise LlamaCppUnavailable(f"llama.cpp worker failed to start: {ready.get('error')}")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read()
            code = self.proc.wait()
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            raise LlamaCppUnavailable(f"llama.cpp worker exited ({how}): {err.strip()[-2000:]}")
        return json.loads(line)

    def _call(self, req: dict) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        res = self._read()
        if "error" in res:
            raise RuntimeError(f"llama.cpp worker: {res['error']}")
        return res

    def run(self, depth: list[int], prompt: list[int], gen: int) -> RunTiming:
        """Prefill ``prompt`` after an untimed prefill of ``depth``, then ``gen`` greedy decode steps."""
        r = self._call({"op": "run", "depth": depth, "prompt": prompt, "gen": gen})
        return RunTiming(r["prefill_s"], r["ttft_s"], r["decode_latencies_s"])

    def greedy(self, prompt: list[int], gen: int) -> list[int]:
        return self._call({"op": "run", "prompt": prompt, "gen": gen})["tokens"]

    def peak_rss_bytes(self) -> int:
        return int(self._call({"op": "rss"})["peak_rss_bytes"])

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "llama-cpp-python",
            "build": self.version,
            "device": "cpu",
            "threads": self.threads,
            "how": (
                "measured in a child process by llama-cpp-python on the host CPU, timed like ours: prefill of "
                "the same token ids, then greedy decode steps (argmax of the logits) of one token each"
            ),
        }

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
