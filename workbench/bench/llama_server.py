"""llama.cpp's ``llama-server`` as the Vulkan comparison: started once per bench run, timed by its own figures.

Each repeat sends our token ids to ``/completion`` (streamed, ``timings_per_token``) and reads the server's
``timings``: ``prompt_ms`` for prefill (it ends with sampling the first token) and the running
``predicted_ms`` after each generated token for the decode steps. It generates ``gen + 1`` tokens: the first
comes from the prefill's logits, as ours does, so ``gen`` decode steps are timed. Sampling is greedy
(``top_k`` 1 alone); each step's figure still includes llama.cpp copying the logits to the host and
sampling over the whole vocabulary there, where ours takes the argmax on the device.

At a depth D the prefix is sent first (untimed, ``cache_prompt``), then prefix + prompt; the server reuses
the D cached tokens and processes the P new ones: its ``cache_n`` and ``prompt_n`` are checked to be D and P.
Context checkpoints are off (``--ctx-checkpoints 0``): with them the server cuts a prompt into two batches
to store a checkpoint, which would be timed as prefill.

Without a device (``device=None``) the server runs on the CPU, for correctness checks only
(``next_token_logprobs``): its extra weight buffers (repacked and AMX layouts) are off, since with them
build b10434 gave NaN logits for the tiny Gemma 3n checkpoint on an AMX host (docs/gemma3n.md).
"""

from __future__ import annotations

import itertools
import json
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .llama_binary import LlamaBinary, LlamaBinaryUnavailable
from .llama_device import LlamaDevice
from .timing import RunTiming

START_TIMEOUT_S = 900.0  # loading a 27B GGUF and compiling its pipelines can take minutes
REQUEST_TIMEOUT_S = 3600.0
OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
USING_DEVICE = re.compile(r"using device (\S+) \((.*)\)")
GREEDY = {"temperature": 0.0, "top_k": 1, "samplers": ["top_k"]}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_events(response) -> list[dict[str, Any]]:
    """The JSON objects of a server-sent-events body (``data: {...}`` lines)."""
    events = []
    for raw in response:
        line = raw.decode("utf-8", errors="replace").strip()
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            events.append(json.loads(line[5:]))
    return events


def decode_latencies(events: list[dict[str, Any]]) -> list[float]:
    """Seconds of each decode step: differences of the running ``predicted_ms`` after each generated token
    (the first token's value is ~0: it was sampled from the prefill)."""
    marks = [e["timings"]["predicted_ms"] for e in events if "timings" in e and e.get("tokens")]
    return [(b - a) / 1e3 for a, b in itertools.pairwise(marks)]


