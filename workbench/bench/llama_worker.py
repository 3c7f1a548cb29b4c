"""Child process for the llama.cpp comparison: ``python llama_worker.py GGUF THREADS N_CTX`` (run as a script: it
imports nothing of workbench, whose import tunes OpenMP and OpenBLAS threads for our own kernels).

Reads one JSON request per line on stdin (``run``, ``rss``, ``quit``) and answers one JSON line on stdout.
A run is timed exactly like ours: prefill of the prompt (after an untimed prefill of the ``depth`` tokens, if
any), then greedy decode steps of one token each.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import numpy as np


def main() -> int:
    path, threads, n_ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    out = sys.stdout
    here = Path(__file__).resolve().parent  # on sys.path, as the script's folder: its llama_cpp.py is ours
    sys.path = [p for p in sys.path if Path(p or ".").resolve() != here]
    try:
        from llama_cpp import Llama

        n_batch = max(512, n_ctx)
        llm = Llama(
            model_path=path,
            n_ctx=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            n_batch=n_batch,
            n_ubatch=n_batch,
            logits_all=False,
            verbose=False,
        )
        n_vocab = llm.n_vocab()
    except Exception as e:  # report any failure to the parent instead of dying silently
        out.write(json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}"}) + "\n")
        out.flush()
        return 1
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()

    def argmax() -> int:
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))))

    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "quit":
                break
            if req["op"] == "rss":
                res = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
            elif req["op"] == "run":
                llm.reset()
                if req.get("depth"):  # the context the timed prefill follows, untimed
                    llm.eval(req["depth"])
                t0 = time.perf_counter()
                llm.eval(req["prompt"])
                t1 = time.perf_counter()
                tok = argmax()
                ttft = time.perf_counter() - t0
                tokens, lat = [tok], []
                for _ in range(req["gen"]):
                    ts = time.perf_counter()
                    llm.eval([tok])
                    tok = argmax()
                    lat.append(time.perf_counter() - ts)
                    tokens.append(tok)
                res = {"prefill_s": t1 - t0, "ttft_s": ttft, "decode_latencies_s": lat, "tokens": tokens}
            else:
                res = {"error": f"unknown op {req['op']!r}"}
        except Exception as e:
            res = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(res) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
