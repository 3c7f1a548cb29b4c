"""``workbench bench --vs llama.cpp``: which llama.cpp runs beside ours, and the ratios ours / theirs.

llama.cpp runs on the device ours runs on. ``--backend vulkan``: a Vulkan build of llama.cpp
(``llama-bench`` or ``llama-server``, see :mod:`.llama_binary`) on the same Vulkan device. Host backends:
llama-cpp-python on the CPU with the same threads (:mod:`.llama_cpp`). Every runner answers
``run(depth, prompt, gen) -> RunTiming``.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..models.model import Model
from ..runtime.engine import Engine
from .stats import ratio_ci
from .timing import RunTiming, summarize


class LlamaRunner(Protocol):
    version: str

    def run(self, depth: list[int], prompt: list[int], gen: int) -> RunTiming: ...

    def peak_rss_bytes(self) -> int: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def open_llama_cpp(
    model: Model, engine: Engine, n_ctx: int, threads: int | None, binary_path: str | None
) -> LlamaRunner:
    """Start the llama.cpp that matches ``engine``'s device (``binary_path``: ``--llama-cpp PATH``)."""
    if model.kind not in ("gguf", "synthetic"):
        raise ValueError("--vs llama.cpp needs a GGUF model (llama.cpp reads only GGUF)")
    if engine.backend.name == "vulkan":
        return open_vulkan(model, engine, n_ctx, threads, binary_path)
    if binary_path:
        raise ValueError(
            "--llama-cpp names a Vulkan build of llama.cpp, compared with --backend vulkan; host backends "
            "compare with llama-cpp-python (pip install -e '.[bench]')"
        )
    from .llama_cpp import LlamaCppRunner

    return LlamaCppRunner(model.source, threads=threads or engine.backend.threads_used(), n_ctx=n_ctx)


def open_vulkan(
    model: Model, engine: Engine, n_ctx: int, threads: int | None, binary_path: str | None
) -> LlamaRunner:
    from ..backends.vulkan.device import list_devices
    from .llama_binary import find_llama_binary
    from .llama_device import matching_device

    binary = find_llama_binary(binary_path)
    names = [d.name for d in list_devices()]
    device = matching_device(binary, names, engine.backend.dev.features.index)
    if binary.kind == "llama-server":
        from .llama_server import LlamaServerRunner

        return LlamaServerRunner(binary, device, model.source, n_ctx, threads)
    from .llama_bench import LlamaBenchRunner

    return LlamaBenchRunner(binary, device, model.source, threads)


def compare(
    ours: dict[str, Any], runs: list[RunTiming], theirs: LlamaRunner, prompt_tokens: int, gen_tokens: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """llama.cpp's summary (as ours, with what measured it) and the ratios ours / theirs with bootstrap
    intervals. A figure llama.cpp did not measure (llama-bench has no per-step latencies) is None."""
    t = summarize(runs, prompt_tokens, gen_tokens)
    t["peak_rss_bytes"] = theirs.peak_rss_bytes()
    t["version"] = theirs.version
    t["engine"] = theirs.describe()
    t["how"] = f"{t['engine']['how']}; device {t['engine']['device']}"
    if not any(r.decode_latencies_s for r in runs):
        t["decode_latency_s"] = None
    pr = ratio_ci(ours["samples"]["prefill_tok_s"], t["samples"]["prefill_tok_s"])
    dr = ratio_ci(ours["samples"]["decode_tok_s"], t["samples"]["decode_tok_s"])
    vs: dict[str, Any] = {
        "prefill_ratio": pr["ratio"],
        "decode_ratio": dr["ratio"],
        "prefill_ratio_ci": [pr["lo"], pr["hi"]],
        "decode_ratio_ci": [dr["lo"], dr["hi"]],
        "peak_rss_ratio": ours["peak_rss_bytes"] / t["peak_rss_bytes"] if t["peak_rss_bytes"] else None,
    }
    for key in ("time_to_first_token_s", "decode_latency_p50_s"):  # lower is better: ours/theirs
        name = key.removesuffix("_s")
        if t["samples"].get(key):
            r = ratio_ci(ours["samples"][key], t["samples"][key])
            vs[f"{name}_ratio"], vs[f"{name}_ratio_ci"] = r["ratio"], [r["lo"], r["hi"]]
        else:
            vs[f"{name}_ratio"], vs[f"{name}_ratio_ci"] = None, None
    return t, vs
