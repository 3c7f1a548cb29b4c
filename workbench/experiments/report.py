"""``workbench report``: one self-contained HTML file per experiment (or a comparison of several).

Summary table, the plots that fit the sweep (metric heatmap over two swept parameters, bars over one,
Pareto front of speed vs accuracy, stacked per-device time, per-op time by kind), environment and
provenance, and links to every executed point notebook exported to HTML (inputs hidden).
"""

from __future__ import annotations

import html
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

SPEED_HINTS = ("tok_s", "tokens_per_s", "throughput", "gflops", "gb_s")
ACCURACY_HINTS = ("perplexity", "ppl", "kl", "err", "loss")  # lower is better
AGREEMENT_HINTS = ("agreement", "accuracy", "top1")  # higher is better


class ReportError(ValueError):
    """The experiment cannot be reported (missing folder, no points)."""


@dataclass
class Experiment:
    name: str
    path: Path
    definition: dict[str, Any]
    points: pd.DataFrame  # one row per point: id, state, error, seconds, params..., metrics...
    ops: pd.DataFrame  # op rows of every point that recorded them (column point)
    records: dict[str, dict[str, Any]]

    @property
    def swept(self) -> list[str]:
        return [k for k, v in self.definition.get("grid", {}).items() if len(v) > 1]

    @property
    def metric_names(self) -> list[str]:
        cols = [c for c in self.points.columns if c.startswith("m.")]
        return [c for c in cols if pd.api.types.is_numeric_dtype(self.points[c])]


def load_experiment(path: str | Path) -> Experiment:
    path = Path(path)
    if not (path / "sweep.json").is_file():
        raise ReportError(f"{path} is not an experiment (no sweep.json): run `workbench sweep ... --name NAME`")
    definition = json.loads((path / "sweep.json").read_text())
    rows, ops, records = [], [], {}
    for pdir in sorted((path / "points").glob("*/")):
        try:
            params = json.loads((pdir / "params.json").read_text())
        except (OSError, ValueError):
            continue
        row: dict[str, Any] = {"id": pdir.name, **{f"p.{k}": v for k, v in params.items()}}
        try:
            st = json.loads((pdir / "status.json").read_text())
            row.update(state=st["state"], error=st.get("error", ""), seconds=st.get("seconds"))
        except (OSError, ValueError, KeyError):
            row.update(state="unfinished", error="", seconds=None)
        rec_dir = path / "results" / pdir.name
        try:
            rec = json.loads((rec_dir / "run.json").read_text())
            records[pdir.name] = rec
            row.update({f"m.{k}": v for k, v in rec.get("metrics", {}).items() if not isinstance(v, dict | list)})
            if (rec_dir / "ops.parquet").is_file():
                df = pd.read_parquet(rec_dir / "ops.parquet")
                df["point"] = pdir.name
                ops.append(df)
        except (OSError, ValueError):
            if row["state"] == "done":
                row["error"] = "finished without recording results (no record_result call)"
        rows.append(row)
    if not rows:
        raise ReportError(f"experiment {path.name} has no points yet: run its sweep first")
    points = pd.DataFrame(rows)
    return Experiment(path.name, path, definition, points, pd.concat(ops) if ops else pd.DataFrame(), records)


def _label(points: pd.DataFrame, swept: list[str]) -> pd.Series:
    if not swept:
        return points["id"]
    return points[[f"p.{s}" for s in swept]].astype(str).agg(", ".join, axis=1)


def pareto_front(df: pd.DataFrame, speed: str, cost: str) -> pd.DataFrame:
    """Points not dominated by any other: higher ``speed`` and lower ``cost`` are better."""
    d = df[[speed, cost]].dropna().sort_values([speed, cost], ascending=[False, True])
    keep, best = [], float("inf")
    for idx, c in zip(d.index, d[cost], strict=True):
        if c < best:
            keep.append(idx)
            best = c
    return df.loc[keep]


def _figures(exps: list[Experiment]) -> list[tuple[str, Any]]:
    import plotly.express as px
    import plotly.graph_objects as go

    figs: list[tuple[str, Any]] = []
    pts = pd.concat([e.points.assign(experiment=e.name) for e in exps], ignore_index=True)
    done = pts[pts["state"] == "done"]
    swept = sorted({s for e in exps for s in e.swept})
    metrics = sorted({m for e in exps for m in e.metric_names})
    if done.empty or not metrics:
        return figs
    speed = next((m for m in metrics if any(h in m for h in SPEED_HINTS)), metrics[0])
    if len(swept) >= 2 and len(exps) == 1:
        a, b = f"p.{swept[0]}", f"p.{swept[1]}"
        pivot = done.pivot_table(index=a, columns=b, values=speed, aggfunc="median")
        fig = go.Figure(go.Heatmap(z=pivot.values, x=[str(c) for c in pivot.columns], y=[str(i) for i in pivot.index],
                                   colorbar={"title": speed[2:]}, texttemplate="%{z:.3g}"))  # fmt: skip
        fig.update_layout(title=f"{speed[2:]} over {swept[0]} x {swept[1]}", xaxis_title=swept[1], yaxis_title=swept[0])
        figs.append(("heatmap", fig))
    label = _label(done, swept)
    for m in metrics:
        fig = px.bar(done.assign(point=label), x="point", y=m, color="experiment", barmode="group",
                     title=m[2:], labels={m: m[2:]})  # fmt: skip
        figs.append((f"bar {m}", fig))
    cost = next((m for h in ACCURACY_HINTS for m in metrics if h in m), None)  # perplexity before KL, errors
    if cost and cost != speed:
        d = done.assign(point=label)
        by = "p.backend" if d.get("p.backend", pd.Series(dtype=object)).nunique() > 1 else "experiment"
        fig = px.scatter(d, x=cost, y=speed, color=by, hover_name="point", title=f"Pareto: {speed[2:]} vs {cost[2:]}")
        for key, part in d.groupby(by):  # one front per backend (or experiment)
            front = pareto_front(part, speed, cost)
            fig.add_trace(go.Scatter(x=front[cost], y=front[speed], mode="lines+markers", name=f"Pareto front {key}"))
        figs.append(("pareto", fig))
    dev_cols = [m for m in metrics if m.startswith("m.time_s.")]
    if dev_cols:
        d = done.assign(point=label).melt(id_vars=["point", "experiment"], value_vars=dev_cols, var_name="device", value_name="s")
        d["device"] = d["device"].str.removeprefix("m.time_s.")
        figs.append(("per-device time", px.bar(d, x="point", y="s", color="device", title="time per device per strategy")))
    op_frames = [e.ops.assign(experiment=e.name) for e in exps if not e.ops.empty]
    ops = pd.concat(op_frames, ignore_index=True) if op_frames else pd.DataFrame()
    if not ops.empty and {"kind", "host_s"} <= set(ops.columns):
        names = dict(zip(pts["id"], _label(pts, swept), strict=True))
        by = ops.groupby(["point", "kind"], as_index=False)["host_s"].sum()
        by["point"] = by["point"].map(names)
        by["ms"] = by["host_s"] * 1e3
        figs.append(("ops", px.bar(by, x="point", y="ms", color="kind", title="time per op kind (profiled run, ms)")))
    return figs


