"""``workbench bench``: prefill and decode speed, medians with intervals, optionally vs llama.cpp."""

from __future__ import annotations

import argparse

from .common import add_device_arg, add_json_arg, add_model_args, non_negative_int, positive_int


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench", help="benchmark prefill and decode (medians, bootstrap intervals, run record)"
    )
    add_model_args(p)
    p.add_argument("--backend", "-b", default="auto", help="numpy | cpu | vulkan | npu | auto")
    p.add_argument("--prompt-tokens", "-p", type=positive_int, default=128)
    p.add_argument("--gen-tokens", "-g", type=positive_int, default=32)
    p.add_argument("--repeats", "-r", type=positive_int, default=5)
    p.add_argument(
        "--depth",
        "-d",
        type=non_negative_int,
        default=0,
        help="context depth: prefill this many tokens (untimed) before each timed prefill and decode, "
        "as llama-bench's -d (default 0)",
    )
    p.add_argument("--warmups", type=int, default=1)
    p.add_argument(
        "--threads", "-t", type=positive_int, default=None, help="host threads (ours and llama.cpp's)"
    )
    p.add_argument(
        "--vs",
        choices=["llama.cpp"],
        default=None,
        help="alternate runs with llama.cpp on the same GGUF and device (--backend vulkan: a Vulkan build "
        "of llama.cpp, see --llama-cpp; host backends: llama-cpp-python, extra 'bench')",
    )
    p.add_argument(
        "--llama-cpp",
        default=None,
        metavar="PATH",
        help="with --backend vulkan --vs llama.cpp: a llama-bench or llama-server binary built with Vulkan, "
        "or its folder (llama-bench preferred); default: the llama-server of the extra 'bench-vulkan'",
    )
    p.add_argument(
        "--trace", default=None, help="write a Chrome/Perfetto trace of a profiled run to this path"
    )
    p.add_argument("--no-profile", action="store_true", help="skip the profiled run (op rows in the record)")
    p.add_argument("--tune", default=None, help="backend tunables, e.g. matvec.wg=64 (Vulkan)")
    add_device_arg(p)
    p.add_argument("--debug", action="store_true")
    add_json_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..bench.harness import BenchConfig, run_bench
    from . import emit_json

    opts = {"tune": args.tune} if args.tune else None
    cfg = BenchConfig(
        model=args.model,
        backend=args.backend,
        prompt_tokens=args.prompt_tokens,
        gen_tokens=args.gen_tokens,
        repeats=args.repeats,
        warmups=args.warmups,
        threads=args.threads,
        vs=args.vs,
        trace=args.trace,
        profile=not args.no_profile,
        backend_options=opts,
        depth=args.depth,
        llama_cpp=args.llama_cpp,
    )
    res = run_bench(cfg)
    if args.json:
        emit_json(res)
        return 0
    o = res["ours"]
    print(f"{res['model']} on {res['backend']} ({res['how']})")
    if res["depth"]:
        print(f"  at depth {res['depth']}: figures are for the prompt and decode after {res['depth']} tokens")
    for key, label in (
        ("prefill_tok_s", "prefill tok/s"),
        ("decode_tok_s", "decode tok/s"),
        ("time_to_first_token_s", "time to first token s"),
    ):
        v = o[key]
        print(
            f"  {label:<24} {v['median']:10.3f}  [{v['lo']:.3f}, {v['hi']:.3f}] (median, 95% CI, n={v['n']})"
        )
    lat = o["decode_latency_s"]
    print(
        f"  decode latency ms        p50 {lat['p50'] * 1e3:.2f}  p90 {lat['p90'] * 1e3:.2f}  p99 {lat['p99'] * 1e3:.2f}"
    )
    print(f"  peak RSS                 {o['peak_rss_bytes'] / 2**20:.0f} MiB")
    if "bandwidth_bound" in o:
        bb = o["bandwidth_bound"]
        f, g = bb["fraction"], bb["stream_read_gbs"]
        print(
            f"  decode / bandwidth bound {f['median'] * 100:.1f}% [{f['lo'] * 100:.1f}, {f['hi'] * 100:.1f}] "
            f"(host read {g['median']:.1f} GB/s, measured after each repeat; {bb['bytes_per_token'] / 1e6:.1f} MB a token)"
        )
        if "thread_round_trip_us" in bb:
            print(
                f"  thread round trip        {bb['thread_round_trip_us']['median']:.2f} us (an empty parallel loop)"
            )
    if "device_bandwidth" in o:
        bw = o["device_bandwidth"]
        text = (
            bw["error"] if "error" in bw else f"{bw['best_gbs']:.0f} GB/s best, {bw['median_gbs']:.0f} median"
        )
        print(f"  device streaming read    {text} ({bw.get('how', 'shaders/stream_read.comp')})")
    if "decode_host_overhead_share" in o:
        h = o["decode_host_overhead_share"]
        print(
            f"  host overhead / decode   {h['median'] * 100:.1f}% of the step ({o['decode_host_overhead_how']})"
        )
    if "vs_llama_cpp" in res:
        v, t = res["vs_llama_cpp"], res["llama_cpp"]
        print(
            f"  llama.cpp {t['version']} on {t['engine']['device']}: prefill {t['prefill_tok_s']['median']:.1f} "
            f"tok/s, decode {t['decode_tok_s']['median']:.1f} tok/s"
        )
        print(f"    ({t['how']})")
        pl, ph = v["prefill_ratio_ci"]
        dl, dh = v["decode_ratio_ci"]
        print(
            f"  ratio ours/llama.cpp     prefill {v['prefill_ratio']:.3f} [{pl:.3f}, {ph:.3f}], "
            f"decode {v['decode_ratio']:.3f} [{dl:.3f}, {dh:.3f}] (median ratio, 95% CI)"
        )
    prof = res.get("profile") or {}
    if prof:
        print(f"  profiling overhead       {prof['profiling_overhead'] * 100:+.1f}% of decode time")
        for k, val in prof["steps"].items():
            print(f"  {k:<24} {val:.3f}")
        proj = prof.get("decode_projections") or {}
        if proj:
            share = lambda r: f" ({r['share'] * 100:.0f}%)" if r.get("share") else ""  # noqa: E731
            kinds = ", ".join(f"{r['kind']} {r['gbps']:.0f}{share(r)}" for r in proj["by_kind"])
            print(f"  decode projections GB/s  {proj['gbps']:.0f}{share(proj)} of the measured read: {kinds}")
    print(f"  record: {res['record']}")
    return 0
