"""llama.cpp's ``llama-bench`` as the Vulkan comparison: two runs of it per repeat, read from ``-o json``.

llama-bench feeds its own random token ids (only the lengths are ours), times the forward passes alone (no
sampling) and reports one total per test, so there are no per-step latencies. A repeat is
``-p P -n 0 -d D`` (prefill of P tokens after D) then ``-p 0 -n G -d D+P`` (G decode steps after D + P,
where ours decodes); each run loads the model, warms up and fills its depth untimed, with ``-r 1`` so that
repeats alternate with ours.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from typing import Any

from .llama_binary import LlamaBinary
from .llama_device import LlamaDevice
from .timing import RunTiming


def parse_bench_json(text: str) -> list[dict[str, Any]]:
    """The test objects of ``llama-bench -o json`` output (a JSON array)."""
    start = text.find("[")
    if start < 0:
        raise RuntimeError(f"llama-bench printed no JSON array: {text.strip()[-2000:]}")
    tests = json.loads(text[start:])
    if not isinstance(tests, list) or not all(isinstance(t, dict) for t in tests):
        raise RuntimeError("llama-bench JSON is not an array of test objects")
    return tests


def sample_seconds(tests: list[dict[str, Any]], n_prompt: int, n_gen: int, n_depth: int) -> float:
    """Seconds of the one sample of the test ``(n_prompt, n_gen, n_depth)``."""
    for t in tests:
        if (t.get("n_prompt"), t.get("n_gen"), t.get("n_depth", 0)) == (n_prompt, n_gen, n_depth):
            samples = t.get("samples_ns") or [t["avg_ns"]]
            return float(samples[0]) / 1e9
    have = [(t.get("n_prompt"), t.get("n_gen"), t.get("n_depth", 0)) for t in tests]
    raise RuntimeError(
        f"llama-bench reported no test p={n_prompt} n={n_gen} d={n_depth} (it reported {have})"
    )


class LlamaBenchRunner:
    """Runs ``llama-bench`` on one Vulkan device for each repeat."""

    def __init__(self, binary: LlamaBinary, device: LlamaDevice, model_path: str, threads: int | None):
        self.binary, self.device, self.model_path, self.threads = binary, device, model_path, threads
        self.version = "llama-bench (build unknown)"
        self.info: dict[str, Any] = {}
        self.commands: list[list[str]] = []
        self._peak_rss = 0

    def _bench(self, n_prompt: int, n_gen: int, n_depth: int) -> float:
        args = [
            str(self.binary.path),
            "-m", self.model_path,
            "-p", str(n_prompt),
            "-n", str(n_gen),
            "-r", "1",
            "-ngl", "999",
            "-dev", self.device.name,
            "-o", "json",
        ]  # fmt: skip
        if n_depth:  # older builds have no -d
            args += ["-d", str(n_depth)]
        if self.threads:
            args += ["-t", str(self.threads)]
        if args not in self.commands:
            self.commands.append(args)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                args, env=self.device.env, stdout=out, stderr=err, stdin=subprocess.DEVNULL
            )
            _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS
            proc.returncode = os.waitstatus_to_exitcode(status)
            self._peak_rss = max(self._peak_rss, usage.ru_maxrss * 1024)
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
        if proc.returncode != 0:
            raise RuntimeError(
                f"llama-bench exited with {proc.returncode} ({' '.join(args)}):\n{(stdout + stderr).strip()[-3000:]}"
            )
        tests = parse_bench_json(stdout)
        self._note(tests[0])
        return sample_seconds(tests, n_prompt, n_gen, n_depth)

    def _note(self, test: dict[str, Any]) -> None:
        """What llama-bench says of itself and the device, for the record."""
        keys = ("build_commit", "build_number", "backends", "gpu_info", "devices", "n_batch", "n_ubatch")
        self.info = {k: test[k] for k in keys if k in test}
        if "build_number" in test:
            self.version = f"llama-bench b{test['build_number']}"

    def run(self, depth: list[int], prompt: list[int], gen: int) -> RunTiming:
        """Prefill of ``len(prompt)`` tokens after ``len(depth)``, then ``gen`` decode steps after both."""
        d, p = len(depth), len(prompt)
        prefill = self._bench(p, 0, d)
        decode = self._bench(0, gen, d + p)
        return RunTiming(prefill, prefill, [], decode_total_s=decode)

    def peak_rss_bytes(self) -> int:
        return self._peak_rss

    def close(self) -> None:
        """Nothing stays running between repeats."""

    def describe(self) -> dict[str, Any]:
        return {
            **self.binary.describe(),
            "reported": self.info,
            "device": self.device.label(),
            "commands": self.commands,
            "how": (
                "measured by llama-bench (-o json samples_ns, one repetition a run): prefill = its pp test at "
                "depth D; decode = its tg test at depth D + P; its own random token ids, no sampling; time to "
                "first token = the prefill (not measured apart); no per-step latencies"
            ),
        }
