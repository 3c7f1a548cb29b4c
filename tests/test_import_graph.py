"""No import cycles in ``workbench``: every import between its modules, at the top of a module or inside a
function, goes one way.

The graph is read from the source with ``ast``, never by importing. Relative imports are resolved;
``from .x import y`` counts as importing ``x.y`` when ``y`` is a submodule, else ``x``; ``from . import y``
inside package ``p`` imports ``p.y`` (or ``p`` for a name ``p`` defines); importing a package means
importing its ``__init__``. Imports under ``if TYPE_CHECKING:`` never run and do not count; the implicit
import of a module's parent packages does not count either (a package importing its submodules is fine).
"""

from __future__ import annotations

import ast
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (importer, imported) edges left in place for now, each with the reason: the goal is none. An entry that
# no longer matches an import fails test_allowed_edges_still_exist, so the list only shrinks.
ALLOWED: dict[tuple[str, str], str] = {}


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` (a folder under ``root``)."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _import_nodes(node: ast.AST):
    """Every import statement under ``node`` (any depth), except in the body of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if _is_type_checking(child):
            for other in child.orelse:
                yield from _import_nodes(ast.Module(body=[other], type_ignores=[]))
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        yield from _import_nodes(child)


def import_graph(root: Path, package: str) -> dict[str, dict[str, int]]:
    """module -> {module it imports: line of the first such import}, within ``package``."""
    modules = module_files(root, package)

    def owner(name: str) -> str | None:
        """The module ``name`` refers to: itself, or the closest package above it that exists."""
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                targets = [
                    f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names
                ]
            for target in targets:
                if target == package or target.startswith(package + "."):
                    found = owner(target)
                    if found and found != name:
                        edges.setdefault(found, node.lineno)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    steps = [f"{a} (line {graph[a][b]})" for a, b in pairwise(cycle)]
    return " -> ".join([*steps, cycle[-1]])


def test_workbench_has_no_import_cycle():
    graph = import_graph(ROOT, "workbench")
    for importer, imported in ALLOWED:
        graph.get(importer, {}).pop(imported, None)
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {describe(cycle, graph)}"


def test_allowed_edges_still_exist():
    graph = import_graph(ROOT, "workbench")
    stale = [edge for edge in ALLOWED if edge[1] not in graph.get(edge[0], {})]
    assert not stale, f"remove these from ALLOWED, the imports are gone: {stale}"


def test_the_check_finds_cycles_through_function_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("from .sub import b\n\ndef f():\n    return b.g()\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .. import a\n\n"
        "def g():\n    from ..a import f\n    return f\n"
    )
    graph = import_graph(tmp_path, "pkg")
    assert graph == {"pkg": {"pkg.a": 1}, "pkg.a": {"pkg.sub.b": 1}, "pkg.sub": {}, "pkg.sub.b": {"pkg.a": 7}}
    cycle = find_cycle(graph)
    assert cycle == ["pkg.a", "pkg.sub.b", "pkg.a"]
    assert describe(cycle, graph) == "pkg.a (line 1) -> pkg.sub.b (line 7) -> pkg.a"
    del graph["pkg.sub.b"]["pkg.a"]
    assert find_cycle(graph) is None
