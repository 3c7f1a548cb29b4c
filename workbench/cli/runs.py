"""``workbench runs``: list and filter the run records under experiments/; write the summaries built from them.

workbench runs [column=value ...] [--in FOLDER|all]   the records (default: experiments/runs, this machine's)
workbench runs summary [FOLDER ...] [--write]         a question folder's table (summary.md); all: the index too
workbench runs readme [--write | --check]             the README's results table, from every question folder
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ACTIONS = ("summary", "readme")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "runs",
        help="list run records (filter with key=value, e.g. backend=cpu kind=bench); "
        "`runs summary [FOLDER]`, `runs readme`: the tables generated from them",
        description="List the run records (`workbench runs kind=bench backend=cpu`, `--in cpu-decode`), or "
        "generate what is built from the records of experiments/: `workbench runs summary [FOLDER ...] "
        "[--write]` (a question folder's summary.md; with no FOLDER every folder's, plus experiments/README.md) "
        "and `workbench runs readme [--write|--check]` (the README's results table).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "args",
        nargs="*",
        metavar="[summary [FOLDER ...] | readme] [column=value ...]",
        help="filters column=value (nested keys with '.', e.g. model.name=gemma3-270m); or an action: "
        "`summary` (then question folders: names under experiments/ or paths) or `readme`",
    )
    p.add_argument("--dir", default=None, help="experiments folder (default: the checkout's experiments/)")
    p.add_argument(
        "--in",
        dest="group",
        default="runs",
        help="which records to list: runs (this machine's, default), a question folder (cpu-decode, "
        "vulkan-scale, ...; a name under experiments/ or a path), or all (runs and every question folder)",
    )
    p.add_argument("--last", type=int, default=20, help="show the N most recent")
    p.add_argument("--write", action="store_true", help="summary/readme: write the files instead of printing")
    p.add_argument(
        "--check",
        action="store_true",
        help="summary/readme: exit 1 if a written file differs from what is generated",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    words = list(args.args)
    if words and words[0] in ACTIONS:
        action, rest = words[0], words[1:]
        if action == "summary":
            return run_summary(args, rest)
        if rest:
            raise ValueError(f"`workbench runs readme` takes no arguments, got {' '.join(rest)}")
        return run_readme(args)
    return run_list(args, words)


def _groups(args: argparse.Namespace) -> list[tuple[Path | None, str]]:
    """(root, group) pairs for ``load_runs`` from ``--in``."""
    from ..experiments.records import RUNS, experiments_dir
    from ..experiments.summary import question_folders

    base = experiments_dir(args.dir)
    if args.group == "all":
        return [(base, RUNS)] + [(base, f.name) for f in question_folders(base)]
    path = Path(args.group)
    if not (base / args.group).is_dir() and path.is_dir():
        return [(path.resolve().parent, path.resolve().name)]
    if not (base / args.group).is_dir() and args.group != RUNS:
        names = ", ".join(f.name for f in question_folders(base)) or "none"
        raise ValueError(f"no folder {args.group!r} under {base} (question folders: {names}; or all)")
    return [(base, args.group)]


def run_list(args: argparse.Namespace, words: list[str]) -> int:
    import pandas as pd

    from ..experiments.records import load_runs
    from . import emit_json

    filters = {}
    for f in words:
        if "=" not in f:
            raise ValueError(f"filter {f!r} is not column=value (or use `workbench runs summary|readme`)")
        k, v = f.split("=", 1)
        filters[k.replace(".", "__")] = v
    frames = [load_runs(root, group, **filters) for root, group in _groups(args)]
    frames = [df for df in frames if not df.empty]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if not df.empty:
        df = df.sort_values("created").tail(args.last)
    if args.json:
        emit_json({"runs": df.to_dict("records") if not df.empty else []})
        return 0
    if df.empty:
        print("no run records")
        return 0
    cols = [
        c
        for c in (
            "created",
            "run_id",
            "kind",
            "model.name",
            "backend",
            "device",
            "results.prefill_tok_s",
            "results.decode_tok_s",
            "how",
        )
        if c in df.columns
    ]
    print(df[cols].to_string(index=False))
    return 0


def _folder(base: Path, name: str) -> Path:
    for cand in (base / name, Path(name)):
        if cand.is_dir():
            return cand
    raise ValueError(f"no question folder {name!r} (under {base} or as a path)")


def _check_or_write(path: Path, text: str, args: argparse.Namespace, stale: list[str]) -> None:
    old = path.read_text() if path.is_file() else None
    if args.check:
        if old != text:
            stale.append(str(path))
    elif old != text:
        path.write_text(text)
        print(f"wrote {path}", file=sys.stderr)


def run_summary(args: argparse.Namespace, names: list[str]) -> int:
    from ..experiments import summary as S
    from ..experiments.records import experiments_dir
    from . import emit_json

    base = experiments_dir(args.dir)
    folders = [_folder(base, n) for n in names] if names else S.question_folders(base)
    if not folders:
        raise ValueError(f"no question folders under {base} (a question folder holds a notes.md)")
    if args.json:
        emit_json({"folders": [{"folder": str(f), "question": S.question_of(f)[0],
                                "runs": S.entry_dicts(S.load_entries(f))} for f in folders]})  # fmt: skip
        return 0
    if not (args.write or args.check):
        for f in folders:
            print(S.summary_markdown(f))
        return 0
    stale: list[str] = []
    for f in folders:
        _check_or_write(f / S.SUMMARY, S.summary_markdown(f), args, stale)
    if not names:
        _check_or_write(base / S.INDEX, S.index_markdown(base), args, stale)
    if stale:
        print("out of date (run `workbench runs summary --write`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


def run_readme(args: argparse.Namespace) -> int:
    from ..experiments import summary as S
    from . import emit_json

    if args.json:
        emit_json({"results": S.entry_dicts(S.readme_entries(args.dir))})
        return 0
    table = S.readme_table(args.dir)
    if not (args.write or args.check):
        print(table)
        return 0
    path = S.readme_path(args.dir)
    stale: list[str] = []
    _check_or_write(path, S.replace_readme_table(path.read_text(), table), args, stale)
    if stale:
        print(
            f"{path}: the results table is out of date (run `workbench runs readme --write`)", file=sys.stderr
        )
        return 1
    return 0
