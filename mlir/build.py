#!/usr/bin/env python
"""Generate the IRON designs of a model's NPU schedules and, where mlir-aie is installed, compile them.

    python mlir/build.py                          # gemma3-270m, npu1, bf16 -> mlir/build/<design>/design.py
    python mlir/build.py --model gemma3-1b --device npu2 --dtype int8
    python mlir/build.py --model path/to/model.gguf --prompt-tokens 16 64 --max-keys 2048
    python mlir/build.py --golden                 # rewrite mlir/golden/ (the designs tests compare against)

Compiling follows mlir-aie's example Makefiles: the design prints MLIR (``aie.mlir``), the kernels compile
with Peano's clang (``--target=aie2-none-unknown-elf``, the Makefiles' flags, tile sizes as ``DIM_*``
defines), and ``aiecc.py`` (Peano, no Chess) links ``final.xclbin`` + ``insts.bin``. Without the toolchain
nothing is compiled and the manifest says so. The designs are those the ``npu`` backend plans for the model
(decode, prefills of ``--prompt-tokens`` rows, attention up to ``--max-keys`` keys), each in the folder
``workbench.backends.npu.designs.artifacts`` names, where ``--tune mode=xrt`` loads them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from workbench.backends.npu.arch import get_array  # noqa: E402
from workbench.backends.npu.channels import channel_violations  # noqa: E402
from workbench.backends.npu.designs import INSTS, XCLBIN, artifacts, schedule_record  # noqa: E402
from workbench.backends.npu.iron import design_name, design_source, golden_schedules, model_schedules  # noqa: E402
from workbench.backends.npu.schedule import MM_EXPAND  # noqa: E402
from workbench.models.config import PRESETS, ModelConfig, preset  # noqa: E402
from workbench.models.registry import load  # noqa: E402

KERNEL_SOURCES = {  # object file stem -> source (in mlir-aie's aie_kernels/<arch>, or mlir/kernels: ours)
    "mm": "mm.cc",
    "mm_i8": "mm_i8.cc",
    "mv": "mv.cc",
    "gemv": "gemv.cc",
    "rmsnorm": "rmsnorm.cc",
    "attention": "attention.cc",
}
OURS = ("mm_i8", "gemv", "rmsnorm", "attention")
# Peano flags of mlir-aie's programming_examples/makefile-common (PEANOWRAP2_FLAGS)
PEANO_FLAGS = ["-O2", "-std=c++20", "-DNDEBUG", "-Wno-parentheses", "-Wno-attributes", "-Wno-macro-redefined",
               "-Wno-empty-body"]  # fmt: skip


def toolchain() -> dict:
    """What of mlir-aie's toolchain is here: aiecc.py, the `aie` Python package, Peano's clang, and the
    mlir-aie tree (``MLIR_AIE_DIR``: ``aie_kernels/`` sources and ``include/`` headers)."""
    found = {"aiecc.py": shutil.which("aiecc.py")}
    try:
        import aie  # noqa: F401

        found["aie (IRON)"] = "importable"
    except ImportError:
        found["aie (IRON)"] = None
    peano = os.environ.get("PEANO_INSTALL_DIR")
    clang = Path(peano, "bin", "clang++") if peano else None
    found["peano clang++"] = str(clang) if clang and clang.exists() else None
    tree = os.environ.get("MLIR_AIE_DIR")
    found["MLIR_AIE_DIR (aie_kernels)"] = tree if tree and Path(tree, "aie_kernels").is_dir() else None
    return found


def kernel_source(obj: str, target: str, tools: dict) -> Path:
    """The C++ source of kernel object ``obj`` (``mm_64x64x32.o``, ``rms_norm.o``) for ``target``."""
    stem = re.sub(r"_\d+(x\d+)*$", "", obj.removesuffix(".o"))
    if stem not in KERNEL_SOURCES:
        raise ValueError(f"no kernel source known for {obj} (known: {', '.join(KERNEL_SOURCES)})")
    if stem in OURS:
        return HERE / "kernels" / KERNEL_SOURCES[stem]
    return Path(tools["MLIR_AIE_DIR (aie_kernels)"], "aie_kernels", target, KERNEL_SOURCES[stem])


def kernel_defines(obj: str, schedule, config: ModelConfig) -> list[str]:
    """Compile-time parameters of one kernel object, as mlir-aie's Makefiles pass them (``DIM_M`` ...,
    ``<in>_<out>_ONLY``, ``B_COL_MAJ``) and as our kernels in ``mlir/kernels`` read them (tile sizes, the
    int8 MAC tile and its expansion from the schedule, constants such as the RMSNorm epsilon and the
    attention scale from the model ``config``)."""
    t, p = schedule.tile, schedule.problem
    if obj.startswith("mm_i8_"):
        em, en = MM_EXPAND[get_array(schedule.device).generation, "i8"]
        return [f"-DDIM_M={t['m']}", f"-DDIM_K={t['k']}", f"-DDIM_N={t['n']}", f"-DMMUL_R={t['r']}",
                f"-DMMUL_S={t['s']}", f"-DMMUL_T={t['t']}", f"-DEXPAND_M={em}", f"-DEXPAND_N={en}"]  # fmt: skip
    if obj.startswith("mm_"):
        out = [f"-DDIM_M={t['m']}", f"-DDIM_K={t['k']}", f"-DDIM_N={t['n']}",
               f"-D{schedule.dtype_in}_{schedule.dtype_out}_ONLY"]  # fmt: skip
        return out + (["-DB_COL_MAJ"] if schedule.notes.get("b_col_maj") else [])
    if obj.startswith(("mv_", "gemv_")):
        return [f"-DDIM_M={t['m']}", f"-DDIM_K={t['k']}"]
    if obj.startswith("rmsnorm_"):
        return [
            f"-DNORM_ROWS={t['rows_per_call']}",
            f"-DNORM_LEN={p['L']}",
            f"-DNORM_EPS={config.rms_eps!r}f",
        ]
    if obj == "attention.o":
        group = p["n_heads"] // p["n_kv_heads"]
        return [f"-DROWS={t['q_tile'] * group}", f"-DGROUP={group}", f"-DHEAD_DIM={p['head_dim']}",
                f"-DCHUNK={t['kv_chunk']}", f"-DWINDOW={p['window']}", f"-DSCALE={config.attn_scale!r}f"]  # fmt: skip
    return []


def build_commands(schedule, tools: dict, config: ModelConfig) -> list[list[str]]:
    """The commands that build one design in its folder: kernels with Peano, then ``aiecc.py``
    (``aie.mlir`` -> ``final.xclbin`` + ``insts.bin``), as mlir-aie's example Makefiles run them."""
    target = "aie2p" if schedule.device == "npu2" else "aie2"
    include = str(Path(tools["MLIR_AIE_DIR (aie_kernels)"], "include"))
    cmds = [
        [tools["peano clang++"], *PEANO_FLAGS, f"--target={target}-none-unknown-elf", "-I", include,
         *kernel_defines(obj, schedule, config), "-c", str(kernel_source(obj, target, tools)), "-o", obj]
        for obj in schedule.kernels
        if obj.endswith(".o")
    ]  # fmt: skip
    peano = str(Path(tools["peano clang++"]).parents[1])
    cmds.append(["aiecc.py", "--aie-generate-xclbin", "--no-compile-host", "--no-xchesscc", "--no-xbridge",
                 "--peano", peano, f"--xclbin-name={XCLBIN}", "--aie-generate-npu-insts",
                 f"--npu-insts-name={INSTS}", "aie.mlir"])  # fmt: skip
    return cmds


