"""IRON designs generated from schedules: golden files, valid Python, and the IRON calls they make
(run against workbench.backends.npu.channels' recording stand-in for mlir-aie's ``aie.iron``, since
mlir-aie is not installed here)."""

from __future__ import annotations

import ast
import json
import re
import types
from pathlib import Path

import numpy as np
import pytest
from npu_helpers import build_module, dma_walk

from workbench.backends.npu.arch import get_array
from workbench.backends.npu.channels import DesignGraph, trace_design
from workbench.backends.npu.iron import design_name, design_source, golden_schedules, model_schedules
from workbench.backends.npu.schedule import MM_EXPAND, gemv_schedule, plan_rowwise
from workbench.models.config import preset

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "mlir" / "golden"
RNG = np.random.default_rng(0)


def test_golden_designs_are_current():
    for s in golden_schedules():
        path = GOLDEN / f"{design_name(s)}.py"
        assert path.exists(), f"missing golden design {path.name}: run python mlir/build.py --golden"
        assert path.read_text() == design_source(s), f"{path.name} differs: run python mlir/build.py --golden"


def test_designs_are_python_with_the_schedule_inside():
    for s in golden_schedules() + model_schedules(preset("gemma3-270m"), "npu2", "int8", 16):
        src = design_source(s)
        tree = ast.parse(src)
        imports = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert {"ObjectFifo", "Worker", "Runtime", "Program", "Kernel"} <= imports
        sched = json.loads(src.split("SCHEDULE = ", 1)[1].split("\n", 1)[0])
        assert sched["tile"] == dict(s.tile) and sched["columns"] == s.columns and sched["rows"] == s.rows


def _run_design(s) -> DesignGraph:
    """The generated design of ``s`` run against the recording stand-in for IRON (the one the DMA channel
    check uses): what it declared, filled and drained."""
    return trace_design(design_source(s))


@pytest.mark.parametrize("index", range(len(golden_schedules())))
def test_design_calls_iron_as_the_schedule_says(index):
    s = golden_schedules()[index]
    rec = _run_design(s)
    assert len(rec.workers) == min(s.columns * s.rows, s.notes.get("work_items", s.columns * s.rows))
    assert len(set(rec.workers)) == len(rec.workers)  # one core per worker
    a = get_array(s.device)
    assert all(c < a.columns and 2 <= r < 2 + a.rows for c, r in rec.workers)
    assert rec.fills and rec.drains
    names = {k.name for k in rec.kernels}
    assert set(k for k in s.kernels if not k.endswith(".o")) <= names


def _extern_c_signatures(source: Path) -> dict[str, list[str]]:
    """``name -> parameter list`` of the functions a kernel source defines inside ``extern "C"``."""
    body = source.read_text().split('extern "C" {', 1)[1]
    sigs = re.findall(r"^void (\w+)\(([^)]*)\)", body, re.MULTILINE)
    return {name: [a.strip() for a in args.split(",") if a.strip()] for name, args in sigs}


@pytest.mark.parametrize("device,dtype", [("npu1", "bf16"), ("npu2", "int8")])
def test_our_kernels_define_what_the_designs_call(device, dtype):
    """Every kernel a design declares from mlir/kernels exists there with that many parameters."""
    build = build_module()
    checked = set()
    for s in model_schedules(preset("gemma3-270m"), device, dtype, 64) + golden_schedules():
        for k in _run_design(s).kernels:
            src = build.kernel_source(k.obj, "aie2", FAKE_TOOLS)
            if src.parent != ROOT / "mlir" / "kernels":
                continue
            sigs = _extern_c_signatures(src)
            assert k.name in sigs, f"{k.name} is not defined in {src.name}"
            assert len(sigs[k.name]) == len(k.arg_types), (k.name, sigs[k.name], k.arg_types)
            checked.add(k.name)
    assert {"gemv_bf16_f32", "gemv_zero_f32", "rmsnorm_bf16", "attn_chunk_bf16"} <= checked
    assert {"zero_i32", "matmul_i8_i32", "matmul_srs_i8_i16"} <= checked  # the int8 GEMMs (goldens too)


