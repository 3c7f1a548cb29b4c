"""Results from records: the committed summaries, index and README table equal what ``workbench runs summary``
and ``workbench runs readme`` generate from the committed records; every kind of file a question folder holds
is read; the README's Python example runs."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pandas as pd
import pytest
from test_cli import run
from tiny import write_tiny_gguf

from workbench.experiments import summary as S
from workbench.experiments.records import iter_records, load_runs, load_table, write_record

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"


def test_committed_summaries_and_index_are_generated():
    folders = S.question_folders(EXPERIMENTS)
    assert {f.name for f in folders} >= {"cpu-decode", "batching", "speculative", "vulkan-scale"}
    for folder in folders:
        assert (folder / S.SUMMARY).read_text() == S.summary_markdown(folder), (
            f"{folder / S.SUMMARY} is out of date: run `workbench runs summary --write`"
        )
    assert (EXPERIMENTS / S.INDEX).read_text() == S.index_markdown(EXPERIMENTS), (
        "experiments/README.md is out of date: run `workbench runs summary --write`"
    )


def test_readme_results_table_is_generated_from_the_records():
    text = (REPO / "README.md").read_text()
    start, end = text.index(S.README_BEGIN), text.index(S.README_END) + len(S.README_END)
    assert text[start:end] == S.readme_table(EXPERIMENTS), "run `workbench runs readme --write`"
    assert len(text.splitlines()) <= 250
    rows = [
        ln for ln in text[start:end].splitlines() if ln.startswith("| ") and not ln.startswith("| backend")
    ]
    keys = [tuple(c.strip() for c in r.split("|")[1:3]) for r in rows]
    assert len(keys) == len(set(keys)) and ("cpu", "gemma3-270m") in keys  # one row per backend x model
    for row in rows:  # each row links a committed record
        link = re.search(r"\]\((experiments/[^)]+)\)", row).group(1)
        assert (REPO / link).is_file(), link


def test_readme_python_example_runs(tmp_path, capsys):
    text = (REPO / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf")
    exec(compile(code.replace('"gemma3-270m"', repr(str(tiny))), "README.md", "exec"), {})
    assert "tok/s" in capsys.readouterr().out


def _bench_results(prefill, decode, vs=None, fraction=None):
    res = {"prefill_tok_s": prefill, "decode_tok_s": decode, "depth": 0,
           "ours": {"decode_tok_s": {"median": decode}}}  # fmt: skip
    if fraction is not None:
        res["ours"]["bandwidth_bound"] = {"fraction": {"median": fraction}}
    if vs is not None:
        res["vs_llama_cpp"] = {"prefill_ratio": vs[0], "decode_ratio": vs[1]}
        res["llama_cpp"] = {"prefill_tok_s": {"median": prefill / vs[0]}, "decode_tok_s": {"median": decode / vs[1]},
                            "version": "0.3.36"}  # fmt: skip
    return res


def _env(commit="a" * 40, dirty=False, driver=None):
    env = {"git": {"commit": commit, "dirty": dirty}, "threads": 2, "cpu_info": {"llvm_cpu": "znver4"},
           "device": {"kind": "cpu", "threads": 2}}  # fmt: skip
    if driver:
        env["device"] = {"kind": "gpu", "profile": "h100"}
        env["driver"] = driver
    return env


@pytest.fixture
def question(tmp_path):
    """A question folder holding one file of every kind."""
    root = tmp_path / "experiments"
    q = root / "q"
    q.mkdir(parents=True)
    (q / "notes.md").write_text("# Is it fast?\n\nA question about speed,\non two lines.\n\n## More\n")
    folder = write_record(
        {"kind": "bench", "how": "measured on vulkan:GPU (gpu), synthetic weights", "backend": "vulkan",
         "device": "vulkan:GPU", "command": "/x/workbench bench -m synthetic:gemma3-1b --backend vulkan -p 8 --json",
         "model": {"name": "synthetic:gemma3-1b", "kind": "synthetic", "params": 10**9, "weights_bytes": 335 * 10**7},
         "environment": _env(dirty=True, driver={"api": "vulkan", "driver_name": "NVIDIA", "driver_info": "580.1"}),
         "results": _bench_results(900.0, 400.0, vs=(1.0, 1.5)), "created": "2026-11-26T18:00:00+0000"},
        {"ops": pd.DataFrame({"kind": ["matmul"], "host_s": [1.0]})}, root=root, group="q",
    )  # fmt: skip
    flat = {"schema": "workbench.run/1", "run_id": "20261125-100000-bench-00000000", "kind": "bench",
            "created": "2026-11-25T10:00:00+0000", "how": "measured on cpu:EPYC (cpu)", "backend": "cpu",
            "device": "cpu:EPYC", "command": ".venv/bin/workbench bench --backend cpu --vs llama.cpp -t 2",
            "model": {"name": "gemma3-270m", "params": 268098176}, "environment": _env(commit="b" * 40),
            "results": _bench_results(700.0, 160.0, vs=(0.8, 1.7), fraction=0.85),
            "files": {"ops": "ops.parquet"}}  # fmt: skip
    (q / "20261125-100000-bench-00000000.json").write_text(json.dumps(flat))
    tuned = dict(flat, run_id="20261125-110000-bench-11111111", created="2026-11-25T11:00:00+0000",
                 command=flat["command"] + " --tune act_quant=int8")  # fmt: skip
    (q / "20261125-110000-bench-11111111.json").write_text(json.dumps(tuned))
    dup = {"record": f"/elsewhere/runs/{folder.name}", "backend": "vulkan", "device": "vulkan:GPU",
           "model": "synthetic:gemma3-1b", "how": "measured", **_bench_results(1.0, 1.0)}  # fmt: skip
    (q / "b1b.json").write_text(json.dumps(dup))  # the output of the record above: left out
    out = {"record": "/w/runs/20261123-114603-bench-d924dfce", "backend": "vulkan", "device": "vulkan:GPU",
           "model": "Gemma 3 270m", "how": "measured on vulkan:GPU", **_bench_results(59000.0, 815.0),
           "command": "workbench bench --backend vulkan -p 512 -g 128 --json"}  # fmt: skip
    (q / "20261123-bench-final.json").write_text(json.dumps(out))
    batch = {"model": "Gemma 3 270m", "backend": "vulkan", "device": "vulkan:GPU", "how": "measured",
             "decode": [{"batch": 1, "decode_tok_s": {"median": 850.0}, "vs_batch1": {"ratio": 1.0}, "bound_tok_s": 8500.0},
                        {"batch": 8, "decode_tok_s": {"median": 5100.0}, "vs_batch1": {"ratio": 6.0},
                         "bound_tok_s": 13000.0}]}  # fmt: skip
    (q / "20261125-bench-batch-a.json").write_text(json.dumps(batch))
    ev = {"backend": "cpu", "device": "cpu:EPYC", "how": "measured on cpu:EPYC", "variant": {"sparsity": "ffn-topk=0.9", "quant": "native"},
          "config": {"model": "gemma3-270m", "threads": 1},
          "accuracy": {"perplexity": 137.0, "perplexity_ref": 12.5, "kl_mean": 2.26, "top1_agreement": 0.37},
          "speed": {"decode_tok_s": 28.0, "decode_ratio": 1.21, "ffn_speedup": 2.14}}  # fmt: skip
    (q / "ffn_topk90.json").write_text(json.dumps(ev))
    (q / "tuning.json").write_text(json.dumps({"version": 1, "entries": []}))  # not a run
    (q / "sweep.json").write_text(
        json.dumps({"fixed": {"backend": "cpu", "threads": 1}, "updated": "2026-11-23T08:40:34+0000"})
    )
    (q / "summary.csv").write_text(
        "quant,decode tok/s,perplexity,native ppl,KL mean,state\nint8,10.7,12.56,12.54,0.0078,done\n"
    )
    (q / "results").mkdir()  # a sweep's working folder: passed over
    (q / "results" / "x.json").write_text("{}")
    return root, q, folder


def test_entries_of_every_kind_of_file(question):
    root, q, folder = question
    entries = S.load_entries(q)
    by_file = {e.file: e for e in entries}
    assert set(by_file) == {folder.name, "20261125-100000-bench-00000000.json", "20261125-110000-bench-11111111.json",
                            "20261123-bench-final.json", "20261125-bench-batch-a.json", "ffn_topk90.json",
                            "summary.csv"}  # fmt: skip
    assert [e.created[:10] for e in entries] == sorted(e.created[:10] for e in entries)
    gpu = by_file[folder.name]
    assert (gpu.commit, gpu.model, gpu.synthetic, gpu.how) == ("aaaaaaa+dirty", "synthetic:gemma3-1b", True,
                                                              "measured, synthetic weights")  # fmt: skip
    assert gpu.device == "GPU (NVIDIA 580.1)" and gpu.settings == "bench -p 8"
    assert gpu.bound_how == "projected" and gpu.bound == pytest.approx(400 * 335e7 / 3.35e12)
    cpu = by_file["20261125-100000-bench-00000000.json"]
    assert (cpu.commit, cpu.device, cpu.bound, cpu.bound_how) == (
        "bbbbbbb",
        "EPYC (znver4, 2 threads)",
        0.85,
        "measured",
    )
    assert (cpu.vs_llama_prefill, cpu.vs_llama_decode, cpu.default) == (0.8, 1.7, True)
    assert "llama-cpp-python 0.3.36" in cpu.result
    assert not by_file["20261125-110000-bench-11111111.json"].default  # --tune: not the default settings
    # an output names its command; one that does not (older outputs) is never taken for a default run
    old_out = json.loads((q / "20261123-bench-final.json").read_text())
    assert S.entry_of_output(old_out, "x.json").default
    del old_out["command"]
    assert not S.entry_of_output(old_out, "x.json").default
    old = by_file["20261123-bench-final.json"]
    assert (old.source, old.model, old.created, old.commit) == (
        "output",
        "gemma3-270m",
        "2026-11-23T11:46:03",
        "",
    )
    batch = by_file["20261125-bench-batch-a.json"]
    assert batch.kind == "bench-batch" and batch.decode_tok_s == 850.0 and "6.00x batch 1" in batch.result
    assert (batch.bound, batch.bound_how) == (0.1, "projected")
    ev = by_file["ffn_topk90.json"]
    assert ev.kind == "eval" and "ppl 137.00 vs 12.50" in ev.result and "FFN 2.14x" in ev.result
    assert ev.settings == "sparsity=ffn-topk=0.9 threads=1"
    point = by_file["summary.csv"]
    assert (point.kind, point.settings, point.created[:10]) == (
        "sweep point",
        "quant=int8 threads=1",
        "2026-11-23",
    )
    assert S.other_files(q, entries) == ["b1b.json", "tuning.json"]

    md = S.summary_markdown(q)
    assert md.startswith("# q: Is it fast?\n\nA question about speed, on two lines.\n")
    assert f"[{folder.name}]({folder.name}/run.json)" in md and "`tuning.json`" in md
    index = S.index_markdown(root)
    assert "[q/](q/)" in index and "Is it fast?" in index and "| 7 |" in index

    table = S.readme_table(root)  # the latest default bench per backend x model, cpu first
    rows = [r for r in table.splitlines() if r.startswith("| ") and not r.startswith("| backend")]
    assert [r.split(" | ")[:2] for r in rows] == [["| cpu", "gemma3-270m"], ["| vulkan", "gemma3-270m"],
                                                  ["| vulkan", "synthetic:gemma3-1b"]]  # fmt: skip
    assert "85.0%" in rows[0] and "0.80x / 1.70x" in rows[0] and "40.0% (p)" in rows[2]
    readme = f"intro\n{S.README_BEGIN}\nold\n{S.README_END}\nend\n"
    assert S.replace_readme_table(readme, table) == f"intro\n{table}\nend\n"
    with pytest.raises(ValueError, match="markers"):
        S.replace_readme_table("no markers", table)


def _question_with_a_cpu_run(tmp_path):
    """A question folder (not yet holding it) and a cpu bench record at default settings."""
    q = tmp_path / "experiments" / "q"
    q.mkdir(parents=True)
    (q / "notes.md").write_text("# Is it fast?\n")
    run = {"schema": "workbench.run/1", "run_id": "20261125-100000-bench-00000000", "kind": "bench",
           "created": "2026-11-25T10:00:00+0000", "how": "measured on cpu:EPYC (cpu)", "backend": "cpu",
           "device": "cpu:EPYC", "command": ".venv/bin/workbench bench --backend cpu",
           "model": {"name": "gemma3-270m", "params": 268098176}, "environment": _env(commit="b" * 40),
           "results": _bench_results(700.0, 160.0)}  # fmt: skip
    return q, run


def test_runs_of_dropped_changes_are_not_readme_rows(tmp_path):
    """A later run at default settings whose file is named dropped-* (the change it measured was reverted)
    stays in the folder's summary but does not replace the README's row."""
    q, run_a = _question_with_a_cpu_run(tmp_path)
    run_b = dict(run_a, run_id="20261125-110000-bench-11111111", created="2026-11-25T11:00:00+0000",
                 results=_bench_results(100.0, 20.0))  # fmt: skip
    (q / "20261125-100000-bench-00000000.json").write_text(json.dumps(run_a))
    (q / "dropped-20261125-110000-bench-11111111.json").write_text(json.dumps(run_b))
    assert len(S.load_entries(q)) == 2
    assert [e.run_id for e in S.readme_entries(tmp_path / "experiments")] == [run_a["run_id"]]


def test_runs_with_kernels_forced_by_the_environment_are_not_readme_rows(tmp_path):
    """A later run whose environment forced the kernels (WORKBENCH_CPU_KERNELS) is not at the defaults: its
    summary says so and it does not replace the README's row."""
    q, run_a = _question_with_a_cpu_run(tmp_path)
    forced = dict(run_a, run_id="20261125-110000-bench-11111111", created="2026-11-25T11:00:00+0000",
                  environment=_env(commit="b" * 40) | {"overrides": {"WORKBENCH_CPU_KERNELS": "narrow"}})  # fmt: skip
    (q / "20261125-100000-bench-00000000.json").write_text(json.dumps(run_a))
    (q / "20261125-110000-bench-11111111.json").write_text(json.dumps(forced))
    entries = {e.run_id: e for e in S.load_entries(q)}
    assert (
        not entries[forced["run_id"]].default
        and "WORKBENCH_CPU_KERNELS=narrow" in entries[forced["run_id"]].how
    )
    assert [e.run_id for e in S.readme_entries(tmp_path / "experiments")] == [run_a["run_id"]]


