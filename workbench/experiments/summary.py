"""Tables generated from the records under ``experiments/``, never typed: ``summary.md`` of each question
folder, the index of the questions (``experiments/README.md``) and the results table of the project's
README (between :data:`README_BEGIN` and :data:`README_END`).

A question folder is a folder of ``experiments/`` with a hand-written ``notes.md`` (its heading is the
question). It holds run records (``<id>/run.json`` folders as ``workbench`` writes them, or their
``run.json`` copied flat as ``<id>.json``), ``--json`` outputs of ``bench``, ``bench-batch`` and ``eval``
(where no record was kept), and a sweep's ``summary.csv``. ``workbench runs summary`` and ``workbench runs
readme`` write the files; ``tests/test_summaries.py`` checks that the committed ones equal what they give.
"""

from __future__ import annotations

import csv
import json
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .records import SCHEMA, SWEEP_DIRS, experiments_dir

NOTES = "notes.md"
SUMMARY = "summary.md"
INDEX = "README.md"
README_BEGIN = "<!-- results:begin -->"
README_END = "<!-- results:end -->"
SUBCOMMANDS = ("bench-batch", "bench", "speculate", "eval", "generate", "placement", "serve", "sweep")
BACKEND_ORDER = ("numpy", "cpu", "vulkan", "npu")


@dataclass
class Entry:
    """One measured run of a question folder, as its summary shows it."""

    file: str  # relative to the question folder
    kind: str  # bench, bench-batch, speculate, eval, generate, sweep point
    source: str  # record (workbench.run/1), output (a command's --json), sweep (a sweep's summary.csv)
    created: str = ""  # ISO date and time, "" when unknown
    commit: str = ""  # short commit, "+dirty" with uncommitted changes; "" when unknown
    model: str = ""
    synthetic: bool = False
    params: int = 0  # the model's parameter count where known (orders the README's rows)
    backend: str = ""
    device: str = ""
    prefill_tok_s: float | None = None
    decode_tok_s: float | None = None
    vs_llama_prefill: float | None = None
    vs_llama_decode: float | None = None
    bound: float | None = None  # decode tok/s over the bound of the weights' (and KV cache's) bytes
    bound_how: str = ""  # measured (the host's bandwidth at the time) or projected (a published bandwidth)
    how: str = ""  # measured / emulated / projected (+ synthetic weights)
    settings: str = ""  # the command line past the columns above, or the variant
    result: str = ""  # the kind's own figures (batch ratio, speculative speedup, perplexity ...)
    default: bool = True  # the backend's default settings: eligible for the README's table
    run_id: str = ""  # the record's id (an output names the record it came with, if any)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def date(self) -> str:
        return self.created[:16].replace("T", " ")


# -- labels ---------------------------------------------------------------------------------------------


def commit_label(env: dict[str, Any] | None) -> str:
    """``abc1234`` or ``abc1234+dirty`` from a record's environment; "" where it names none."""
    git = (env or {}).get("git") or {}
    commit = git.get("commit") if isinstance(git, dict) else None
    if not commit:
        return ""
    return commit[:7] + ("+dirty" if git.get("dirty") else "")


def driver_label(env: dict[str, Any] | None) -> str:
    drv = (env or {}).get("driver")
    if not isinstance(drv, dict):
        return ""
    if drv.get("api") == "vulkan":
        return f"{drv.get('driver_name') or 'driver'} {drv.get('driver_info') or drv.get('driver_version')}".strip()
    api = str(drv.get("api") or "")
    return "" if api == "none" else api  # an emulator: no driver


def model_name(name: Any) -> str:
    """``gemma3-270m`` from a registry name, a display name (``Gemma 3 270m``) or a GGUF path."""
    text = str(name or "")
    m = re.fullmatch(r"Gemma 3 (\S+)", text)
    if m:
        return f"gemma3-{m.group(1).lower()}"
    m = re.search(r"gemma-?3-(\d+[mb])", Path(text).name.lower()) if "/" in text else None
    return f"gemma3-{m.group(1)}" if m else text


