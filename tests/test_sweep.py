"""Sweeps (grid validation, resume after kill -9 at random moments, points that raise or hang, a full disk
for the records, dask), notebooks, and reports."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from workbench.experiments.report import ReportError, load_experiment, write_report
from workbench.experiments.sweep import Grid, GridError, load_grid, point_id, run_sweep, validate

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def _toy_notebook(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell(
        "x = 1\ny = 0\nfail = False\nsleep_s = 0.0\npid_file = ''\nworkbench_point = None"
    )
    params.metadata["tags"] = ["parameters"]
    body = nbformat.v4.new_code_cell(
        "import os, time\nfrom pathlib import Path\nfrom workbench.experiments.sweep import record_result\n"
        "if pid_file:\n    Path(pid_file).write_text(str(os.getpid()))\n"
        "if fail:\n    raise RuntimeError(f'point x={x} fails on purpose')\n"
        "time.sleep(sleep_s)\n"
        "record_result(workbench_point, {'tok_s': 10.0 * x + y, 'err': 1.0 / (x + y + 1)}, params={'x': x, 'y': y},"
        " how='measured on test')"
    )
    nb.cells = [params, body]
    nbformat.write(nb, path)
    return path


def _grid(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "grid.yaml"
    p.write_text(text)
    return p


def _statuses(exp: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in (exp / "points").glob("*/status.json")}


def _leftovers(exp: Path) -> list[str]:
    """Temporary files or folders of half-written records or statuses."""
    return [str(p) for p in [*(exp / "results").glob(".*"), *(exp / "points").glob("*/.*")]]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_grid_validation_errors(tmp_path):
    nb = _toy_notebook(tmp_path / "toy.ipynb")
    with pytest.raises(GridError, match="no parameters \\['z'\\]"):
        validate(load_grid(_grid(tmp_path, "z: [1, 2]\n")), nb)
    with pytest.raises(GridError, match="no values"):
        load_grid(_grid(tmp_path, "x: []\n"))
    with pytest.raises(GridError, match="repeats"):
        load_grid(_grid(tmp_path, "x: [1, 1]\n"))
    with pytest.raises(GridError, match="--yes"):
        validate(Grid({"x": list(range(30)), "y": list(range(30))}), nb)
    assert len(validate(Grid({"x": list(range(30)), "y": list(range(30))}), nb, yes=True)) == 900
    with pytest.raises(GridError, match="mapping"):
        load_grid(_grid(tmp_path, "- 1\n- 2\n"))
    g = load_grid(_grid(tmp_path, "sweep: {x: [1, 2]}\nfixed: {y: 3}\n"), [("x", "5")])
    assert g.points() == [{"y": 3, "x": 5}]


def test_failed_point_is_recorded_and_sweep_continues(tmp_path):
    nb = _toy_notebook(tmp_path / "toy.ipynb")
    grid = load_grid(_grid(tmp_path, "sweep: {x: [1, 2], fail: [false, true]}\n"))
    res = run_sweep(nb, grid, "fails", root=tmp_path / "exp")
    assert (res["done"], res["failed"]) == (2, 2)
    exp = load_experiment(tmp_path / "exp" / "fails")
    failed = exp.points[exp.points["state"] == "failed"]
    assert len(failed) == 2 and failed["error"].str.contains("fails on purpose").all()
    reasons = [st.get("reason") for st in _statuses(tmp_path / "exp" / "fails").values()]
    assert sorted(map(str, reasons)) == ["None", "None", "error", "error"]
    again = run_sweep(nb, grid, "fails", root=tmp_path / "exp")
    assert again["skipped"] == 4 and again["done"] == again["failed"] == 0


def test_sweep_resumes_after_kill_without_loss_or_duplicates(tmp_path):
    """kill -9 (the whole process group) at three random moments, then a run to the end."""
    nb = _toy_notebook(tmp_path / "toy.ipynb")
    grid = _grid(tmp_path, "sweep: {x: [1, 2, 3, 4]}\nfixed: {sleep_s: 1.0}\n")
    env = {**os.environ, "WORKBENCH_EXPERIMENTS": str(tmp_path / "exp")}
    cmd = [
        str(Path(sys.executable).parent / "workbench"),
        "sweep",
        str(nb),
        "--grid",
        str(grid),
        "--name",
        "resume",
    ]
    exp = tmp_path / "exp" / "resume"
    rng = random.Random(29)
    for _ in range(3):
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        time.sleep(rng.uniform(1.0, 5.0))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    done_before = len(_statuses(exp))
    assert done_before < 4
    out = subprocess.run([*cmd, "--json"], env=env, capture_output=True, text=True, timeout=300)
    res = json.loads(out.stdout)
    assert res["skipped"] == done_before and res["done"] == 4 - done_before and res["failed"] == 0
    results = sorted(p.name for p in (exp / "results").iterdir() if not p.name.startswith("."))
    assert results == sorted(point_id({"sleep_s": 1.0, "x": x}) for x in (1, 2, 3, 4))
    assert _leftovers(exp) == []
    points = load_experiment(exp).points
    assert sorted(points["m.tok_s"]) == [10.0, 20.0, 30.0, 40.0]


def test_hung_point_is_killed_at_the_point_timeout(tmp_path):
    """``--point-timeout``: the hung point's kernel is killed, the point fails with reason "timeout", the
    others are done, and a rerun does not run it again (only ``--retry-failed`` does)."""
    nb = _toy_notebook(tmp_path / "toy.ipynb")
    pid_file = tmp_path / "kernel.pid"
    grid = _grid(tmp_path, f"sweep: {{sleep_s: [0.0, 600.0]}}\nfixed: {{pid_file: '{pid_file}'}}\n")
    env = {**os.environ, "WORKBENCH_EXPERIMENTS": str(tmp_path / "exp")}
    cmd = [str(Path(sys.executable).parent / "workbench"), "sweep", str(nb), "--grid", str(grid), "--name",
           "hang", "--point-timeout", "8", "--json"]  # fmt: skip
    t0 = time.time()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    res = json.loads(out.stdout)
    assert (res["done"], res["failed"], res["not_run"]) == (1, 1, 0) and time.time() - t0 < 60
    exp = tmp_path / "exp" / "hang"
    st = _statuses(exp)
    hung = st[point_id({"sleep_s": 600.0, "pid_file": str(pid_file)})]
    assert hung["state"] == "failed" and hung["reason"] == "timeout" and "time limit of 8 s" in hung["error"]
    assert 8 <= hung["seconds"] < 40
    kernel = int(pid_file.read_text())
    deadline = time.time() + 10
    while _alive(kernel) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(kernel), "the hung point's kernel is still running"
    assert [p.name for p in (exp / "results").iterdir()] == [
        point_id({"sleep_s": 0.0, "pid_file": str(pid_file)})
    ]
    again = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120).stdout)
    assert (again["skipped"], again["done"], again["failed"]) == (2, 0, 0)


def _fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` to the last byte (unbuffered writes until ENOSPC); returns the
    filler file."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def _resume_after_full_disk(nb: Path, grid, exp_root: Path, fill, free) -> None:
    """Run a 4-point sweep whose disk fills after the first point, check it stops with the reason, free the
    disk, run again: every point done exactly once, nothing half-written left."""
    exp = exp_root / "full"
    seen: list[dict] = []

    def progress(status: dict) -> None:
        seen.append(status)
        if len(seen) == 1:
            fill()

    res = run_sweep(nb, grid, "full", root=exp_root, progress=progress)
    assert (res["done"], res["failed"], res["not_run"]) == (1, 1, 2), res
    assert "disk is full" in res["aborted"] and "No space left on device" in res["aborted"]
    assert seen[1]["reason"] == "disk_full" and "No space left on device" in seen[1]["error"]
    assert _leftovers(exp) == []
    free()
    again = run_sweep(nb, grid, "full", root=exp_root)
    assert (again["skipped"], again["done"], again["failed"], again["aborted"]) == (1, 3, 0, None)
    ids = sorted(point_id({"x": x}) for x in (1, 2, 3, 4))
    assert sorted(p.name for p in (exp / "results").iterdir() if p.name != "filler") == ids
    assert sorted(st["state"] for st in _statuses(exp).values()) == ["done"] * 4 and _leftovers(exp) == []
    assert sorted(load_experiment(exp).points["m.tok_s"]) == [10.0, 20.0, 30.0, 40.0]


def test_full_records_disk_stops_the_sweep_and_loses_nothing(tmp_path):
    """The results folder on a tiny tmpfs, filled after the first point: the next point's record fails
    (ENOSPC in its kernel) and is recorded as failed with reason disk_full; the sweep stops; once space is
    free the rerun runs that point and the rest."""
    if os.geteuid() != 0:
        pytest.skip("LOUD SKIP: mounting a tmpfs needs root; the full-disk sweep test did not run")
    nb = _toy_notebook(tmp_path / "toy.ipynb")
    results = tmp_path / "exp" / "full" / "results"
    results.mkdir(parents=True)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(results)], capture_output=True,
                           text=True)  # fmt: skip
    if mount.returncode != 0:
        pytest.skip(
            f"LOUD SKIP: cannot mount a tmpfs here ({mount.stderr.strip()}); the full-disk test did not run"
        )
    try:
        filler: list[Path] = []
        _resume_after_full_disk(nb, Grid({"x": [1, 2, 3, 4]}), tmp_path / "exp",
                                lambda: filler.append(_fill(results)), lambda: filler[0].unlink())  # fmt: skip
    finally:
        subprocess.run(["umount", "-l", str(results)], check=True)


def test_status_write_on_a_full_disk_stops_the_sweep_and_loses_nothing(tmp_path, monkeypatch):
    """The points' statuses cannot be written (ENOSPC part way through the file, as on a full disk): the
    sweep stops without a traceback, leaves no temporary file, and the point runs again next time."""
    nb = _toy_notebook(tmp_path / "toy.ipynb")
    full = [False]
    write_text = Path.write_text

    def write_on_a_full_disk(path: Path, data: str, *args, **kwargs):
        if full[0] and path.name.startswith(".status.json."):
            write_text(path, data[:10])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return write_text(path, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_on_a_full_disk)
    _resume_after_full_disk(nb, Grid({"x": [1, 2, 3, 4]}), tmp_path / "exp", lambda: full.__setitem__(0, True),
                            lambda: full.__setitem__(0, False))  # fmt: skip


def test_sweep_on_local_dask_cluster(tmp_path):
    distributed = pytest.importorskip("distributed")
    nb = _toy_notebook(tmp_path / "toy.ipynb")
    grid = load_grid(_grid(tmp_path, "x: [1, 2]\n"))
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cl:
        res = run_sweep(
            nb,
            grid,
            "dask",
            executor=cl.scheduler_address.replace("tcp://", "dask://"),
            root=tmp_path / "exp",
        )
    assert res["done"] == 2
    exp = load_experiment(tmp_path / "exp" / "dask")
    assert set(exp.points["state"]) == {"done"}


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        for d in os.environ.get("PATH", "").split(os.pathsep):
            if (Path(d) / name).exists():
                return str(Path(d) / name)
    return None


def test_report_renders_in_headless_chromium(tmp_path):
    nb = _toy_notebook(tmp_path / "toy.ipynb")
    run_sweep(nb, load_grid(_grid(tmp_path, "sweep: {x: [1, 2], y: [0, 1]}\n")), "rep", root=tmp_path / "exp")
    html_path = write_report([tmp_path / "exp" / "rep"])
    text = html_path.read_text()
    assert "Pareto" in text and '"type":"heatmap"' in text
    assert "<script" in text and '<script src="http' not in text  # plotly inlined: works offline
    chrome = _chromium()
    if chrome is None:
        pytest.skip(
            "LOUD SKIP: chromium is not installed (apt-get install chromium); the report was not rendered"
        )
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000"]
    dom = subprocess.run(
        [chrome, *flags, "--dump-dom", html_path.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert dom.stdout.count("main-svg") >= 3  # plotly drew the figures: its JavaScript ran without errors
    shot = tmp_path / "shot.png"
    subprocess.run([chrome, *flags, f"--screenshot={shot}", "--window-size=1200,2400", html_path.as_uri()],
                   capture_output=True, timeout=120)  # fmt: skip
    from PIL import Image

    img = Image.open(shot).convert("L")
    lo, hi = img.getextrema()
    assert hi - lo > 100 and len(img.getcolors(256)) > 20  # not a blank page (grey levels used)


def test_report_on_empty_experiment_says_what_is_missing(tmp_path):
    with pytest.raises(ReportError, match="not an experiment"):
        write_report([tmp_path])
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "sweep.json").write_text(json.dumps({"notebook": "x.ipynb", "grid": {}}))
    with pytest.raises(ReportError, match="no points"):
        write_report([tmp_path / "e"])


TINY = {
    "00_quickstart.ipynb": {"backend": "cpu", "max_tokens": 2, "prompt": "Hi"},
    "10_workgroup_sweep.ipynb": {"prompt_tokens": 4, "gen_tokens": 2, "repeats": 1, "rows_per_task": 8},
    "11_quantization.ipynb": {"eval_tokens": 32, "speed_tokens": 2, "repeats": 1, "prompts": 1},
    "12_sparsity.ipynb": {
        "sparsity": "ffn-topk=0.5",
        "eval_tokens": 32,
        "speed_tokens": 2,
        "repeats": 1,
        "prompts": 1,
    },
    "13_npu_igpu_split.ipynb": {
        "models": ["gemma3-270m"],
        "strategies": ["all-igpu", "npu-ffn"],
        "run_tokens": 0,
    },
    "14_batching.ipynb": {
        "batch_sizes": [1, 2],
        "prompt_tokens": 8,
        "gen_tokens": 2,
        "repeats": 1,
        "prompt_lengths": [4],
    },
    "15_gemma3n.ipynb": {
        "backends": ["numpy", "npu"],
        "speed_backends": [],
        "prompt_tokens": 4,
        "gen_tokens": 2,
        "repeats": 1,
        "eval_tokens": 32,
        "placement_models": ["gemma3n-e2b"],
        "first_n_splits": [10],
        "strategies": ["all-igpu"],
        "npu_launches": ["op"],
        "sparse_skip_projection": [True],
    },
}


@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_notebook_runs_or_fails_clearly(name, tmp_path):
    import papermill

    out = tmp_path / name
    if name in TINY:
        papermill.execute_notebook(str(NOTEBOOKS / name), str(out), parameters=TINY[name], progress_bar=False,
                                   cwd=str(NOTEBOOKS), kernel_name="python3")  # fmt: skip
        runs = list((Path(os.environ["WORKBENCH_EXPERIMENTS"]) / "runs").glob("*-notebook-*"))
        assert runs, "the notebook recorded no results"
    else:
        with pytest.raises(papermill.PapermillExecutionError, match="not built yet"):
            papermill.execute_notebook(str(NOTEBOOKS / name), str(out), progress_bar=False, cwd=str(NOTEBOOKS),
                                       kernel_name="python3")  # fmt: skip


def test_workgroup_notebook_sweeps_the_vulkan_matvec(tmp_path):
    import papermill

    pytest.importorskip("vulkan")
    params = {"backend": "vulkan", "matvec_wg": 64, "matvec_row_threads": 8, "prompt_tokens": 4, "gen_tokens": 2,
              "repeats": 1}  # fmt: skip
    out = tmp_path / "vk.ipynb"
    papermill.execute_notebook(str(NOTEBOOKS / "10_workgroup_sweep.ipynb"), str(out), parameters=params,
                               progress_bar=False, cwd=str(NOTEBOOKS), kernel_name="python3")  # fmt: skip
    assert "matvec_wg=64 matvec_row_threads=8: decode" in out.read_text()
