#!/usr/bin/env python
"""Time the cpu backend's decode matvec kernels on the default model's real tensors (weight GB/s).

For each weight role (attn_q, ..., ffn_down, the tied LM head) the one-token matvec runs over that role's
tensors of every layer in turn, as a decode step streams them (248 MB in all: nothing stays in the
caches between repeats), for each thread count; reported: milliseconds per pass, best and median of the
repeats, and the weight bytes read per second at the best (measured; on a machine shared with other
work the best is the steadier figure). Roles whose layers mix formats are also split by format.

    .venv/bin/python scripts/kernel_bench.py [--threads 1,2] [--repeats 7] [--act int16|int8|none] [--tune T]
                                             [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import workbench as wb
from workbench._numba import numba
from workbench.backends.numba_cpu import ACT_QUANT, CpuBackend
from workbench.backends.numba_cpu import matvec as mv


def role(name: str) -> str:
    """``blk.3.ffn_down.weight`` -> ``ffn_down``; the embedding table doubles as the LM head."""
    return "lm_head" if name == "token_embd.weight" else name.split(".")[2]


def layout(w) -> str:
    """The format the kernels read: the GGUF type, or the layout it was repacked into at load."""
    return {mv.Q6_K_I8: "Q6_K_I8", mv.Q5_0_X4: "Q5_0_X4"}.get(w.fmt, w.type.name)


def groups(b: CpuBackend) -> dict[str, list]:
    """Weights by role and by role+format (when a role mixes formats), in layer order."""
    by: dict[str, list] = defaultdict(list)
    for name, w in b.weights.items():
        if w.fmt in mv.QUANT_FMTS:
            by[role(name)].append(w)
    out = dict(by)
    for r, ws in by.items():
        fmts = {layout(w) for w in ws}
        if len(fmts) > 1:
            for f in sorted(fmts):
                out[f"{r}[{f}]"] = [w for w in ws if layout(w) == f]
    return out


def time_group(ws: list, act: str, repeats: int, rpt: int, vnni: bool) -> tuple[float, float]:
    """Best and median seconds of one pass of the matvec over every weight of ``ws`` (one activation row);
    ``vnni``: int8 codes for the VNNI kernels (as the backend runs ``act_quant=int8`` on such hosts)."""
    rng = np.random.default_rng(0)
    cols = {w.cols for w in ws}
    xs = {c: rng.standard_normal((1, c)).astype(np.float32) for c in cols}
    outs = [np.empty((1, w.rows), np.float32) for w in ws]
    levels = ACT_QUANT[act]
    prepared = {}
    for c, x in xs.items():
        xq = mv.act_codes(1, c, vnni)
        xd = np.empty((1, c // 32), np.float32)
        xsum = np.empty_like(xd)
        if levels:
            mv.quantize_rows_i16(x, levels, xq, xd, xsum)
        else:
            mv.block_sums(x, xsum)
        prepared[c] = (x, xq, xd, xsum)

    def one_pass() -> None:
        for w, o in zip(ws, outs, strict=True):
            x, xq, xd, xsum = prepared[w.cols]
            if levels:
                mv.matvec_i16(w.fmt, w.data, w.n_units, xq, xd, xsum, o, rpt)
            else:
                mv.matvec_f32(w.fmt, w.data, w.n_units, x, xsum, o, rpt)

    one_pass()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        one_pass()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--act", default="int16", choices=sorted(ACT_QUANT), help="activation quantization")
    ap.add_argument("--rows-per-task", type=int, default=mv.ROWS_PER_TASK)
    ap.add_argument("--only", default="", help="comma-separated roles to time (default: all)")
    ap.add_argument("--tune", default="", help="backend tunables, e.g. q6_k_as_i8=0")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    model = wb.load(args.model)
    b = CpuBackend(model, threads=max(threads), act_quant=args.act, tune=args.tune or None)
    rows = []
    only = set(filter(None, args.only.split(",")))
    for name, ws in groups(b).items():
        if only and name not in only:
            continue
        nbytes = sum(w.data.nbytes for w in ws)
        row = {
            "role": name,
            "formats": sorted({layout(w) for w in ws}),
            "tensors": len(ws),
            "mb": nbytes / 1e6,
        }
        for t in threads:
            numba.set_num_threads(t)
            best, med = time_group(ws, args.act, args.repeats, args.rows_per_task, b.vnni)
            row[f"ms_t{t}"], row[f"median_ms_t{t}"] = 1e3 * best, 1e3 * med
            row[f"gbs_t{t}"] = nbytes / best / 1e9
        rows.append(row)
        if not args.json:
            cells = "  ".join(
                f"t{t}: {row[f'ms_t{t}']:7.2f} ms (median {row[f'median_ms_t{t}']:7.2f}) {row[f'gbs_t{t}']:5.1f} GB/s"
                for t in threads
            )
            print(f"{name:22s} {'+'.join(row['formats']):10s} {row['mb']:7.1f} MB  {cells}", flush=True)
    if args.json:
        how = "measured (best and median of repeats; GB/s at the best)"
        print(json.dumps({"act": args.act, "vnni": b.vnni, "how": how, "rows": rows}, indent=1))
    else:
        print(f"act {args.act}: {b.device.details['decode_kernels']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