def _size(model: str) -> float:
    m = re.search(r"(\d+(?:\.\d+)?)([mb])\b", model.lower())
    return float(m.group(1)) * (1e6 if m.group(2) == "m" else 1e9) if m else 0.0


EMULATOR_WALL = "host wall time of the emulator"


def how_label(how: str) -> str:
    """measured / emulated / projected (the first word of a record's ``how``), and synthetic weights. A run
    on an emulator (the NPU backend without an NPU) measured the host running it, not the device."""
    if "(emulator)" in how:
        return EMULATOR_WALL + (", synthetic weights" if "synthetic" in how else "")
    word = next((w for w in ("measured", "emulated", "projected", "modeled") if how.startswith(w)), "")
    if not word:
        word = next((w for w in ("emulated", "projected", "measured") if w in how), how.split(" ")[0])
    return word + (", synthetic weights" if "synthetic" in how else "")


def device_label(rec: dict[str, Any]) -> str:
    """The device without its backend prefix, with what tells machines of one name apart: a CPU's LLVM
    microarchitecture and threads, a GPU's driver."""
    name = str(rec.get("device") or "")
    backend = str(rec.get("backend") or "")
    if backend and name.startswith(backend + ":"):
        name = name[len(backend) + 1 :]
    env = rec.get("environment") or {}
    dev = env.get("device") if isinstance(env.get("device"), dict) else {}
    cpu = env.get("cpu_info") if isinstance(env.get("cpu_info"), dict) else {}
    extra = []
    if dev.get("kind") == "cpu" or (not dev and backend in ("cpu", "numpy")):
        llvm = dev.get("llvm_cpu") or cpu.get("llvm_cpu")
        threads = env.get("threads") or dev.get("threads")
        extra = [str(llvm)] if llvm else []
        if threads:
            extra.append(f"{threads} threads")
    else:
        drv = driver_label(env)
        if drv:
            extra.append(drv)
    return name + (f" ({', '.join(extra)})" if extra else "")


