"""``docs/ops.md``: every op kind and what executes it on each backend, generated from the code.

    python -m workbench.docs_ops            # rewrite docs/ops.md
    python -m workbench.docs_ops --check    # exit 1 (and say so) when docs/ops.md is out of date

Nothing here is typed by hand: the op kinds come from :data:`workbench.ops.kinds.KINDS` (with the fused and
sparse kinds registered), the reference from what the numpy backend's handler calls, the cpu column from
its handler table and the modules those handlers reach, the Vulkan column from the dispatches
``Builder.emit`` records for each kind (read from its source), the NPU column from the schedules the
``npu`` backend plans for the default model, and the tests from the test files that name the kind.
``tests/test_docs.py`` fails when the page differs from what this module writes.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import inspect
import re
import sys
import textwrap
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .experiments.summary import DROPPED

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ops.md"
COMMAND = "python -m workbench.docs_ops"


# -- helpers ----------------------------------------------------------------------------------------------
def _rel(path: str | Path) -> str:
    """``path`` relative to the repository root, with forward slashes."""
    return Path(path).resolve().relative_to(ROOT).as_posix()


def _link(path: str | Path, text: str | None = None) -> str:
    rel = _rel(path)
    return f"[{text or Path(rel).name}](../{rel})"


def _source_tree(func: Callable) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(func)))


def _plain(func):
    """The Python function behind a numba dispatcher (or ``func`` itself)."""
    return getattr(func, "py_func", func)


def _reached_modules(func: Callable, cls: type | None, package: str, depth: int = 8) -> set[str]:
    """Modules of ``package`` whose functions ``func`` calls, following calls into functions of ``package``
    (and into methods of ``cls`` called on ``b.``/``self.``) up to ``depth`` levels."""
    seen: set[int] = set()
    found: set[str] = set()

    def visit(f: Callable, level: int) -> None:
        f = _plain(f)
        if id(f) in seen or level > depth or not inspect.isfunction(f):
            return
        seen.add(id(f))
        try:
            tree = _source_tree(f)
        except (OSError, TypeError):
            return
        glb = f.__globals__
        for node in ast.walk(tree):
            target = None
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                owner = glb.get(node.value.id)
                if isinstance(owner, types.ModuleType):
                    if owner.__name__.startswith(package):
                        found.add(owner.__name__)
                    target = getattr(owner, node.attr, None)
                elif cls is not None and node.value.id in ("b", "self"):
                    target = getattr(cls, node.attr, None)
            elif isinstance(node, ast.Name):
                target = glb.get(node.id)
            if target is None or isinstance(target, (types.ModuleType, type)):
                continue
            mod = getattr(_plain(target), "__module__", "") or ""
            if mod.startswith(package) and callable(target):
                found.add(mod)
                visit(target, level + 1)

    visit(func, 0)
    return found


def _module_file(name: str) -> Path:
    return Path(sys.modules[name].__file__)


# -- op kinds ---------------------------------------------------------------------------------------------
def op_kinds() -> dict[str, str]:
    """Every registered op kind -> its one-line description: the model's kinds in their order, then the fused
    kinds, then the others (sparse) by name, whatever order the modules registering them were imported in."""
    from .ops import fusion  # (registers the fused kinds)
    from .ops.kinds import KINDS
    from .sparsity import attention, ffn  # noqa: F401 (register the sparse kinds)

    fused = list(fusion.FUSED_KINDS)

    def order(item: tuple[int, str]) -> tuple:
        index, name = item
        if name in fused:
            return (1, fused.index(name), "")
        base = KINDS[name].cost.__module__ == "workbench.ops.kinds"
        return (0, index, "") if base else (2, 0, name)

    names = [n for _, n in sorted(enumerate(KINDS), key=order)]
    return {n: KINDS[n].doc for n in names}


def _fake_op(kind: str):
    from .ops.fusion import FUSED_KINDS
    from .ops.graph import Op

    return Op("x", kind, (), (), attrs={"parts": ()} if kind in FUSED_KINDS else {})


# -- reference (numpy) ------------------------------------------------------------------------------------
def reference(kind: str) -> str:
    """What defines the kind: the functions of ``ops/reference.py`` or ``sparsity/`` the numpy backend's
    handler calls, else the handler itself; a fused kind is its parts in order."""
    from .backends import numpy_ref
    from .ops.fusion import FUSED_KINDS

    handler = numpy_ref.KERNELS.get(kind)
    if handler is None:
        if kind in FUSED_KINDS:
            return f"its parts in order ({_link(ROOT / 'workbench/ops/fusion.py')})"
        return "—"
    calls = []
    for node in ast.walk(_source_tree(handler)):
        if isinstance(node, ast.Call):
            f = node.func
            obj = None
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                mod = handler.__globals__.get(f.value.id)
                obj = getattr(mod, f.attr, None) if isinstance(mod, types.ModuleType) else None
            elif isinstance(f, ast.Name):
                obj = handler.__globals__.get(f.id)
            mod_name = getattr(obj, "__module__", "") or ""
            if inspect.isfunction(obj) and mod_name.startswith(
                ("workbench.ops.reference", "workbench.sparsity")
            ):
                calls.append(f"`{obj.__name__}` in {_link(inspect.getfile(obj))}")
    if not calls:
        return f"`{handler.__name__}` in {_link(inspect.getfile(handler))}"
    return "; ".join(dict.fromkeys(calls))


# -- cpu --------------------------------------------------------------------------------------------------
def cpu(kind: str) -> str:
    from .backends import numba_cpu
    from .backends.numba_cpu import instructions, program

    handler = numba_cpu.HANDLERS.get(kind)
    if handler is None:
        return "—"
    package = "workbench.backends.numba_cpu"
    mods = _reached_modules(handler, numba_cpu.CpuBackend, package) - {package}
    files = ", ".join(_link(_module_file(m)) for m in sorted(mods))
    text = f"`{handler.__name__}` in {_link(inspect.getfile(handler))}" + (f" → {files}" if files else "")
    if kind in instructions.LOWERED:
        text += (
            f"; one-token steps: {_link(inspect.getfile(instructions))} → {_link(inspect.getfile(program))}"
        )
    return text


# -- vulkan -----------------------------------------------------------------------------------------------
def _kinds_in_test(test: ast.AST) -> set[str]:
    """The op kinds a branch condition of ``Builder.emit`` compares ``k`` with (``k == "x"``, ``k in (...)``)."""
    kinds: set[str] = set()
    for node in ast.walk(test):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "k":
            for comp in node.comparators:
                for c in ast.walk(comp):
                    if isinstance(c, ast.Constant) and isinstance(c.value, str):
                        kinds.add(c.value)
    return kinds


def _gemm_kernels(backend_cls) -> set[str]:
    """The kernels ``VulkanBackend.choose_gemm`` may pick (the prefill GEMM ``Builder.gemm`` dispatches)."""
    out = set()
    for node in ast.walk(_source_tree(backend_cls.choose_gemm)):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple):
            first = node.value.elts[0]
            if isinstance(first, ast.Constant):
                out.add(first.value)
    return out


def vulkan_shaders() -> dict[str, list[str]]:
    """Op kind -> the kernels (``shaders/<name>.comp``) its dispatches use, read from ``Builder.emit`` and the
    builder methods it calls; a kind that ``emit`` runs as its parts maps to ``["<parts>"]``."""
    from .backends.vulkan.backend import VulkanBackend
    from .backends.vulkan.kernels import KERNELS
    from .backends.vulkan.program import Builder

    gemm = _gemm_kernels(VulkanBackend)

    def helper(func: ast.AST, module: Any) -> Callable | None:
        """The module-level function a call names (``mod.f`` or ``f``), if it is one."""
        obj = None
        if isinstance(func, ast.Name):
            obj = getattr(module, func.id, None)
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            obj = getattr(getattr(module, func.value.id, None), func.attr, None)
        return obj if inspect.isfunction(obj) else None

    def kernels_of(body: Iterable[ast.AST], seen: set[str], me: str = "self", module: Any = None) -> set[str]:
        """Kernels of the dispatches ``body`` adds through the builder ``me``: its ``add`` calls, the builder
        methods it calls, and module functions it hands the builder to (``gemma3n.emit(self, op)``)."""
        module = module or inspect.getmodule(Builder)
        out: set[str] = set()
        body = list(body)
        assigned = {  # kernel variables: ``kernel = b.gemm_kernel if ... else "matmul"``
            t.id: n.value
            for stmt in body
            for n in ast.walk(stmt)
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Name)
        }

        def named(arg: ast.AST, depth: int = 0) -> set[str]:
            """The kernels an ``add`` call's kernel argument may name."""
            if isinstance(arg, ast.Constant) and arg.value in KERNELS:
                return {arg.value}
            if isinstance(arg, ast.Attribute) and arg.attr == "gemm_kernel":
                return set(gemm)
            if isinstance(arg, ast.IfExp):
                return named(arg.body, depth) | named(arg.orelse, depth)
            if isinstance(arg, ast.Name) and arg.id in assigned and depth < 3:
                return named(assigned[arg.id], depth + 1)
            return set()

        for stmt in body:
            for node in ast.walk(stmt):
                if not isinstance(node, ast.Call):
                    continue
                if node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == me:
                    fn = helper(node.func, module)
                    if fn is not None and fn.__qualname__ not in seen:
                        tree = _source_tree(fn).body[0]
                        arg = tree.args.args[0].arg  # type: ignore[attr-defined]
                        out |= kernels_of(tree.body, seen | {fn.__qualname__}, arg, inspect.getmodule(fn))  # type: ignore[attr-defined]
                    continue
                if not isinstance(node.func, ast.Attribute):
                    continue
                if not (isinstance(node.func.value, ast.Name) and node.func.value.id == me):
                    continue
                name = node.func.attr
                if name == "add" and len(node.args) > 1:
                    out |= named(node.args[1])
                elif name != "emit" and name not in seen and inspect.isfunction(getattr(Builder, name, None)):
                    out |= kernels_of(_source_tree(getattr(Builder, name)).body, seen | {name}, "self", None)
        return out

    emit = _source_tree(Builder.emit).body[0]
    result: dict[str, list[str]] = {}
    node = next(n for n in ast.walk(emit) if isinstance(n, ast.If))
    while True:
        kinds = _kinds_in_test(node.test)
        if kinds:
            found = kernels_of(node.body, {"emit"})
            for k in kinds:
                result.setdefault(k, [])
                result[k] = sorted(set(result[k]) | found)
        elif any(isinstance(c, ast.Constant) and c.value == "parts" for c in ast.walk(node.test)):
            result["<parts>"] = ["<parts>"]
        if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
            node = node.orelse[0]
        else:
            break
    return result


