"""Guards `tinit sweep` beyond "a sweep equals the single run" (every sweepable command:
tests/test_sweep_equals_run.py): the local workers pinned one GPU each, a missing and a
failed point re-run by --resume (real one-node SLURM cluster started from
scripts/slurm-local-cluster.sh for the array case); a cancelled array task
leaves the other points, is recorded failed with SLURM's reason, and --resume completes
the sweep; --dry-run prints the sbatch script; bad sweep options are one-line errors."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers import TINY, assert_one_line_error, figures_built_not_saved, slurm_polls_every
from typer.testing import CliRunner

from tinit.cli import app
from tinit.sweep.folder import point_dir, point_done

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
#: 12 points: 2 schemes x pre-norm x 3 depths x 2 seeds
ACCEPT = [
    "depth-sweep",
    "--layers",
    "4,8,16",
    "--seeds",
    "2",
    "--pre-norm",
    "--no-grads",
    *TINY,
    "--device",
    "cpu",
]
STEMS = ("depth_sweep", "depth_sweep_summary", "depth_sweep_fit")


#: the in-process sweeps' workers come from one preloaded fork server (conftest)
pytestmark = pytest.mark.usefixtures("shared_fork_server")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """`tinit depth-sweep` in this process, one thread (conftest): the numbers to match
    (its CSVs; the figure built, not rendered: a sweep's is, below)."""
    out = tmp_path_factory.mktemp("ref") / "run"
    with pytest.MonkeyPatch.context() as mp:
        figures_built_not_saved(mp)
        res = runner.invoke(app, [*ACCEPT, "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    return out


def same_csvs(a: Path, b: Path) -> None:
    for stem in STEMS:
        assert (a / f"{stem}.csv").read_bytes() == (b / f"{stem}.csv").read_bytes(), stem


def test_local_pool_gives_the_single_process_csvs(tmp_path, reference, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the workers' threads, as the reference's
    # two GPUs "visible": each worker is pinned to one (the points run on the CPU: --device cpu)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    out = tmp_path / "run"
    res = runner.invoke(app, ["sweep", *ACCEPT, "--workers", "2", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    same_csvs(out, reference)
    assert (out / "depth_sweep.png").is_file()
    cfg = json.loads((out / "config.json").read_text())
    sweep = cfg["sweep"]
    assert cfg["complete"] is True and sweep["executor"] == "local" and sweep["counts"]["done"] == 12
    assert sweep["runs"][0]["options"]["workers"] == 2
    assert sweep["runs"][0]["options"]["pinned_gpus"] == ["0", "1"]
    gpu_of: dict[int, set] = {}
    for name, p in sweep["points"].items():
        assert p["state"] == "done" and p["host"] and point_done(out, name)
        where = json.loads((point_dir(out, name) / "config.json").read_text())["where"]
        gpu_of.setdefault(where["pid"], set()).add(where["cuda_visible_devices"])
    assert len(gpu_of) == 2 and os.getpid() not in gpu_of  # two worker processes, not this one
    assert sorted(g for gpus in gpu_of.values() for g in gpus) == ["0", "1"]  # one GPU each

    # one point missing, one failed: --resume runs those two only, keeps the failed attempt
    shutil.rmtree(point_dir(out, "L8-seed1-naive-pre"))
    rec_path = point_dir(out, "L16-seed0-scaled-pre") / "config.json"
    rec = json.loads(rec_path.read_text())
    rec_path.write_text(json.dumps({**rec, "complete": False, "error": "marked failed by the test"}))
    figures_built_not_saved(monkeypatch)  # (the merged figure is drawn as above; its CSVs matter here)
    res = runner.invoke(app, ["sweep", "--resume", str(out), "--workers", "1", "-q"])
    assert res.exit_code == 0, res.output
    same_csvs(out, reference)
    sweep = json.loads((out / "config.json").read_text())["sweep"]
    assert sorted(sweep["runs"][1]["points"]) == ["L16-seed0-scaled-pre", "L8-seed1-naive-pre"]
    assert sweep["runs"][1]["options"]["workers"] == 1 and sweep["counts"]["done"] == 12
    kept = json.loads((out / "points" / "L16-seed0-scaled-pre.attempt-1" / "config.json").read_text())
    assert kept["error"] == "marked failed by the test"


def test_dry_run_prints_the_sbatch_script_and_writes_nothing(tmp_path):
    pytest.importorskip("submitit")
    out = tmp_path / "run"
    res = runner.invoke(app, [
        "sweep", *ACCEPT, "--executor", "slurm", "--dry-run", "--partition", "gpu", "--gpus-per-job", "1",
        "--cpus-per-job", "4", "--mem", "16G", "--time", "10", "--array-parallelism", "3",
        "--account", "lab", "--qos", "high", "--slurm-arg", "constraint=a100", "--points-per-job", "2",
        "--out", str(out),
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    s = res.stdout
    assert "12 points" in s and "L4-seed0-naive-pre" in s and "6 tasks" in s
    for line in ("#SBATCH --array=0-5%3", "#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=1",
                 "#SBATCH --cpus-per-task=4", "#SBATCH --mem=16G", "#SBATCH --time=10",
                 "#SBATCH --account=lab", "#SBATCH --qos=high", "#SBATCH --constraint=a100",
                 f"export PYTHONPATH={ROOT}", f"{sys.executable} -u -m submitit.core._submit"):  # fmt: skip
        assert line in s, line
    assert not out.exists()


def test_a_sweep_leaves_the_swept_commands_help_names(tmp_path):
    """Parsing the swept command's line once made a context without the root's help names,
    and click keeps the first help option it makes: in the same process (the tests; a
    program calling the CLI), `tinit COMMAND -h` then failed with "No such option: -h"."""
    pytest.importorskip("submitit")
    res = runner.invoke(
        app, ["sweep", *ACCEPT, "--executor", "slurm", "--dry-run", "--out", str(tmp_path / "r")]
    )
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, [ACCEPT[0], "-h"])
    assert res.exit_code == 0 and "Usage" in res.stdout, res.output


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["sweep", "params"], "COMMAND"),
        (["sweep"], "COMMAND"),
        (["sweep", *ACCEPT, "--partition", "gpu"], "--partition"),
        (["sweep", *ACCEPT, "--executor", "slurm", "--mem", "12X", "--dry-run"], "--mem"),
        (["sweep", *ACCEPT, "--executor", "slurm", "--time", "1:2:3:4", "--dry-run"], "--time"),
        (["sweep", *ACCEPT, "--executor", "slurm", "--slurm-arg", "oops", "--dry-run"], "--slurm-arg"),
        (["sweep", *ACCEPT, "--executor", "slurm", "--workers", "2", "--dry-run"], "--workers"),
        (["sweep", "depth-sweep", "--layers", "4,0"], "--layers"),  # the command's own checks
        (["sweep", "--resume", "nowhere"], "--resume"),
    ],
)
def test_bad_sweep_options_are_one_line_errors(tmp_path, args, option):
    pytest.importorskip("submitit")
    out = ["--out", str(tmp_path / "x")] if len(args) > 2 else []
    assert_one_line_error(runner.invoke(app, [*args, *out]), option, tmp_path / "x")


# --- against a real one-node SLURM ------------------------------------------------------


# (the one-node cluster, slurm_cluster, is conftest.py's: one per test process for every module)


def test_slurm_array_cancel_one_task_then_resume(tmp_path, reference, slurm_cluster, monkeypatch):
    """Two array tasks of 6 points; task 1 is scancel'ed while it runs. Task 0's points
    are kept (their rows equal the single-process run's), task 1's are failed as
    cancelled, and --resume runs only those and gives the single-process CSVs byte for
    byte. Task 1 waits at its start, having said so in a file (a ``sitecustomize`` on the
    tasks' PYTHONPATH, the first time only), until it is cancelled: no poller racing its
    points. (The merged figures are built, not rendered: the local sweep above renders a
    sweep's.)"""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the tasks' threads, as the reference's
    figures_built_not_saved(monkeypatch)
    slurm_polls_every(monkeypatch, 0.1)
    out = tmp_path / "run"
    args = ["sweep", *ACCEPT, "--executor", "slurm", "--points-per-job", "6", "--time", "5"]
    args += ["--out", str(out)]
    first: dict = {}
    hook, running = tmp_path / "hook", tmp_path / "task-1-runs"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os, time\n"
        f"if os.environ.get('SLURM_ARRAY_TASK_ID') == '1' and not os.path.exists({str(running)!r}):\n"
        f"    open({str(running)!r}, 'w').close()\n"
        "    while True:\n        time.sleep(1)  # until scancel ends the task\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]))
    sweep = threading.Thread(target=lambda: first.update(res=runner.invoke(app, [*args, "-q"])))
    sweep.start()
    while not running.exists():  # task 1 says it runs, and waits (--time 5 bounds a hang)
        assert sweep.is_alive(), first
        time.sleep(0.05)
    q = subprocess.run(["squeue", "-h", "-r", "-n", "tinit-depth-sweep", "-o", "%i %T"],
                       capture_output=True, text=True).stdout.split()  # fmt: skip
    cancelled = next(t for t, st in zip(q[::2], q[1::2], strict=True) if t.endswith("_1") and st == "RUNNING")
    subprocess.run(["scancel", cancelled], check=True)
    sweep.join(timeout=120)
    res = first["res"]
    assert cancelled is not None, res.output
    assert res.exit_code == 1, res.output
    assert "sweep incomplete" in res.stderr and f"tinit sweep --resume {out}" in res.stderr
    points = json.loads((out / "config.json").read_text())["sweep"]["points"]
    failed = [n for n, p in points.items() if p["state"] == "failed"]
    done = [n for n, p in points.items() if p["state"] == "done"]
    assert failed and len(done) + len(failed) == 12 and len(done) >= 6
    for n in failed:
        assert points[n]["job_id"] == cancelled and "cancelled" in points[n]["reason"], points[n]
        assert "CANCELLED" in points[n]["reason"]
    assert all(points[n]["host"] for n in done)
    # the kept points' rows are the single-process run's rows
    ref, got = pd.read_csv(reference / "depth_sweep.csv"), pd.read_csv(out / "depth_sweep.csv")
    assert len(got) == len(done)
    keys = ["init", "norm_position", "n_layers", "seed"]
    pd.testing.assert_frame_equal(got, got[keys].merge(ref, on=keys, how="left"), check_exact=True)

    res = runner.invoke(app, ["sweep", "--resume", str(out), "-q"])
    assert res.exit_code == 0, res.output
    same_csvs(out, reference)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["complete"] is True and cfg["sweep"]["counts"]["done"] == 12
    assert len(cfg["sweep"]["job_ids"]) == 2 and cfg["sweep"]["runs"][1]["points"] == failed
    assert cfg["sweep"]["runs"][1]["options"]["points_per_job"] == 6  # the recorded options, reused
    assert (out / "previous" / "1" / "config.json").is_file()  # the incomplete merge is kept, not overwritten