def command_label(command: str) -> str:
    """The command from its subcommand on, less what other columns say (backend, model) and what does not
    change the run (``--json``, a llama.cpp binary's path)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    start = next((i for i, w in enumerate(words) if w in SUBCOMMANDS), None)
    if start is None:
        return ""
    out, skip = [], False
    for w in words[start:]:
        if skip:
            skip = False
            continue
        if w in ("--backend", "-m", "--model", "--llama-cpp"):
            skip = True
            continue
        if w == "--json" or w.startswith(("--backend=", "--model=", "--llama-cpp=")):
            continue
        out.append(w)
    return " ".join(out)


def _median(x: Any) -> float | None:
    if isinstance(x, dict):
        x = x.get("median", x.get("ratio"))
    return float(x) if isinstance(x, int | float) else None


# -- reading a folder -------------------------------------------------------------------------------------


def _date_of(*names: str) -> str:
    for n in names:
        m = re.search(r"(20\d\d)(\d\d)(\d\d)(?:-(\d\d)(\d\d)(\d\d))?", n or "")
        if m:
            y, mo, d, h, mi, s = m.groups()
            return f"{y}-{mo}-{d}" + (f"T{h}:{mi}:{s}" if h else "")
    return ""


def _bench(e: Entry, res: dict[str, Any], rec: dict[str, Any]) -> None:
    e.prefill_tok_s, e.decode_tok_s = _median(res.get("prefill_tok_s")), _median(res.get("decode_tok_s"))
    vs = res.get("vs_llama_cpp") or {}
    e.vs_llama_prefill, e.vs_llama_decode = _median(vs.get("prefill_ratio")), _median(vs.get("decode_ratio"))
    bb = (res.get("ours") or {}).get("bandwidth_bound")
    dev_bw = (res.get("ours") or {}).get("device_bandwidth") or {}
    proj = (res.get("profile") or {}).get("decode_projections") or {}
    if proj.get("share") is not None:
        e.extra["projection_share"] = proj["share"]
    if isinstance(bb, dict) and _median(bb.get("fraction")) is not None:
        e.bound, e.bound_how = _median(bb.get("fraction")), "measured"
    elif dev_bw.get("best_gbs") and e.decode_tok_s and (rec.get("model") or {}).get("weights_bytes"):
        # the GPU's streaming read measured in the same benchmark (workbench.backends.vulkan.bandwidth)
        e.bound = e.decode_tok_s * rec["model"]["weights_bytes"] / (dev_bw["best_gbs"] * 1e9)
        e.bound_how = "measured"
    elif not e.how.startswith(EMULATOR_WALL):  # an emulator's speed is not the device's: no bound
        e.bound, e.bound_how = _projected_bound(e.decode_tok_s, rec)
    llama = res.get("llama_cpp") or {}
    if llama:
        engine = llama.get("engine") or {}
        if engine:
            build = (
                f"{engine.get('kind') or 'llama.cpp'} {engine.get('build') or engine.get('build_info') or ''}"
            )
        else:  # the in-process comparison through llama-cpp-python
            build = f"llama-cpp-python {llama['version']}" if llama.get("version") else ""
        build = build.strip()
        e.result = f"llama.cpp {_num(_median(llama.get('prefill_tok_s')))} / {_num(_median(llama.get('decode_tok_s')))} tok/s"
        e.result += f" ({build})" if build else ""
    depth = res.get("depth") or 0
    if depth:
        e.default = False


def _projected_bound(decode: float | None, rec: dict[str, Any]) -> tuple[float | None, str]:
    """decode tok/s x the weights' bytes / the published bandwidth of the record's device profile."""
    env = rec.get("environment") or {}
    dev = env.get("device") if isinstance(env.get("device"), dict) else {}
    model = rec.get("model") if isinstance(rec.get("model"), dict) else {}
    key, weights = dev.get("profile"), model.get("weights_bytes")
    if not (decode and key and weights) or key == "host":
        return None, ""
    from ..instrument.devices import PUBLISHED

    prof = PUBLISHED.get(key)
    if prof is None or not prof.mem_bw:
        return None, ""
    return decode * weights / prof.mem_bw, "projected"


def _batch(e: Entry, res: dict[str, Any]) -> None:
    rows = [r for r in res.get("decode") or [] if isinstance(r, dict)]
    if not rows:
        return
    one = next((r for r in rows if r.get("batch") == 1), rows[0])
    top = max(rows, key=lambda r: r.get("batch", 0))
    e.decode_tok_s = _median(one.get("decode_tok_s"))
    ratio = _median(top.get("vs_batch1"))
    e.result = f"batch {top.get('batch')}: {_num(_median(top.get('decode_tok_s')))} tok/s"
    e.result += f", {ratio:.2f}x batch 1" if ratio else ""
    bound = one.get("bound_tok_s")  # the bound of batch 1, as the decode column
    if bound and e.decode_tok_s:
        e.bound, e.bound_how = e.decode_tok_s / bound, "projected"


def _speculate(e: Entry, res: dict[str, Any]) -> None:
    e.decode_tok_s = _median(res.get("speculative_decode_tok_s"))
    speedup, plain = _median(res.get("decode_speedup")), _median(res.get("plain_decode_tok_s"))
    parts = []
    if speedup:
        parts.append(f"{speedup:.2f}x plain greedy ({_num(plain)} tok/s)")
    if res.get("acceptance_rate") is not None:
        parts.append(f"acceptance {100 * res['acceptance_rate']:.1f}%")
    if "identical" in res:
        parts.append("outputs identical" if res["identical"] else "OUTPUTS DIFFER")
    e.result = "; ".join(parts)


def _eval(e: Entry, out: dict[str, Any]) -> None:
    acc, speed = out.get("accuracy") or {}, out.get("speed") or {}
    parts = []
    if acc.get("perplexity") is not None:
        ppl, ref = acc["perplexity"], acc.get("perplexity_ref")
        parts.append(f"ppl {ppl:.2f}" + (f" vs {ref:.2f} ({100 * (ppl / ref - 1):+.1f}%)" if ref else ""))
    if acc.get("kl_mean") is not None:
        parts.append(f"KL {acc['kl_mean']:.3g}")
    if acc.get("top1_agreement") is not None:
        parts.append(f"top-1 {acc['top1_agreement']:.3f}")
    if speed.get("decode_ratio"):
        parts.append(f"decode {speed['decode_ratio']:.2f}x unmodified")
    for key, label in (("ffn_speedup", "FFN"), ("attn_speedup", "attention"), ("nm_speedup", "N:M ops")):
        if speed.get(key):
            parts.append(f"{label} {speed[key]:.2f}x")
    e.decode_tok_s = speed.get("decode_tok_s")
    e.result = ", ".join(parts)


def entry_of_record(rec: dict[str, Any], rel: str) -> Entry:
    env = rec.get("environment") or {}
    model = rec.get("model")
    minfo = model if isinstance(model, dict) else {}
    name = minfo.get("name", model if isinstance(model, str) else "")
    config = rec.get("config") if isinstance(rec.get("config"), dict) else {}
    e = Entry(
        file=rel, kind=str(rec.get("kind") or ""), source="record", created=str(rec.get("created") or ""),
        commit=commit_label(env), model=model_name(name), backend=str(rec.get("backend") or ""),
        synthetic="synthetic" in str(name) or minfo.get("kind") == "synthetic", params=int(minfo.get("params") or 0),
        device=device_label(rec), how=how_label(str(rec.get("how") or "")),
        settings=command_label(str(rec.get("command") or "")), run_id=str(rec.get("run_id") or ""),
    )  # fmt: skip
    tuned = ((env.get("device") or {}) if isinstance(env.get("device"), dict) else {}).get(
        "tuned_shapes"
    ) or {}
    if tuned.get("used"):  # per-shape parameters `workbench tune` found on that device
        e.how += f", tuned ({tuned['used']} shapes)"
    res = rec.get("results") or {}
    if e.kind == "bench":
        _bench(e, res, rec)
        e.default = e.default and not config.get("backend_options") and "--tune" not in e.settings.split()
        if env.get("overrides") and e.backend == "cpu":  # cpu kernels forced (instrument.environment.OVERRIDES)
            e.default = False
            e.how += ", " + ", ".join(f"{k}={v}" for k, v in sorted(env["overrides"].items()))
    elif e.kind == "bench-batch":
        _batch(e, res)
    elif e.kind == "speculate":
        _speculate(e, res)
    elif e.kind == "generate":
        e.prefill_tok_s, e.decode_tok_s = _median(res.get("prefill_tok_s")), _median(res.get("decode_tok_s"))
    elif e.kind in ("eval", "notebook"):
        _eval(e, res if e.kind == "eval" else {"accuracy": rec.get("metrics") or {}})
    return e


def entry_of_output(out: dict[str, Any], rel: str) -> Entry | None:
    """An entry from a command's ``--json`` output (bench, bench-batch, eval); None for other JSON."""
    record = str(out.get("record") or "")
    base = dict(file=rel, source="output", created=_date_of(Path(record).name, Path(rel).name),
                backend=str(out.get("backend") or ""), how=how_label(str(out.get("how") or "")),
                run_id=Path(record).name)  # fmt: skip
    config = out.get("config") if isinstance(out.get("config"), dict) else {}
    name = config.get("model") or out.get("model") or ""
    base.update(model=model_name(name), synthetic=bool(out.get("synthetic")) or "synthetic" in str(name))
    rec = {"device": out.get("device"), "backend": out.get("backend")}
    if isinstance(out.get("decode"), list):
        e = Entry(kind="bench-batch", device=device_label(rec), **base)
        _batch(e, out)
        rows = [r for r in out["decode"] if isinstance(r, dict)]
        if rows:  # the command is not in an output: what its rows say of it
            sizes = ",".join(str(r.get("batch")) for r in rows)
            e.settings = f"bench-batch --batch-sizes {sizes} -p {rows[0].get('prompt_tokens')} -g {rows[0].get('gen_tokens')}"
    elif "prefill_tok_s" in out and "ours" in out:
        e = Entry(kind="bench", device=device_label(rec), **base)
        _bench(e, out, {})
        # an output names its command and commit since they were added to bench's --json; before that its
        # settings are unknown, so it is never taken for a default run
        e.settings = command_label(str(out.get("command") or ""))
        e.default = e.default and bool(out.get("command")) and "--tune" not in e.settings.split()
        e.commit = commit_label({"git": out.get("git")})
    elif "accuracy" in out or "speed" in out:
        e = Entry(kind="eval", device=device_label(rec), **base)
        variant = {k: v for k, v in (out.get("variant") or {}).items() if v not in (None, "native", "")}
        threads = config.get("threads")
        e.settings = " ".join(f"{k}={v}" for k, v in variant.items()) + (
            f" threads={threads}" if threads else ""
        )
        _eval(e, out)
    else:
        return None
    return e