def test_question_folder_records_load_with_workbench_runs(question):
    root, _, folder = question
    with warnings.catch_warnings():  # JSON that is not a record, and a sweep's folders, pass silently
        warnings.simplefilter("error")
        found = [p.name for p, _ in iter_records(root, "q")]
    assert found == [
        "20261125-100000-bench-00000000.json",
        "20261125-110000-bench-11111111.json",
        folder.name,
    ]
    assert len(load_runs(root, "q", backend="cpu")) == 2
    ops = load_table("ops", root, "q")  # the flat records kept no tables
    assert list(ops["run_id"]) == [folder.name]


def test_runs_cli_summary_and_readme(question):
    root, q, _ = question
    p = run("runs", "--dir", str(root), "--in", "q", "--json")
    assert len(json.loads(p.stdout)["runs"]) == 3
    p = run("runs", "--dir", str(root), "--in", "all", "backend=cpu")
    assert "20261125-100000-bench-00000000" in p.stdout
    p = run("runs", "summary", "q", "--dir", str(root), "--json")
    rows = json.loads(p.stdout)["folders"][0]["runs"]
    assert len(rows) == 7 and {"date", "commit", "device", "decode_tok_s", "how"} <= set(rows[0])
    assert run("runs", "summary", "q", "--dir", str(root), "--check", check=False).returncode == 1
    run("runs", "summary", "--dir", str(root), "--write")
    assert (q / "summary.md").read_text() == S.summary_markdown(q)
    assert (root / "README.md").read_text() == S.index_markdown(root)
    run("runs", "summary", "--dir", str(root), "--check")
    readme = root.parent / "README.md"
    readme.write_text(f"# x\n{S.README_BEGIN}\n{S.README_END}\n")
    assert run("runs", "readme", "--dir", str(root), "--check", check=False).returncode == 1
    run("runs", "readme", "--dir", str(root), "--write")
    assert S.readme_table(root) in readme.read_text()
    run("runs", "readme", "--dir", str(root), "--check")
    p = run("runs", "readme", "--dir", str(root), "--json")
    assert [r["backend"] for r in json.loads(p.stdout)["results"]] == ["cpu", "vulkan", "vulkan"]
    bad = run("runs", "--dir", str(root), "--in", "nope", check=False)
    assert bad.returncode != 0 and "question folders: q" in bad.stderr