def compile_design(folder: Path, schedule, tools: dict, config: ModelConfig) -> str:
    """Build the xclbin and instruction file in ``folder``; returns a status line."""
    with open(folder / "aie.mlir", "w") as f:
        subprocess.run([sys.executable, "design.py"], cwd=folder, stdout=f, check=True)
    for cmd in build_commands(schedule, tools, config):
        subprocess.run(cmd, cwd=folder, check=True)
    return f"compiled: {XCLBIN} + {INSTS}"


def _config(spec: str) -> ModelConfig:
    """A preset's config, or the config of a model ``workbench.load`` opens (a .gguf path, an HF folder)."""
    try:
        return preset(spec) if spec.lower() in PRESETS or not Path(spec).exists() else load(spec).config
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3-270m", type=_config,
                    help="model config preset (gemma3-270m ... gemma3-27b) or a model path")  # fmt: skip
    ap.add_argument("--device", default="npu1", choices=["npu1", "hawkpoint", "npu2"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "int8"])
    ap.add_argument(
        "--prompt-tokens", type=int, nargs="+", default=[64], help="prefill rows to build designs for"
    )
    ap.add_argument(
        "--max-keys",
        type=int,
        default=None,
        help="attention designs up to this many keys (default: the sliding window)",
    )
    ap.add_argument("--out", default=str(HERE / "build"), help="output folder")
    ap.add_argument("--golden", action="store_true", help="write the golden designs to mlir/golden instead")
    ap.add_argument("--require-compile", action="store_true", help="fail when the toolchain is absent")
    args = ap.parse_args(argv)

    if args.golden:
        out = HERE / "golden"
        out.mkdir(exist_ok=True)
        for s in golden_schedules():
            (out / f"{design_name(s)}.py").write_text(design_source(s))
        print(f"wrote {len(golden_schedules())} golden designs to {out}")
        return 0
    config = args.model
    schedules = model_schedules(config, args.device, args.dtype, args.prompt_tokens, args.max_keys)
    tools = toolchain()
    missing = [k for k, v in tools.items() if not v]
    out = Path(args.out)
    manifest = {
        "model": config.name,
        "device": args.device,
        "dtype": args.dtype,
        "toolchain": tools,
        "designs": [],
    }
    for s in schedules:
        art = artifacts(s, out)
        folder = art.folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "design.py").write_text(design_source(s))
        art.schedule_json.write_text(json.dumps(schedule_record(s), indent=1))
        over = channel_violations(s, get_array(args.device))  # static DMA channel check of the design
        if over:
            status = "compile FAILED: DMA channels over the tiles' limits: " + "; ".join(over)
        elif missing:
            status = "generated only: mlir-aie toolchain absent (" + ", ".join(missing) + ")"
        else:
            try:
                status = compile_design(folder, s, tools, config)
            except (subprocess.CalledProcessError, OSError, ValueError) as e:
                status = f"compile FAILED: {e}"
        manifest["designs"].append(
            {
                "name": art.name,
                "folder": str(folder),
                "status": status,
                "dma_channels_over_limits": over,
            }
        )
        print(f"{art.name}: {status}")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    failed = [d for d in manifest["designs"] if d["status"].startswith("compile FAILED")]
    if missing:
        print(
            f"\nmlir-aie toolchain not found ({', '.join(missing)}): {len(schedules)} designs generated in {out}, "
            "none compiled. Install mlir-aie from its GitHub release wheels and set PEANO_INSTALL_DIR and "
            "MLIR_AIE_DIR (a tree with aie_kernels/ and include/) to build xclbins.",
            file=sys.stderr,
        )
        return 1 if failed else 2 if args.require_compile else 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