def _csv_number(row: dict[str, str], key: str) -> float | None:
    try:
        return float(row[key])
    except (KeyError, TypeError, ValueError):
        return None


SWEEP_FIGURES = (  # summary.csv column, label, format, suffix
    ("KL mean", "KL", ".3g", ""),
    ("top-1 agree", "top-1", ".3f", ""),
    ("tok/s ratio", "decode", ".2f", "x unmodified"),
    ("FFN speedup", "FFN", ".2f", "x"),
)


def _sweep_entries(folder: Path) -> list[Entry]:
    """A sweep's points from its ``summary.csv`` (the points' own records stay local, in ``results/``)."""
    try:
        sweep = json.loads((folder / "sweep.json").read_text())
        with (folder / "summary.csv").open(newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, ValueError):
        return []
    fixed = sweep.get("fixed") or {}
    model = fixed.get("model") or _notebook_default(folder, str(sweep.get("notebook") or ""), "model")
    shown = "".join(f" {k}={v}" for k, v in fixed.items() if k in ("threads", "quant") and v != "native")
    out = []
    for row in rows:
        first = next(iter(row))
        e = Entry(
            file="summary.csv",
            kind="sweep point",
            source="sweep",
            created=str(sweep.get("updated") or ""),
            model=model_name(model),
            backend=str(fixed.get("backend") or ""),
            how="measured",
            settings=f"{first}={row[first]}{shown}",
            decode_tok_s=_csv_number(row, "decode tok/s"),
        )
        parts = []
        ppl, ref = _csv_number(row, "perplexity"), _csv_number(row, "native ppl")
        if ppl is not None:
            parts.append(f"ppl {ppl:.2f}" + (f" vs {ref:.2f} ({100 * (ppl / ref - 1):+.1f}%)" if ref else ""))
        for key, label, fmt, suffix in SWEEP_FIGURES:
            v = _csv_number(row, key)
            if v is not None:
                parts.append(f"{label} {v:{fmt}}{suffix}")
        if row.get("state") and row["state"] != "done":
            parts.append(row["state"])
        e.result = ", ".join(parts)
        out.append(e)
    return out