def vulkan(kind: str, table: dict[str, list[str]], fused: set[str]) -> str:
    from .backends.vulkan.kernels import KERNELS

    def shader_link(k: str) -> str:
        return _link(ROOT / "shaders" / f"{KERNELS[k].shader}.comp")

    own = table.get(kind)
    parts = "<parts>" in table and kind in fused
    if own is None and not parts:
        return "— (refused: `UnsupportedOpError`)"
    text = ", ".join(shader_link(k) for k in own or [])
    if parts:
        text += ("; otherwise " if own else "") + "its parts"
    return text


# -- npu --------------------------------------------------------------------------------------------------
SCHEDULE_KIND = {"gemv": "matmul", "gemm": "matmul", "rmsnorm": "rmsnorm", "attention": "attention"}


def _build_module():
    spec = importlib.util.spec_from_file_location("_workbench_mlir_build", ROOT / "mlir" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    path = list(sys.path)
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = path
    return mod


def npu_designs() -> dict[str, str]:
    """NPU kind -> the designs the backend plans for the default model on npu1 (bf16 and int8): schedule
    op, dtype, kernel sources, and the golden designs of that op."""
    from .backends.npu.iron import model_schedules
    from .models.config import preset

    build = _build_module()
    config = preset("gemma3-270m")
    by_kind: dict[str, dict[tuple[str, str], set[str]]] = {}
    for dtype in ("bf16", "int8"):
        for s in model_schedules(config, "npu1", dtype, 64):
            kind = SCHEDULE_KIND[s.op]
            srcs = by_kind.setdefault(kind, {}).setdefault((s.op, s.dtype_in), set())
            for obj in s.kernels:
                if obj.endswith(".o"):
                    stem = re.sub(r"_\d+(x\d+)*$", "", obj.removesuffix(".o"))
                    srcs.add(stem)
    goldens = sorted((ROOT / "mlir" / "golden").glob("*.py"))
    out = {}
    for kind, designs in by_kind.items():
        parts = []
        for (op, dtype), stems in sorted(designs.items()):
            names = []
            for stem in sorted(stems):
                src = build.KERNEL_SOURCES[stem]
                names.append(
                    _link(ROOT / "mlir" / "kernels" / src) if stem in build.OURS else f"mlir-aie `{src}`"
                )
            parts.append(f"{op} {dtype}: {', '.join(names)}")
        ops = {op for op, _ in designs}
        gold = [_link(g) for g in goldens if g.name.split("_")[0] in ops]
        out[kind] = "; ".join(parts) + (f" (golden: {', '.join(gold)})" if gold else "")
    return out


def npu(kind: str, designs: dict[str, str]) -> str:
    from .backends.npu import NPU_KINDS, NpuBackend

    if kind in NPU_KINDS:
        return designs.get(kind, "NPU (no design planned for the default model)")
    if NpuBackend.op_kernel(None, _fake_op(kind)) is not None:
        return "host (numpy reference)"
    return "—"


# -- latest measurement -----------------------------------------------------------------------------------
EXPERIMENTS = ROOT / "experiments"


def _duration(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def _timing_label(timings: set[str]) -> str:
    """How a group of op rows was timed: ``emulated`` (every row from the NPU emulator's model), else
    measured by device timestamps or by the host's clock."""
    if timings and all(t.startswith("emulated") for t in timings):
        return "emulated"
    return "measured, device timestamps" if timings == {"device"} else "measured, host clock"


def latest_measurements() -> dict[str, dict[str, str]]:
    """Op kind -> backend -> the latest committed run record's per-op time of that kind: the median over the
    record's op rows, decode and prefill apart, with the model, device, date, how it was obtained and a link.

    Records are the ``bench --profile`` folders kept by question (``experiments/<question>/<record>/`` with
    ``run.json`` and ``ops.parquet``); demo runs, ``experiments/runs/`` (every run's own record, not kept in
    git), sweep points and runs of dropped changes (``dropped-*``: their code is gone) are not taken."""
    import json

    import pandas as pd

    latest: dict[tuple[str, str], tuple[str, str]] = {}
    for ops_file in sorted(EXPERIMENTS.glob("*/*/ops.parquet")):
        if (
            ops_file.parts[-3].startswith("demo-")
            or ops_file.parts[-3] == "runs"
            or ops_file.parent.name.startswith(DROPPED)
            or not (ops_file.parent / "run.json").is_file()
        ):
            continue
        run = json.loads((ops_file.parent / "run.json").read_text())
        df = pd.read_parquet(ops_file)
        if df.empty or "kind" not in df:
            continue
        times = df["device_s"].where(df["device_s"].notna(), df["time_s"])
        model = str(run.get("model", {}).get("name", "?")).removeprefix("synthetic:")
        device = str(run.get("device", "?")).split(":", 1)[-1]
        created = str(run.get("created", ""))[:10]
        # a run away from the default settings names its backend options
        options = (run.get("config") or {}).get("backend_options") or {}
        settings = "".join(f", --{k} {v}" for k, v in sorted(options.items()))
        for (kind, backend), rows in df.assign(t=times).groupby(["kind", "backend"]):
            how = _timing_label(set(rows["timing"].astype(str)) if "timing" in rows else set())
            phases = [
                f"{phase} {_duration(float(rows.t[rows.phase == phase].median()))}"
                for phase in ("decode", "prefill")
                if (rows.phase == phase).any()
            ]
            cell = (
                f"{backend}: {', '.join(phases)} per op ({model}, {device}, {created}, {how}{settings}; "
                f"{_link(ops_file.parent, 'record')})"
            )
            if (kind, backend) not in latest or created >= latest[kind, backend][0]:
                latest[kind, backend] = (created, cell)
    out: dict[str, dict[str, str]] = {}
    for (kind, backend), (_, cell) in sorted(latest.items()):
        out.setdefault(kind, {})[backend] = cell
    return out


# -- tests ------------------------------------------------------------------------------------------------
def tests_naming(kind: str) -> list[Path]:
    """Test files that name the kind as an op kind: a name with an underscore as a whole word; a one-word
    name quoted on a line that speaks of kinds (``op.kind == "add"``, ``{"embed", "rope"} == set(kinds)``),
    so that ``git add`` or a shader called ``attention`` does not count."""
    if "_" in kind:
        pattern = re.compile(rf"\b{re.escape(kind)}\b")
    else:
        pattern = re.compile(rf"^(?=.*\bkinds?\b).*[\"']{re.escape(kind)}[\"']", re.MULTILINE)
    return [p for p in sorted((ROOT / "tests").glob("test_*.py")) if pattern.search(p.read_text())]


# -- the page ---------------------------------------------------------------------------------------------
HEADER = f"""\
# Op kinds × backends

<!-- Generated by `{COMMAND}` from the code; do not edit by hand. tests/test_docs.py fails when it is stale. -->

Every op of a step graph has a *kind*; backends execute kinds, never the model
([architecture.md](architecture.md)). For each registered kind: what defines it (the numpy reference),
the cpu backend's handler and the modules it reaches (and whether one-token steps run it inside the
compiled step program), the Vulkan shaders its dispatches use, what the `npu` backend runs (the designs it
plans for the default model on `npu1`, bf16 and int8, with their kernel sources; other kinds run on the
host), and the test files that name the kind as an op kind.

- Fused kinds are graph rewrites ([fusion.py](../workbench/ops/fusion.py)): the cpu and Vulkan backends fuse
  in `prepare_graph`; the numpy backend runs a fused op as its parts; the `npu` backend runs the unfused graph.
- Every kind of the default graph is also covered by whole-model tests against the reference:
  [test_cpu_backend.py](../tests/test_cpu_backend.py), [test_vulkan.py](../tests/test_vulkan.py),
  [test_npu_backend.py](../tests/test_npu_backend.py); numpy against transformers in
  [test_reference_logits.py](../tests/test_reference_logits.py).
- *Latest measurement*: per backend, the median time of one op of the kind in the newest committed run
  record that holds it (`experiments/<question>/<record>/ops.parquet`, written by `workbench bench` with its
  profile on), decode and prefill apart, with the model, device, date and how it was obtained
  (`measured` on a device, `emulated`). Records of different models and devices are not comparable with
  each other; the backend pages and `experiments/*/summary.md` give the figures in context.
"""


def render() -> str:
    kinds = op_kinds()
    from .ops.fusion import FUSED_KINDS

    vk_table = vulkan_shaders()
    designs = npu_designs()
    measured = latest_measurements()
    rows = [
        "| kind | what it computes | reference | cpu | vulkan | npu | tests naming it | latest measurement |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, doc in kinds.items():
        tests = ", ".join(_link(p) for p in tests_naming(kind)) or "—"
        cells = [
            f"`{kind}`",
            doc,
            reference(kind),
            cpu(kind),
            vulkan(kind, vk_table, set(FUSED_KINDS)),
            npu(kind, designs),
            tests,
            "<br>".join(measured.get(kind, {}).values()) or "—",
        ]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return HEADER + "\n" + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check", action="store_true", help="exit 1 if docs/ops.md differs from the generated page"
    )
    ap.add_argument("--out", type=Path, default=DOC, help="where to write (default docs/ops.md)")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{_rel(args.out)} is out of date: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