def test_report_provenance_names_commit_packages_and_driver():
    from workbench.experiments.report import Experiment, provenance_table

    env = {"cpu": "X", "git": {"commit": "c" * 40, "dirty": True}, "packages": {"numpy": "2.0"},
           "driver": {"api": "vulkan", "driver_name": "NVIDIA", "driver_info": "580.159.04"}}  # fmt: skip
    rec = {"how": "measured", "backend": "vulkan", "device": "vulkan:GPU", "environment": env}
    exp = Experiment("e", Path("."), {}, pd.DataFrame(), pd.DataFrame(), {"p1": rec})
    row = provenance_table(exp).iloc[0]
    assert (row["git"], row["driver"], row["numpy"]) == ("ccccccc+dirty", "NVIDIA 580.159.04", "2.0")


def test_eval_record_entry():
    rec = {"kind": "eval", "how": "measured on cpu:EPYC (reference on cpu:EPYC)", "backend": "cpu",
           "device": "cpu:EPYC", "model": "/cache/gemma-3-270m-q4_k_m.gguf", "created": "2026-11-27T00:00:00+0000",
           "command": "workbench eval --quant int8 --json", "environment": _env(),
           "results": {"accuracy": {"perplexity": 12.56, "perplexity_ref": 12.54}, "speed": {"decode_tok_s": 10.7}}}  # fmt: skip
    e = S.entry_of_record(rec, "x.json")
    assert (e.model, e.settings, e.decode_tok_s, e.commit) == (
        "gemma3-270m",
        "eval --quant int8",
        10.7,
        "aaaaaaa",
    )
    assert e.result.startswith("ppl 12.56 vs 12.54 (+0.2%)")


