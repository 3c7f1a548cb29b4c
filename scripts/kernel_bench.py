#!/usr/bin/env python
"""Time the cpu backend's decode matvec kernels on the default model's real tensors (weight GB/s).

For each weight role (attn_q, ..., ffn_down, the tied LM head) the one-token matvec runs over that role's
tensors of every layer in turn, for each thread count; reported: milliseconds per pass, best and median of
the repeats, and the weight bytes read per second at the best (measured; on a machine shared with other
work the best is the steadier figure). Roles whose layers mix formats are also split by format. A role's
tensors (2-19 MB, the LM head aside) can stay in a 32 MB L3 between its repeats: these are the kernels'
speeds with the weights near, not a decode step's.

``--step`` times a decode step's own weight stream instead: every projection of the lowered one-token
program (QKV, attn_output, gate/up, ffn_down of each layer, then the LM head) in program order, 248 MB a
pass, so each comes from memory. Nothing else of the step runs (no norms, attention or waits between ops).
With the host's streaming read measured after the passes, it tells how much of the bandwidth bound (the
GGUF's bytes over that read) the matvecs alone leave: a decode step cannot be faster than they are.

    .venv/bin/python scripts/kernel_bench.py [--threads 1,2] [--repeats 7] [--act int16|int8|none] [--tune T]
                                             [--step] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# workbench before numpy: it sets OpenBLAS's thread environment (workbench.blas_env) before numpy loads it
import workbench as wb  # noqa: I001
import numpy as np
from workbench.numba_jit import numba
from workbench.backends.numba_cpu import ACT_QUANT, CpuBackend
from workbench.backends.numba_cpu import matvec as mv
from workbench.backends.numba_cpu import matvec_table as mt
from workbench.backends.numba_cpu.simd import Q6_K_I8
from workbench.backends.numba_cpu import instructions as ins
from workbench.backends.numba_cpu.simd import INTERLEAVED
from workbench.instrument.devices import stream_read_gbs


def role(name: str) -> str:
    """``blk.3.ffn_down.weight`` -> ``ffn_down``; the embedding table doubles as the LM head."""
    return "lm_head" if name == "token_embd.weight" else name.split(".")[2]


def layout(w) -> str:
    """The format the kernels read: the GGUF type, or the layout it was repacked into at load."""
    names = {Q6_K_I8: "Q6_K_I8", mv.Q5_0_X4: "Q5_0_X4"} | {f: f"{t.name}_R16" for f, t in INTERLEAVED.items()}
    return names.get(w.fmt, w.type.name)


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


def prepared_acts(cols: set[int], act: str, vnni: bool) -> dict[int, tuple]:
    """One random activation row per width, quantized as the backend would: (x, codes, scales, sums)."""
    rng = np.random.default_rng(0)
    levels = ACT_QUANT[act]
    prepared = {}
    for c in sorted(cols):
        x = rng.standard_normal((1, c)).astype(np.float32)
        xq = mv.act_codes(1, c, vnni)
        xd = np.empty((1, c // 32), np.float32)
        xsum = np.empty_like(xd)
        if levels:
            mv.quantize_rows_i16(x, levels, xq, xd, xsum)
        else:
            mv.block_sums(x, xsum)
        prepared[c] = (x, xq, xd, xsum)
    return prepared


def timed(one_pass, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``one_pass`` (after one untimed call)."""
    one_pass()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        one_pass()
        times.append(time.perf_counter() - t0)
    return times


def time_group(ws: list, act: str, repeats: int, rpt: int, vnni: bool) -> tuple[float, float]:
    """Best and median seconds of one pass of the matvec over every weight of ``ws`` (one activation row);
    ``vnni``: int8 codes for the VNNI kernels (as the backend runs ``act_quant=int8`` on such hosts)."""
    prepared = prepared_acts({w.cols for w in ws}, act, vnni)
    outs = [np.empty((1, w.rows), np.float32) for w in ws]
    levels = ACT_QUANT[act]

    def one_pass() -> None:
        for w, o in zip(ws, outs, strict=True):
            x, xq, xd, xsum = prepared[w.cols]
            mv.matvec(w.fmt, w.data, w.n_units, x, levels, xq, xd, xsum, o, rpt)

    times = timed(one_pass, repeats)
    return min(times), statistics.median(times)


def step_tables(b: CpuBackend, model) -> list[tuple[np.ndarray, int, int]]:
    """The projections of the lowered one-token program, in its order: (weight table, weights, input width)."""
    prog = ins.lower(b, b.prepare_graph(model.graph(1, 1)))
    if prog is None:
        raise SystemExit("--step: this model's decode graph does not lower to a program")
    kinds = (ins.NORM_MATMUL, ins.NORM_MATMUL_GELU, ins.MATMUL_NORM_ADD)
    return [(wt, int(c["n_w"]), int(c["k"])) for c, wt in zip(prog.code, prog.wts[0]) if c["op"] in kinds]