def _notebook_default(folder: Path, notebook: str, name: str) -> str:
    """A parameter's default in a sweep's notebook (its ``parameters`` cell), "" if it cannot be read."""
    for path in (folder.parent.parent / "notebooks" / Path(notebook).name, Path(notebook)):
        try:
            cells = json.loads(path.read_text())["cells"]
        except (OSError, ValueError, KeyError):
            continue
        for cell in cells:
            if "parameters" in (cell.get("metadata") or {}).get("tags", []):
                m = re.search(rf"^{name}\s*=\s*[\"']([^\"']*)[\"']", "".join(cell.get("source", "")), re.M)
                if m:
                    return m.group(1)
    return ""


DROPPED = "dropped-"  # the name prefix of a question folder's runs of changes that were reverted


def iter_json(folder: Path):
    """(relative name, parsed JSON) of every record folder and JSON file of ``folder``; a sweep's working
    folders and hidden files are skipped."""
    for p in sorted(folder.iterdir()):
        if p.name.startswith(".") or p.name in SWEEP_DIRS:
            continue
        target = p / "run.json" if p.is_dir() else p
        if p.suffix != ".json" and not p.is_dir():
            continue
        try:
            yield p.name, json.loads(target.read_text())
        except (OSError, ValueError):
            continue


def load_entries(folder: str | Path) -> list[Entry]:
    """Every run of a question folder, oldest first; an output that came with a record of the folder is
    left out (the record has all it has)."""
    folder = Path(folder)
    records, outputs = [], []
    for rel, data in iter_json(folder):
        if not isinstance(data, dict):
            continue
        if data.get("schema") == SCHEMA:
            records.append(entry_of_record(data, rel))
        else:
            e = entry_of_output(data, rel)
            if e is not None:
                outputs.append(e)
    ids = {e.run_id for e in records}
    entries = records + [e for e in outputs if not e.run_id or e.run_id not in ids] + _sweep_entries(folder)
    # a run of a change that was dropped (its files named dropped-*) is evidence, not a result
    for e in entries:
        e.default = e.default and not e.file.startswith(DROPPED)
    return sorted(entries, key=lambda e: (e.created, e.file))