def _export_points(exp: Experiment, out_dir: Path) -> dict[str, str]:
    """Each executed point notebook as HTML without inputs; returns id -> relative link."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(exclude_input=True)
    links = {}
    out_dir.mkdir(parents=True, exist_ok=True)
    for pid in exp.points["id"]:
        nb = exp.path / "points" / pid / "notebook.ipynb"
        if not nb.is_file():
            continue
        target = out_dir / f"{pid}.html"
        try:
            body, _ = exporter.from_filename(str(nb))
        except Exception as e:  # a half-written notebook of a killed point
            body = f"<p>could not export {html.escape(str(nb))}: {html.escape(str(e))}</p>"
        target.write_text(body, encoding="utf-8")
        links[pid] = f"{out_dir.name}/{pid}.html"
    return links


def provenance_table(exp: Experiment) -> pd.DataFrame:
    from .summary import commit_label, driver_label

    rows = []
    for pid, rec in exp.records.items():
        env = rec.get("environment") or {}
        packages = env.get("packages") if isinstance(env.get("packages"), dict) else {}
        rows.append({
            "point": pid, "how": rec.get("how", "?"), "backend": rec.get("backend", "?"), "device": rec.get("device", "?"),
            "cpu": env.get("cpu", ""), "git": commit_label(env), "driver": driver_label(env),
            "workbench": env.get("workbench", ""), "numpy": packages.get("numpy") or "",
        })  # fmt: skip
    return pd.DataFrame(rows)


def write_report(paths: list[str | Path], out: str | Path | None = None, export_points: bool = True) -> Path:
    """Write the report of one experiment, or a comparison of several; returns the HTML path."""
    if not paths:
        raise ReportError("give at least one experiment folder")
    exps = [load_experiment(p) for p in paths]
    first = exps[0]
    out = Path(out) if out else (first.path / "report.html" if len(exps) == 1 else first.path.parent / ("compare-" + "-".join(e.name for e in exps) + ".html"))
    parts = [f"<h1>{'Comparison: ' if len(exps) > 1 else 'Experiment '}{html.escape(', '.join(e.name for e in exps))}</h1>",
             f"<p>written {time.strftime('%Y-%m-%d %H:%M:%S')} by workbench report</p>"]  # fmt: skip
    for exp in exps:
        counts = exp.points["state"].value_counts().to_dict()
        parts.append(f"<h2>{html.escape(exp.name)}</h2><p>notebook <code>{html.escape(Path(exp.definition.get('notebook', '?')).name)}</code>; "
                     f"grid {html.escape(json.dumps(exp.definition.get('grid', {})))}; fixed {html.escape(json.dumps(exp.definition.get('fixed', {})))}; "
                     f"points: {html.escape(json.dumps(counts))}</p>")  # fmt: skip
        problems = exp.points[exp.points["state"] != "done"]
        if not problems.empty:
            parts.append("<p class='warn'>Incomplete: points that failed or did not finish are listed below and left out of the plots.</p>")
            parts.append(problems[["id", "state", "error"]].to_html(index=False, escape=True))
        if not exp.records:
            parts.append("<p class='warn'>No point recorded results yet: there is nothing to plot.</p>")
        links = _export_points(exp, exp.path / "report_points") if export_points else {}
        table = exp.points.copy()
        table["notebook"] = table["id"].map(lambda p, links=links: f"<a href='{links[p]}'>{p}</a>" if p in links else p)
        shown = ["notebook", "state", *[c for c in table.columns if c.startswith("p.")], *exp.metric_names, "seconds"]
        parts.append("<h3>Summary</h3>" + table[shown].to_html(index=False, escape=False, float_format=lambda v: f"{v:.4g}"))
        prov = provenance_table(exp)
        if not prov.empty:
            parts.append("<h3>Environment and provenance</h3>" + prov.to_html(index=False))
    figs = _figures(exps)
    for i, (_, fig) in enumerate(figs):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0), default_width="100%", default_height="420px"))
    style = "body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px}.warn{color:#a40}"
    out.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>workbench report</title><style>{style}</style></head><body>{''.join(parts)}</body></html>", encoding="utf-8")
    return out