def test_gpu_bound_from_the_measured_streaming_read_and_projection_share(tmp_path):
    """A Vulkan record with the device's measured streaming read (bench's bandwidth probe) gets a measured
    decode / bound (no "(p)"), and the profile's decode projections share goes to its README column."""
    res = _bench_results(900.0, 400.0)
    res["ours"]["device_bandwidth"] = {"role": "device", "best_gbs": 3000.0, "median_gbs": 2990.0}
    res["profile"] = {"decode_projections": {"gbps": 1320.0, "share": 0.44}}
    root = tmp_path / "experiments"
    write_record(
        {"kind": "bench", "how": "measured on vulkan:GPU (gpu)", "backend": "vulkan", "device": "vulkan:GPU",
         "command": "workbench bench -m synthetic:gemma3-27b --backend vulkan",
         "model": {"name": "synthetic:gemma3-27b", "params": 27 * 10**9, "weights_bytes": 165 * 10**8},
         "environment": _env(driver={"api": "vulkan", "driver_name": "NVIDIA", "driver_info": "580.1"}),
         "results": res, "created": "2026-11-27T18:00:00+0000"},
        {}, root=root, group="q",
    )  # fmt: skip
    (root / "q" / "notes.md").write_text("# A question\n")
    [e] = [x for x in S.load_entries(root / "q") if x.kind == "bench"]
    assert e.bound_how == "measured" and e.bound == pytest.approx(400 * 165e8 / 3000e9)
    assert e.extra["projection_share"] == 0.44
    [row] = [line for line in S.readme_table(root).splitlines() if "gemma3-27b" in line]
    assert f"| {100 * e.bound:.1f}% | 44% |" in row