def other_files(folder: Path, entries: list[Entry]) -> list[str]:
    """Files of the folder that no entry reads, less the sweep's working folders and its HTML report (both
    regenerated, not versioned: a fresh clone has none)."""
    used = {e.file for e in entries} | {NOTES, SUMMARY, "sweep.json", "report.html"}
    return [p.name for p in sorted(folder.iterdir()) if not p.name.startswith(".") and p.name not in used
            and p.name not in SWEEP_DIRS]  # fmt: skip


def question_folders(root: str | Path | None = None) -> list[Path]:
    base = experiments_dir(root)
    if not base.is_dir():
        return []
    return sorted(d for d in base.iterdir() if d.is_dir() and (d / NOTES).is_file())


def question_of(folder: Path) -> tuple[str, str]:
    """The question (the heading of ``notes.md``) and its first paragraph."""
    try:
        lines = (folder / NOTES).read_text().splitlines()
    except OSError:
        return folder.name, ""
    title = next((ln.lstrip("# ").strip() for ln in lines if ln.startswith("# ")), folder.name)
    para, started = [], False
    for ln in lines:
        if ln.startswith("#"):
            if started:
                break
            continue
        if not ln.strip():
            if started:
                break
            continue
        started = True
        para.append(ln.strip())
    return title, " ".join(para)


# -- writing ----------------------------------------------------------------------------------------------


def _num(x: float | None) -> str:
    if x is None:
        return "—"
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.1f}"
    return f"{x:.3g}" if x < 10 else f"{x:.2f}"


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}x"


def _share(e: Entry) -> str:
    if e.bound is None:
        return "—"
    return f"{100 * e.bound:.1f}%" + (" (p)" if e.bound_how == "projected" else "")


def _cell(text: str) -> str:
    return (text or "—").replace("|", "\\|")


def _vs(e: Entry) -> str:
    if e.vs_llama_prefill is None and e.vs_llama_decode is None:
        return "—"
    return f"{_ratio(e.vs_llama_prefill)} / {_ratio(e.vs_llama_decode)}"


def summary_rows(entries: list[Entry]) -> list[list[str]]:
    return [[e.date or "—", e.commit or "—", _cell(e.model), e.backend or "—", _cell(e.device),
             _num(e.prefill_tok_s), _num(e.decode_tok_s), _vs(e), _share(e), _cell(e.how), _cell(e.settings),
             _cell(e.result), f"[{e.file}]({_target(e)})"] for e in entries]  # fmt: skip