def _bytes(wt: np.ndarray, nw: int, by_addr: dict, model=None) -> int:
    """Bytes of the first ``nw`` weights of a table: as the kernels read them, or with ``model`` as its file
    stores them (what the bandwidth bound counts; layouts repacked at load can be larger)."""
    total = 0
    for j in range(nw):
        w = by_addr[int(wt[j, mv.W_ADDR])]
        total += model.weights[w.name].nbytes if model is not None else w.data.nbytes
    return total


def time_step(tables: list, act: str, repeats: int, rpt: int, vnni: bool, by_addr: dict, model) -> dict:
    """Best and median ms of a decode step's projections in program order: the layers', the LM head's (the
    last projection) and both; and the weight bytes each part streams and stores in ``model``'s file
    (``by_addr``: the backend's weights by address)."""
    prepared = prepared_acts({k for _, _, k in tables}, act, vnni)
    levels = ACT_QUANT[act]
    outs = [tuple(np.empty((1, max(1, int(wt[min(j, nw - 1), mv.W_ROWS]))), np.float32) for j in range(3))
            for wt, nw, _ in tables]  # fmt: skip

    def run(part: list) -> None:
        for (wt, nw, k), o in part:
            x, xq, xd, xsum = prepared[k]
            mt.matvec_table(wt, nw, o, x, levels, xq, xd, xsum, rpt, mt.NO_PREFETCH, mt.NO_MAXIMA)

    items = list(zip(tables, outs, strict=True))
    layers, head = items[:-1], items[-1:]
    split: list[tuple[float, float]] = []

    def one_pass() -> None:
        t0 = time.perf_counter()
        run(layers)
        t1 = time.perf_counter()
        run(head)
        split.append((t1 - t0, time.perf_counter() - t1))

    timed(one_pass, repeats)
    split = split[1:]

    res = {}
    for name, part in (("layers", layers), ("lm_head", head)):
        res[f"{name}_mb"] = sum(_bytes(wt, nw, by_addr) for (wt, nw, _), _ in part) / 1e6
        res[f"{name}_gguf_mb"] = sum(_bytes(wt, nw, by_addr, model) for (wt, nw, _), _ in part) / 1e6
    for name, vals in (("layers", [a for a, _ in split]), ("lm_head", [h for _, h in split]),
                       ("step", [a + h for a, h in split])):  # fmt: skip
        res[f"{name}_ms"], res[f"{name}_median_ms"] = 1e3 * min(vals), 1e3 * statistics.median(vals)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--act", default="int16", choices=sorted(ACT_QUANT), help="activation quantization")
    ap.add_argument("--rows-per-task", type=int, default=mv.ROWS_PER_TASK)
    ap.add_argument("--only", default="", help="comma-separated roles to time (default: all)")
    ap.add_argument("--tune", default="", help="backend tunables, e.g. q6_k_as_i8=0")
    ap.add_argument(
        "--step", action="store_true", help="a decode step's projections in program order instead"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    model = wb.load(args.model)
    b = CpuBackend(model, threads=max(threads), act_quant=args.act, tune=args.tune or None)
    if args.step:
        return step_main(args, b, model, threads)
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


def step_main(args, b: CpuBackend, model, threads: list[int]) -> int:
    """``--step``: the step's projections per thread count, and the share of the bandwidth bound they leave."""
    tables = step_tables(b, model)
    by_addr = {w.data.ctypes.data: w for w in b.weights.values() if w.fmt >= 0}
    rows = []
    for t in threads:
        numba.set_num_threads(t)
        row = {
            "threads": t,
            **time_step(tables, args.act, args.repeats, args.rows_per_task, b.vnni, by_addr, model),
        }
        row["host_read_gbs"] = stream_read_gbs(t)
        bound_ms = (row["layers_gguf_mb"] + row["lm_head_gguf_mb"]) / row["host_read_gbs"]  # MB / (GB/s) = ms
        row["bound_ms"] = bound_ms
        row["bound_fraction_at_most"] = bound_ms / row["step_median_ms"]
        rows.append(row)
        if not args.json:
            print(
                f"t{t}: layers {row['layers_median_ms']:.2f} ms ({row['layers_mb']:.0f} MB), LM head "
                f"{row['lm_head_median_ms']:.2f} ms ({row['lm_head_mb']:.0f} MB), step {row['step_median_ms']:.2f} ms "
                f"(medians of {args.repeats}; best {row['step_ms']:.2f}); host read {row['host_read_gbs']:.1f} GB/s: "
                f"bound {bound_ms:.2f} ms (the GGUF's {row['layers_gguf_mb'] + row['lm_head_gguf_mb']:.0f} MB), "
                f"so the matvecs alone reach at most {100 * row['bound_fraction_at_most']:.0f}%",
                flush=True,
            )
    if args.json:
        how = "measured (projections in program order from memory; host read measured after them); bound projected"
        print(json.dumps({"act": args.act, "vnni": b.vnni, "how": how, "step": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