@pytest.mark.parametrize("m,k", [(16, 8), (64, 640), (32, 2048)])
def test_gemv_dma_pattern_delivers_the_layout_gemv_cc_indexes(m, k):
    """bf16 GEMV designs call mlir/kernels/gemv.cc (mv.cc's bf16 combo is commented out). The memory
    tile's W_L2L1 pattern turns a row-major m x k tile into the layout the kernel indexes: (i, j) at
    (j // 2) * 2m + 2i + j % 2 (test_npu_kernels_host runs the kernel itself on it)."""
    s = gemv_schedule(get_array("npu1"), 4 * m, k, "bf16", m, k, 1, 4)
    assert s.kernels == ("gemv_bf16_f32", "gemv_zero_f32", f"gemv_{m}x{k}.o")
    w = RNG.standard_normal((m, k))
    local = dma_walk(w, next(f for f in s.fifos if f.name == "W_L2L1").dims)
    i, j = np.meshgrid(np.arange(m), np.arange(k), indexing="ij")
    assert np.array_equal(local[(j // 2) * 2 * m + 2 * i + j % 2], w)


def test_rmsnorm_kernel_takes_its_length_from_the_schedule():
    """mlir/kernels/rmsnorm.cc: no fixed length (mul.cc's 1024 overran rows of 640); rows, length and
    epsilon come in as defines matching the schedule and the model config."""
    src = (ROOT / "mlir" / "kernels" / "rmsnorm.cc").read_text()
    code = re.sub(r"//.*", "", src)
    assert "1024" not in code and "NORM_LEN" in code and "NORM_ROWS" in code and "NORM_EPS" in code
    assert "accfloat" in code  # fp32 accumulation of the bf16 squares
    build = build_module()
    cfg = preset("gemma3-270m")
    for R, L in ((1, 640), (64, 640), (256, 256), (64 * 4, 256)):
        s = plan_rowwise(get_array("npu1"), "rmsnorm", R, L)
        obj = s.kernels[1]
        assert build.kernel_defines(obj, s, cfg) == [
            f"-DNORM_ROWS={s.tile['rows_per_call']}", f"-DNORM_LEN={L}", f"-DNORM_EPS={cfg.rms_eps!r}f"
        ]  # fmt: skip
        assert f"rows_per_call = {s.tile['rows_per_call']}" in design_source(s)
        assert f"R, L = {R}, {L}" in design_source(s)


@pytest.mark.parametrize("share", ["q", "kv"])
def test_attention_design_fills_every_work_item_once(share):
    s = next(g for g in golden_schedules() if g.op == "attention" and g.notes["share"] == share)
    units = s.notes["units"]  # a column's cores share the query tile (q) or the K|V stream (kv)
    assert units * s.rows == s.notes["work_items"]
    rec = _run_design(s)
    assert len(rec.drains) == units and len({tap[-1] for tap in rec.drains}) == units
    assert len(rec.fills) == 2 * units  # the unit's query tile(s) and K|V chunks, alternating
    q_fills, kv_fills = rec.fills[0::2], rec.fills[1::2]
    rounds = units // s.notes["groups"]  # share q: rounds of key splits per group
    q_index = [i // rounds for i in range(units)] if share == "q" else list(range(units))
    assert [tap[-1] for tap in q_fills] == q_index
    heads = {tap[-1] for tap in kv_fills}
    assert heads == set(range(s.problem["n_kv_heads"] * (rounds if share == "q" else 1)))
    kernels = {k.name: k for k in rec.kernels}
    assert len(kernels["attn_chunk_bf16"].arg_types) == 3  # q (+ positions), K|V chunk (+ positions), state


def test_build_script_generates_and_says_nothing_compiled(tmp_path, capsys):
    build = build_module()
    if all(build.toolchain().values()):
        pytest.skip("mlir-aie toolchain present: this test checks its absence")
    assert build.main(["--out", str(tmp_path), "--model", "gemma3-270m"]) == 0
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["designs"] and all(d["status"].startswith("generated only") for d in manifest["designs"])
    assert all(
        d["dma_channels_over_limits"] == [] for d in manifest["designs"]
    )  # the static channel check ran
    assert not list(tmp_path.rglob("*.xclbin"))
    assert "none compiled" in capsys.readouterr().err
    assert build.main(["--out", str(tmp_path), "--require-compile"]) == 2


FAKE_TOOLS = {
    "aiecc.py": "/opt/mlir-aie/bin/aiecc.py",
    "aie (IRON)": "importable",
    "peano clang++": "/opt/peano/bin/clang++",
    "MLIR_AIE_DIR (aie_kernels)": "/opt/mlir-aie",
}


@pytest.mark.parametrize("device,dtype", [("npu1", "bf16"), ("npu2", "int8")])
def test_build_commands_follow_mlir_aie_makefiles(device, dtype):
    """Each kernel compiles from its real source with mlir-aie's defines (no single-letter macros, which
    would clash with the kernels' template parameters), and aiecc.py links with Peano, not Chess."""
    build = build_module()
    cfg = preset("gemma3-270m")
    for s in model_schedules(cfg, device, dtype, 16):
        *kernels, link = build.build_commands(s, FAKE_TOOLS, cfg)
        assert [c[-1] for c in kernels] == [k for k in s.kernels if k.endswith(".o")]
        for cmd in kernels:
            src = Path(cmd[cmd.index("-c") + 1])
            target = "aie2p" if device == "npu2" else "aie2"
            assert f"--target={target}-none-unknown-elf" in cmd and "/opt/mlir-aie/include" in cmd
            assert src.name in build.KERNEL_SOURCES.values()
            if src.stem in build.OURS:
                assert src.parent == ROOT / "mlir" / "kernels" and src.exists()
            else:
                assert src.parent == Path("/opt/mlir-aie/aie_kernels", target)
            if src.name == "attention.cc":
                p = s.problem
                group = p["n_heads"] // p["n_kv_heads"]
                assert {
                    f"-DROWS={s.tile['q_tile'] * group}",
                    f"-DGROUP={group}",
                    f"-DHEAD_DIM={p['head_dim']}",
                    f"-DCHUNK={s.tile['kv_chunk']}",
                    f"-DWINDOW={p['window']}",
                    f"-DSCALE={cfg.attn_scale!r}f",
                } <= set(cmd)
            if src.name == "rmsnorm.cc":
                assert f"-DNORM_LEN={s.problem['L']}" in cmd and f"-DNORM_EPS={cfg.rms_eps!r}f" in cmd
            defines = [a for a in cmd if a.startswith("-D") and a != "-DNDEBUG"]
            assert all(len(d.split("=")[0]) > 3 for d in defines), defines
            if src.name == "mm.cc":
                t = s.tile
                want = {f"-DDIM_M={t['m']}", f"-DDIM_K={t['k']}", f"-DDIM_N={t['n']}",
                        f"-D{s.dtype_in}_{s.dtype_out}_ONLY", "-DB_COL_MAJ"}  # fmt: skip
                assert set(defines) == want
            if (
                src.name == "mm_i8.cc"
            ):  # ours for int8: int32 partials over K, MAC tile and expansion as planned
                t = s.tile
                em, en = MM_EXPAND[get_array(device).generation, "i8"]
                assert defines == [f"-DDIM_M={t['m']}", f"-DDIM_K={t['k']}", f"-DDIM_N={t['n']}",
                                   f"-DMMUL_R={t['r']}", f"-DMMUL_S={t['s']}", f"-DMMUL_T={t['t']}",
                                   f"-DEXPAND_M={em}", f"-DEXPAND_N={en}"]  # fmt: skip
            assert (src.name == "mm_i8.cc") == (s.op == "gemm" and s.dtype_in == "i8")
            if src.name in ("mv.cc", "gemv.cc"):
                assert set(defines) == {f"-DDIM_M={s.tile['m']}", f"-DDIM_K={s.tile['k']}"}
                # mv.cc's bf16 combination is commented out: bf16 GEMVs build gemv.cc, i16 ones mv.cc
                assert (src.name == "gemv.cc") == (s.dtype_in == "bf16")
        assert link[0] == "aiecc.py" and {"--no-xchesscc", "--no-xbridge"} <= set(link)
        assert link[link.index("--peano") + 1] == "/opt/peano" and link[-1] == "aie.mlir"


def test_build_with_a_toolchain_runs_every_design_step(tmp_path, monkeypatch):
    """With a (stand-in) toolchain, main() runs design.py, the kernel compiles and aiecc.py per design."""
    build = build_module()
    ran = []

    def fake_run(cmd, cwd=None, check=False, stdout=None, **kw):
        ran.append((Path(cwd).name, cmd))
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(build, "toolchain", lambda: dict(FAKE_TOOLS))
    monkeypatch.setattr(build.subprocess, "run", fake_run)
    assert build.main(["--out", str(tmp_path), "--prompt-tokens", "16"]) == 0
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["designs"] and all(d["status"].startswith("compiled") for d in manifest["designs"])
    for d in manifest["designs"]:
        steps = [cmd for folder, cmd in ran if folder == d["name"]]
        assert steps[0][1] == "design.py" and steps[-1][0] == "aiecc.py" and len(steps) >= 3


def test_build_rejects_unknown_models_and_kernels(capsys):
    build = build_module()
    with pytest.raises(SystemExit):
        build.main(["--model", "gemma9"])
    assert "unknown model config 'gemma9'" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"no kernel source known for conv_3x3\.o"):
        build.kernel_source("conv_3x3.o", "aie2", FAKE_TOOLS)