def _target(e: Entry) -> str:
    """A record folder's link points at its run.json."""
    return f"{e.file}/run.json" if e.source == "record" and not e.file.endswith(".json") else e.file


SUMMARY_HEADER = ["date", "commit", "model", "backend", "device", "prefill tok/s", "decode tok/s",
                  "vs llama.cpp (prefill / decode)", "decode / bound", "how", "settings", "result", "file"]  # fmt: skip


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


def summary_markdown(folder: str | Path) -> str:
    folder = Path(folder)
    entries = load_entries(folder)
    title, para = question_of(folder)
    kinds = {}
    for e in entries:
        kinds[e.source] = kinds.get(e.source, 0) + 1
    dates = [e.created[:10] for e in entries if e.created]
    counts = ", ".join(f"{n} {({'record': 'run records', 'output': 'command outputs', 'sweep': 'sweep points'})[k]}"
                       for k, n in sorted(kinds.items()))  # fmt: skip
    lines = [
        f"# {folder.name}: {title}",
        "",
        *([para, ""] if para else []),
        f"Generated by `workbench runs summary experiments/{folder.name} --write` from the files of this folder; "
        f"do not edit. What was tried and why, with the figures in context: [{NOTES}]({NOTES}).",
        "",
        f"{len(entries)} runs ({counts or 'none'})" + (f", {min(dates)} to {max(dates)}." if dates else "."),
        "Columns: *decode / bound* is decode tok/s over the bound that the bytes of a token (weights, KV cache) "
        "and the device's bandwidth set: measured bandwidth of the host at the time, or (p) projected from "
        "the published bandwidth and the weights' bytes. *how*: measured on the device named, emulated, or "
        "projected. A commit with `+dirty` ran with uncommitted changes; `—` where the file does not say.",
        "",
        *_table(SUMMARY_HEADER, summary_rows(entries)),
    ]
    others = other_files(folder, entries)
    if others:
        lines += [
            "",
            f"Other files (described in [{NOTES}]({NOTES})): " + ", ".join(f"`{o}`" for o in others) + ".",
        ]
    return "\n".join(lines) + "\n"


def index_markdown(root: str | Path | None = None) -> str:
    base = experiments_dir(root)
    rows = []
    for folder in question_folders(base):
        entries = load_entries(folder)
        dates = [e.created[:10] for e in entries if e.created]
        title, _ = question_of(folder)
        span = f"{min(dates)} to {max(dates)}" if dates else "—"
        rows.append([f"[{folder.name}/]({folder.name}/)", _cell(title), str(len(entries)), span,
                     f"[summary]({folder.name}/{SUMMARY}), [notes]({folder.name}/{NOTES})"])  # fmt: skip
    lines = [
        "# experiments",
        "",
        "Results of the workbench, one folder per question. Each holds the run records (`<id>/run.json`, or "
        "the `run.json` copied as `<id>.json`; every record names its commit, package versions, CPU, device and "
        "driver) and command outputs that answer it, a generated `summary.md` (one row per run) and a "
        "hand-written `notes.md` (what was tried, and the figures in context). Runs of changes that were "
        "reverted keep names starting `dropped-`: evidence in the summaries, never a row of the README's results "
        "or the ops page.",
        "",
        "Generated by `workbench runs summary --write` (every folder's `summary.md` and this index); do not edit.",
        "",
        *_table(["folder", "question", "runs", "dates", "files"], rows),
        "",
        "Also here: `grids/` (the sweep grids of `workbench sweep`), `runs/` (the records every command writes "
        "on this machine; not versioned: copy the ones a question needs into its folder), and the folders "
        "`workbench sweep --name NAME` creates. `workbench runs --in FOLDER` lists a folder's records, "
        "`workbench runs summary FOLDER` prints its table (`--json` for the rows), and `workbench runs readme "
        "--write` rebuilds the README's results table from these folders.",
    ]
    return "\n".join(lines) + "\n"


