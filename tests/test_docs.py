"""The docs stay true to the code: docs/ops.md is what the generator writes now, every relative link and
anchor in docs/*.md resolves, every docs/ page the code cites exists, and each backend page names every
tunable of its backend."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workbench import docs_ops

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`[^`\n]*`")
CITED = re.compile(r"docs/([A-Za-z0-9_./-]+\.md)(#[A-Za-z0-9_-]+)?")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = CODE.sub(lambda m: m.group(0).strip("`"), heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    out, fence = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"#{1,6}\s+(.*)", line)):
            out.add(_anchor(m.group(1)))
    return out


def test_docs_exist():
    names = {p.name for p in PAGES}
    wanted = {"architecture.md", "ops.md", "notebooks.md"}
    wanted |= {f"backend-{b}.md" for b in ("numpy", "cpu", "vulkan", "npu")}
    assert wanted <= names, f"missing docs pages: {sorted(wanted - names)}"


def test_ops_page_is_up_to_date():
    assert (DOCS / "ops.md").read_text() == docs_ops.render(), (
        f"docs/ops.md is out of date: run `{docs_ops.COMMAND}`"
    )


def test_op_measurements_skip_runs_of_dropped_changes(tmp_path, monkeypatch):
    """The ops page cites the latest record of a question folder, but never one named dropped-* (a run of a
    change that was reverted), however recent; a run with backend options names them."""
    import json

    import pandas as pd

    for name, created in (
        ("20261127-100000-bench-aaaaaaaa", "2026-11-27"),
        ("dropped-20261128-1-bench-b", "2026-11-28"),
    ):
        d = tmp_path / "experiments" / "q" / name
        d.mkdir(parents=True)
        run = {"model": {"name": "m"}, "device": "vulkan:GPU", "created": created,
               "config": {"backend_options": {"tune": "x=1"}}}  # fmt: skip
        (d / "run.json").write_text(json.dumps(run))
        ops = {
            "kind": ["some_kind"],
            "backend": ["vulkan"],
            "phase": ["prefill"],
            "time_s": [1e-3],
            "device_s": [1e-3],
        }
        pd.DataFrame(ops).to_parquet(d / "ops.parquet")
    monkeypatch.setattr(docs_ops, "ROOT", tmp_path)
    monkeypatch.setattr(docs_ops, "EXPERIMENTS", tmp_path / "experiments")
    cell = docs_ops.latest_measurements()["some_kind"]["vulkan"]
    assert "20261127-100000-bench-aaaaaaaa" in cell and "dropped" not in cell
    assert "--tune x=1" in cell  # a run away from the default settings says so


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path):
    text = CODE.sub("", page.read_text())  # links inside code spans are not links
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    assert not broken, f"{page.name}: broken links: {broken}"


def test_docs_cited_by_the_code_exist():
    """Code, shaders, tests and scripts that point at docs/ point at a page (and heading) that exists."""
    broken = []
    for folder in ("workbench", "shaders", "tests", "scripts", "mlir", "notebooks"):
        for f in sorted((ROOT / folder).rglob("*")):
            if f.suffix not in (".py", ".comp", ".glsl", ".ipynb", ".cc", ".md") or not f.is_file():
                continue
            for m in CITED.finditer(f.read_text(errors="replace")):
                page, anchor = DOCS / m.group(1), (m.group(2) or "")[1:]
                if not page.exists():
                    broken.append(f"{f.relative_to(ROOT)}: docs/{m.group(1)}")
                elif anchor and anchor not in _anchors(page):
                    broken.append(f"{f.relative_to(ROOT)}: docs/{m.group(1)}#{anchor}")
    assert not broken, f"citations of missing docs pages or headings: {broken}"


def test_no_citation_of_design_notes_outside_the_repository():
    hits = [
        f"{f.relative_to(ROOT)}"
        for folder in ("workbench", "shaders", "tests", "scripts", "notebooks")
        for f in sorted((ROOT / folder).rglob("*"))
        if f.is_file() and f.suffix in (".py", ".comp", ".glsl", ".ipynb") and f.name != Path(__file__).name
        and "DESIGN.md" in f.read_text(errors="replace")
    ]  # fmt: skip
    assert not hits, f"DESIGN.md is not part of this repository; cite docs/ instead: {hits}"


def _tunables() -> dict[str, tuple[str, ...]]:
    from workbench.backends.npu import NpuBackend
    from workbench.backends.numba_cpu import CpuBackend
    from workbench.backends.vulkan.backend import VulkanBackend

    return {
        "backend-cpu.md": CpuBackend.tunable_names,
        "backend-vulkan.md": VulkanBackend.tunable_names,
        "backend-npu.md": NpuBackend.tunable_names,
    }


@pytest.mark.parametrize("page", ["backend-cpu.md", "backend-vulkan.md", "backend-npu.md"])
def test_backend_pages_name_every_tunable(page: str):
    text = (DOCS / page).read_text()
    missing = [name for name in _tunables()[page] if f"`{name}`" not in text]
    assert not missing, f"docs/{page} does not describe the tunables {missing}"