class LlamaServerRunner:
    """One ``llama-server`` process on one Vulkan device, driven over HTTP on a free local port."""

    def __init__(
        self,
        binary: LlamaBinary,
        device: LlamaDevice | None,
        model_path: str,
        n_ctx: int,
        threads: int | None,
    ):
        self.binary, self.device = binary, device
        self.version = f"llama-server {binary.build or '(build unknown)'}"
        self.port = free_port()
        placement = (
            ["-ngl", "999", "--device", device.name]
            if device
            else ["-ngl", "0", "--device", "none", "--no-repack"]
        )
        self.args = [
            str(binary.path),
            "-m", model_path,
            *placement,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "-c", str(n_ctx),
            "-np", "1",
            "--ctx-checkpoints", "0",
            "--cache-ram", "0",
            "--no-webui",
            "-lv", "4",  # info level: the log names the device and the layers offloaded
        ]  # fmt: skip
        if threads:
            self.args += ["-t", str(threads)]
        self._dir = tempfile.TemporaryDirectory(prefix="workbench-llama-server-")
        self.log_path = Path(self._dir.name) / "server.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.args,
            env=device.env if device else binary.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            self._wait_ready()
            self.offloaded, self.picked = self._check_gpu() if device else ("0 (CPU)", "CPU")
            self.build_info = self._get("/props").get("build_info")
        except BaseException:
            self.close()
            raise

    # -- process -----------------------------------------------------------------------------------
    def log_tail(self, n: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-n:].strip()

    def _wait_ready(self) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < START_TIMEOUT_S:
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                # killed by a signal: name it (SIGILL: e.g. a build with AVX-512 or AMX kernels on a CPU without)
                if rc == -signal.SIGILL:
                    why = " (SIGILL: this llama.cpp build uses instructions this CPU cannot run)"
                else:
                    why = f" ({signal.Signals(-rc).name})" if rc < 0 and -rc in signal.valid_signals() else ""
                raise LlamaBinaryUnavailable(
                    f"llama-server exited with code {rc}{why} while starting ({' '.join(self.args)}):\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or 503 while the model loads
            time.sleep(0.5)
        raise LlamaBinaryUnavailable(
            f"llama-server did not become ready in {START_TIMEOUT_S:.0f} s:\n{self.log_tail()}"
        )

    def _check_gpu(self) -> tuple[str, str]:
        """Every layer on the device we asked for, as the server's log says; else a clear error."""
        assert self.device is not None
        log = self.log_tail(10**7)
        off = OFFLOADED.search(log)
        if off is None or int(off.group(1)) == 0 or off.group(1) != off.group(2):
            said = off.group(0) if off else "no 'offloaded N/N layers to GPU' line"
            raise LlamaBinaryUnavailable(
                f"llama-server did not put the whole model on {self.device.label()} ({said}):\n{self.log_tail()}"
            )
        used = USING_DEVICE.search(log)
        if used and used.group(1) != self.device.name:
            raise LlamaBinaryUnavailable(
                f"llama-server was asked for {self.device.name} but says: {used.group(0)}"
            )
        return f"{off.group(1)}/{off.group(2)}", used.group(0) if used else self.device.label()

    def peak_rss_bytes(self) -> int:
        """The server's peak resident memory (VmHWM), read while it runs; 0 where /proc does not say."""
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self._dir.cleanup()

    # -- HTTP --------------------------------------------------------------------------------------
    def _get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=60) as r:
            return json.loads(r.read())

    def _post_completion(self, body: dict[str, Any], read):
        """``read(response)`` of a POST of ``body`` to ``/completion``; a failure raised with the server's log."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/completion",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
                return read(r)
        except (urllib.error.URLError, OSError) as e:
            detail = e.read().decode(errors="replace") if isinstance(e, urllib.error.HTTPError) else str(e)
            raise RuntimeError(f"llama-server /completion failed: {detail}\n{self.log_tail()}") from None

    def _complete(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._post_completion({**body, "stream": True}, read_events)
        errors = [e["error"] for e in events if "error" in e]
        if errors or not events or "timings" not in events[-1]:
            raise RuntimeError(f"llama-server /completion: {errors or 'no timings in the reply'}")
        return events

    def logprobs_after(self, ids: list[int], n_vocab: int, emit: int) -> list[float]:
        """llama.cpp's log-probabilities of every token after ``ids`` (a fresh prefill, no cache), from its raw
        logits (NaN where it gives none). The token generated is forced to ``emit`` by a logit bias, which the
        figures are taken before: a token whose piece is not whole UTF-8 text (a byte token) would make the
        server withhold them or fail the request, so ``emit`` should be a plain-text token."""
        body = {"prompt": ids, "n_predict": 1, "n_probs": n_vocab, "cache_prompt": False,
                "logit_bias": [[emit, 1000.0]], **GREEDY}  # fmt: skip
        reply = self._post_completion(body, lambda r: json.loads(r.read()))
        tops = (reply.get("completion_probabilities") or [{}])[0].get("top_logprobs")
        if not tops:
            raise RuntimeError(f"llama-server returned no log-probabilities: {str(reply)[:500]}")
        out = [float("nan")] * n_vocab
        for t in tops:
            if t["logprob"] is not None and 0 <= int(t["id"]) < n_vocab:  # JSON null: a NaN logit
                out[int(t["id"])] = float(t["logprob"])
        return out

    # -- a repeat ----------------------------------------------------------------------------------
    def run(self, depth: list[int], prompt: list[int], gen: int) -> RunTiming:
        """Prefill ``prompt`` after ``depth`` cached tokens, then ``gen`` greedy decode steps."""
        if depth:
            self._complete({"prompt": depth, "n_predict": 0, "cache_prompt": True, **GREEDY})
        events = self._complete(
            {
                "prompt": depth + prompt,
                "n_predict": gen + 1,
                "ignore_eos": True,
                "cache_prompt": bool(depth),
                "timings_per_token": True,
                **GREEDY,
            }
        )
        t = events[-1]["timings"]
        if t.get("cache_n", 0) != len(depth) or t["prompt_n"] != len(prompt) or t["predicted_n"] != gen + 1:
            raise RuntimeError(
                f"llama-server reused {t.get('cache_n')} cached tokens, processed {t['prompt_n']} and generated "
                f"{t['predicted_n']}; the run asked for {len(depth)}, {len(prompt)} and {gen + 1}, so its figures "
                "would not be the prefill and decode asked for"
            )
        lat = decode_latencies(events)
        if len(lat) != gen:
            raise RuntimeError(f"llama-server reported {len(lat)} decode step timings, expected {gen}")
        return RunTiming(t["prompt_ms"] / 1e3, t["prompt_ms"] / 1e3, lat)

    def describe(self) -> dict[str, Any]:
        return {
            **self.binary.describe(),
            "build_info": self.build_info,
            "device": self.device.label() if self.device else "CPU",
            "device_log": self.picked,
            "layers_offloaded": self.offloaded,
            "command": self.args,
            "how": (
                "measured by llama-server's own timings on the same token ids: prefill = prompt_ms (ends with "
                "sampling the first token); decode = gaps of predicted_ms between generated tokens "
                "(timings_per_token), each including its greedy sampling (top_k 1) over the whole vocabulary "
                "on the host; at a depth, the depth prefix is cached by an untimed request first"
            ),
        }