# -- the README's table -----------------------------------------------------------------------------------


def _rank(e: Entry) -> tuple:
    """Which of two runs the README's table shows: one compared with llama.cpp, then the later."""
    return (e.vs_llama_decode is not None, e.created, e.file)


def readme_entries(root: str | Path | None = None) -> list[Entry]:
    """The latest ``bench`` run at default settings for each backend x model, over every question folder;
    a run compared with llama.cpp before one that was not (the table's ratio column). Runs of dropped
    changes (files named ``dropped-*``) are not taken: the code they measured is gone; nor are runs whose
    environment forced the kernels (``environment.overrides``)."""
    best: dict[tuple[str, str], tuple[Entry, str]] = {}
    for folder in question_folders(root):
        for e in load_entries(folder):
            if e.kind != "bench" or not e.default or e.decode_tok_s is None:
                continue
            key = (e.backend, e.model)
            if key not in best or _rank(e) > _rank(best[key][0]):
                best[key] = (e, folder.name)
    out = []
    for e, folder in best.values():
        e.extra["folder"] = folder
        out.append(e)

    def order(e: Entry) -> tuple:
        b = BACKEND_ORDER.index(e.backend) if e.backend in BACKEND_ORDER else len(BACKEND_ORDER)
        return (b, e.synthetic, e.params or _size(e.model), e.model)

    return sorted(out, key=order)


README_HEADER = ["backend", "model", "prefill tok/s", "decode tok/s", "vs llama.cpp (prefill / decode)",
                 "decode / bound", "decode projections / read", "device", "how", "date", "commit", "record"]  # fmt: skip


def _projection_share(e: Entry) -> str:
    share = e.extra.get("projection_share")
    return "—" if share is None else f"{100 * share:.0f}%"


def readme_table(root: str | Path | None = None) -> str:
    rows = []
    for e in readme_entries(root):
        link = f"[{e.extra['folder']}/{e.file}](experiments/{e.extra['folder']}/{_target(e)})"
        rows.append([e.backend, _cell(e.model), _num(e.prefill_tok_s), _num(e.decode_tok_s), _vs(e), _share(e),
                     _projection_share(e), _cell(e.device), _cell(e.how), e.date[:10] or "—", e.commit or "—", link])  # fmt: skip
    lines = [
        README_BEGIN,
        "<!-- generated by `workbench runs readme --write` from the records under experiments/; do not edit -->",
        "",
        *_table(README_HEADER, rows),
        "",
        "One row per backend x model: the latest `workbench bench` run at default settings in "
        "[experiments/](experiments/README.md). *decode / bound*: decode tok/s over what the bytes of a token "
        "and the bandwidth allow (bandwidth measured in the same benchmark: the host's streaming read, or "
        "the GPU's by `shaders/stream_read.comp`; (p): projected from the published bandwidth). *decode "
        "projections / read*: the GB/s of the profiled decode step's projections over the GPU's measured "
        "streaming read. *tuned (N shapes)*: the backend applied the per-shape kernel parameters that "
        "`workbench tune` found on that device. `+dirty`: run with uncommitted changes; `—`: not recorded.",
        README_END,
    ]
    return "\n".join(lines)


def replace_readme_table(text: str, table: str) -> str:
    """``text`` with the part between the markers (markers included) replaced by ``table``."""
    start, end = text.find(README_BEGIN), text.find(README_END)
    if start < 0 or end < start:
        raise ValueError(f"the README has no {README_BEGIN} ... {README_END} markers")
    return text[:start] + table + text[end + len(README_END) :]


def readme_path(root: str | Path | None = None) -> Path:
    return experiments_dir(root).resolve().parent / "README.md"


def entry_dicts(entries: list[Entry]) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in asdict(e).items() if k != "extra"} | {"date": e.date, **e.extra} for e in entries
    ]
