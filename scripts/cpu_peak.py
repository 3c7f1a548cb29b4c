#!/usr/bin/env python
"""Measure the host core's multiply throughput: what bounds the cpu backend's kernels when they are not
waiting on memory.

Loops written in LLVM IR (numba intrinsics), one thread: a dependent chain of integer xor/add (one cycle
each: the core's real clock, which turbo can put above the TSC's) and ten independent chains of each
multiply instruction the kernels use (``vpmaddwd``: int16 activations; ``vpmaddubsw``, widened by a
``vpmaddwd`` as an exact int8 dot product needs: llama.cpp's int8 form; ``vfmadd`` on 4 floats: the batched
and exact-float kernels). Reported: instructions per cycle,
multiply-accumulates (MACs) per cycle, and from them, for the default model's MACs per token, the
fastest any kernel built on that instruction could decode with all threads busy (a compute floor;
measured rates, projected tokens/s).

    .venv/bin/python scripts/cpu_peak.py [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

import workbench as wb
from workbench.numba_jit import numba

I8, I16, I32, I64, F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
CHAINS = 10  # independent chains: more than latency x throughput of every instruction measured


def vt(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


PMADDWD = ("llvm.x86.sse2.pmadd.wd", vt(I16, 8), vt(I32, 4))
PMADDUBSW = ("llvm.x86.ssse3.pmadd.ub.sw.128", vt(I8, 16), vt(I16, 8))
FMA = ("llvm.fma.v4f32", vt(F32, 4), vt(F32, 4))
# name -> (instructions of one link of a chain: LLVM intrinsic, argument type, result type; MACs per link).
# vpmaddubsw's int16 pair sums of int8 products saturate when added, so an exact int8 dot product widens
# them with a vpmaddwd: 16 MACs per two instructions.
OPS = {
    "vpmaddwd": ([PMADDWD], 8),
    "vpmaddubsw": ([PMADDUBSW], 16),
    "vpmaddubsw+vpmaddwd": ([PMADDUBSW, PMADDWD], 16),
    "vfmadd (4 floats)": ([FMA], 4),
}


def _chain_kernel():
    @intrinsic
    def chain(typingctx, n, seed):
        def codegen(context, b, sig, args):
            acc = cgutils.alloca_once_value(b, args[1])
            with cgutils.for_range(b, args[0]):
                x = b.load(acc)
                for _ in range(8):
                    x = b.add(b.xor(x, args[1]), ir.Constant(I64, 7))
                b.store(x, acc)
            return b.load(acc)

        return types.int64(types.int64, types.int64), codegen

    return chain


def _op_kernel(name: str):
    links, _ = OPS[name]

    @intrinsic
    def op(typingctx, n, seed):
        def codegen(context, b, sig, args):
            mod = b.module
            wide = b.insert_element(ir.Constant(vt(I64, 2), [0, 0]), args[1], ir.Constant(I32, 0))
            accs = [cgutils.alloca_once_value(b, wide) for _ in range(CHAINS)]
            with cgutils.for_range(b, args[0]):
                for a in accs:
                    v = b.load(a)
                    for fname, arg_t, res_t in links:
                        n_args = 3 if res_t.element == F32 else 2
                        fn = mod.globals.get(fname) or ir.Function(
                            mod, ir.FunctionType(res_t, [arg_t] * n_args), fname
                        )
                        x, c = b.bitcast(v, arg_t), b.bitcast(wide, arg_t)
                        v = b.bitcast(b.call(fn, [x, c, x][:n_args]), vt(I64, 2))
                    b.store(v, a)
            total = ir.Constant(vt(I64, 2), [0, 0])
            for a in accs:
                total = b.xor(total, b.load(a))
            return b.extract_element(total, ir.Constant(I32, 0))

        return types.int64(types.int64, types.int64), codegen

    return op


def _seconds_per_iteration(kernel, n: int = 5_000_000, repeats: int = 5) -> float:
    run = numba.njit(lambda n, s: kernel(n, s))
    run(10, 3)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(n, 3)
        best = min(best, time.perf_counter() - t0)
    return best / n


def model_macs(model) -> int:
    """Multiply-accumulates of one decode token: every 2-D weight's rows x columns (the LM head included)."""
    return sum(w.rows * w.cols for w in model.weights.values() if len(w.shape) == 2 and w.rows > 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--threads", type=int, default=2, help="cores the projected floors assume")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    clock = 16 / _seconds_per_iteration(_chain_kernel())  # 8 x (xor, add): 16 one-cycle ops an iteration
    macs = model_macs(wb.load(args.model))
    rows = []
    for name, (links, per) in OPS.items():
        per_s = CHAINS / _seconds_per_iteration(_op_kernel(name))  # links a second
        rate = per_s * per * args.threads
        rows.append({"instruction": name, "per_cycle": per_s * len(links) / clock,
                     "macs_per_cycle": per_s * per / clock, "floor_tok_s": rate / macs})  # fmt: skip
    out = {"clock_ghz": clock / 1e9, "threads": args.threads, "model_macs_per_token": macs, "rows": rows,
           "how": "measured (best of 5, one thread); floor_tok_s projected: threads x MAC rate / MACs per token"}  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"core clock ~{clock / 1e9:.2f} GHz (dependent integer chain); {macs / 1e6:.0f}M MACs per token")
    for r in rows:
        print(f"  {r['instruction']:18s} {r['per_cycle']:.2f} per cycle = {r['macs_per_cycle']:5.1f} MACs/cycle"
              f" -> at most {r['floor_tok_s']:6.1f} tok/s of MACs on {args.threads} cores")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
