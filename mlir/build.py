#!/usr/bin/env python
"""Generate the IRON designs of a model's NPU schedules and, where mlir-aie is installed, compile them.

    python mlir/build.py                          # gemma3-270m, npu1, bf16 -> mlir/build/<design>/design.py
    python mlir/build.py --model gemma3-1b --device npu2 --dtype int8
    python mlir/build.py --golden                 # rewrite mlir/golden/ (the designs tests compare against)

Compiling follows mlir-aie's example Makefiles: the design prints MLIR (``aie.mlir``), the kernels compile
with Peano's clang (``--target=aie2-none-unknown-elf``, tile sizes as -D defines), and ``aiecc.py`` links
``final.xclbin`` + ``insts.bin``. Without the toolchain nothing is compiled and the manifest says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from workbench.backends.npu.iron import design_name, design_source, golden_schedules, model_schedules  # noqa: E402
from workbench.models.config import preset  # noqa: E402

KERNEL_SOURCES = {  # object file -> (source, relative to mlir-aie's aie_kernels/<arch> or mlir/kernels)
    "mm": "mm.cc",
    "mv": "mv.cc",
    "rms_norm": "rms_norm.cc",
    "mul": "mul.cc",
    "softmax": "softmax.cc",
    "attention": "attention.cc",
}


def toolchain() -> dict:
    """What of mlir-aie's toolchain is here: aiecc.py, the `aie` Python package, Peano's clang."""
    found = {"aiecc.py": shutil.which("aiecc.py")}
    try:
        import aie  # noqa: F401

        found["aie (IRON)"] = "importable"
    except ImportError:
        found["aie (IRON)"] = None
    peano = os.environ.get("PEANO_INSTALL_DIR")
    clang = Path(peano, "bin", "clang++") if peano else None
    found["peano clang++"] = str(clang) if clang and clang.exists() else None
    return found


def compile_design(folder: Path, schedule, tools: dict) -> str:
    """Build ``final.xclbin`` + ``insts.bin`` in ``folder``; returns a status line."""
    with open(folder / "aie.mlir", "w") as f:
        subprocess.run([sys.executable, "design.py"], cwd=folder, stdout=f, check=True)
    target = "aie2p" if schedule.device == "npu2" else "aie2"
    kernel_dir = Path(os.environ.get("MLIR_AIE_DIR", "")) / "aie_kernels" / target
    defines = [f"-D{k.upper()}={v}" for k, v in schedule.tile.items() if k in ("m", "k", "n", "r", "s", "t")]
    defines += [f"-DDIM_{k.upper()}={v}" for k, v in schedule.tile.items() if k in ("m", "k", "n")]
    objects = [k for k in schedule.kernels if k.endswith(".o")]
    for obj in objects:
        stem = obj.split("_")[0].removesuffix(".o")
        src = (
            HERE / "kernels" / KERNEL_SOURCES[stem]
            if stem == "attention"
            else kernel_dir / KERNEL_SOURCES[stem]
        )
        cmd = [tools["peano clang++"], "-O2", "-std=c++20", f"--target={target}-none-unknown-elf", *defines,
               "-c", str(src), "-o", str(folder / obj)]  # fmt: skip
        subprocess.run(cmd, cwd=folder, check=True)
    subprocess.run(
        [
            "aiecc.py",
            "--aie-generate-xclbin",
            "--no-compile-host",
            "--xclbin-name=final.xclbin",
            "--aie-generate-npu-insts",
            "--npu-insts-name=insts.bin",
            "aie.mlir",
        ],
        cwd=folder,
        check=True,
    )
    return "compiled: final.xclbin + insts.bin"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3-270m", help="model config preset (gemma3-270m ... gemma3-27b)")
    ap.add_argument("--device", default="npu1", choices=["npu1", "hawkpoint", "npu2"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "int8"])
    ap.add_argument("--prompt-tokens", type=int, default=64, help="prefill shape to build designs for")
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
    schedules = model_schedules(preset(args.model), args.device, args.dtype, args.prompt_tokens)
    tools = toolchain()
    missing = [k for k, v in tools.items() if not v]
    out = Path(args.out)
    manifest = {
        "model": args.model,
        "device": args.device,
        "dtype": args.dtype,
        "toolchain": tools,
        "designs": [],
    }
    for s in schedules:
        folder = out / design_name(s)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "design.py").write_text(design_source(s))
        (folder / "schedule.json").write_text(json.dumps(s.to_dict(), indent=1, default=list))
        if missing:
            status = "generated only: mlir-aie toolchain absent (" + ", ".join(missing) + ")"
        else:
            try:
                status = compile_design(folder, s, tools)
            except (subprocess.CalledProcessError, OSError) as e:
                status = f"compile FAILED: {e}"
        manifest["designs"].append({"name": design_name(s), "folder": str(folder), "status": status})
        print(f"{design_name(s)}: {status}")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    if missing:
        print(
            f"\nmlir-aie toolchain not found ({', '.join(missing)}): {len(schedules)} designs generated in {out}, "
            "none compiled. Install mlir-aie from its GitHub release wheels and set PEANO_INSTALL_DIR and "
            "MLIR_AIE_DIR to build xclbins.",
            file=sys.stderr,
        )
        return 2 if args.require_compile else 0
    failed = [d for d in manifest["designs"] if d["status"].startswith("compile FAILED")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
