"""Issue 22, `tinit sweep`: each case reproduced with the real command and real faults.
Case 2: sweep variance / grad-norms were not the single run's bytes (not-applicable
cells written nan, no non_finite in config.json). Case 4: SIGTERM or SIGHUP ended a
sweep silently (143/129), no merged files, config.json "running" with every point
"queued", workers orphaned; a killed worker failed every pending point. Case 14: a full
disk while merging left config.json "running"; --resume on an empty record was a
KeyError. Case 15: a --slurm-arg with a newline added a line to the sbatch script.

The signal is sent to a real `tinit sweep` process; the killed worker and the full disk
are sweeps run in this process (typer's CliRunner), with a real SIGKILL to one of its
worker processes and a real file-size limit on this process while it merges."""

import json
import os
import resource
import signal
from pathlib import Path

import pytest
from helpers import (
    ROOT,
    assert_one_line_error,
    at_sweep_update,
    children_of,
    figures_built_not_saved,
    signalled_run,
    start_fork_server,
    tiny,
)
from typer.testing import CliRunner

from tinit.cli import app

runner = CliRunner()
TINY = [*tiny(), "--device", "cpu"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def config(out: Path) -> dict:
    return json.loads((out / "config.json").read_text())


#: the in-process sweeps' workers come from one preloaded fork server (conftest)
pytestmark = pytest.mark.usefixtures("shared_fork_server")


# --- case 2 (the single run's bytes, a user's scheme, not-applicable cells) is
# tests/test_sweep_equals_run.py's, for every sweepable command


# --- case 4: signals and a killed worker -------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


# SIGTERM to the sweep's process alone; SIGHUP (what closing a terminal sends) goes to the
# whole process group, workers included: tests/test_hostile_bombs.py's
# test_sighup_to_a_sweeps_process_group_prints_no_traceback, with these assertions
@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_a_signal_stops_the_sweep_keeps_its_points_and_its_workers_end(tmp_path, sig):
    """The sweep sends itself the signal as its third point is done (12 still to run):
    it ends as a stop does, the finished points merged, every worker gone."""
    out, pids = tmp_path / "run", tmp_path / "workers"
    args = ["sweep", "depth-sweep", *TINY, "--layers", "2,4,8,16,32", "--seeds", "3", "--no-grads",
            "--workers", "2", "-q", "--out", str(out)]  # fmt: skip
    proc, stdout, stderr = signalled_run(args, ENV, sig.name, "sweep", 3, children=pids)
    workers = [int(p) for p in pids.read_text().split()]
    assert workers, "the sweep has no worker processes"
    assert proc.returncode == 1, stderr
    assert f"stopped by {sig.name}" in stderr and "Traceback" not in stderr
    assert f"tinit sweep --resume {out}" in stderr and stdout.strip() == str(out)
    doc = config(out)
    assert doc["complete"] is False and doc["error"].startswith(f"stopped by {sig.name}")
    counts = doc["sweep"]["counts"]
    assert counts["queued"] == counts["running"] == 0 and counts["done"] >= 3 and counts["failed"] > 0
    assert (out / "depth_sweep.csv").is_file() and (out / "depth_sweep.png").is_file()
    rows = (out / "depth_sweep.csv").read_text().count("\n") - 1
    assert rows == counts["done"]
    # the sweep joins its workers before it exits (they are its children: none is left a zombie)
    assert not [w for w in workers if _alive(w)], "worker processes outlived the sweep"


def test_a_killed_worker_fails_only_its_own_point(tmp_path, monkeypatch):
    """SIGKILL to one local worker made every pending point fail with BrokenProcessPool.
    The sweep runs in this process: its workers are children of the fork server (as a
    slot's fresh worker is in `tinit sweep`: a real process forks its first ones itself)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    figures_built_not_saved(monkeypatch)  # (what is tested is the points and the exit code)
    server = start_fork_server()
    out = tmp_path / "run"
    killed: list[int] = []

    def kill_a_worker() -> None:  # once 2 points are written, while the other 10 run
        workers = children_of(server)
        if workers:
            killed.append(workers[0])
            os.kill(workers[0], signal.SIGKILL)

    argv = ["sweep", "depth-sweep", *TINY, "--layers", "2,4,8", "--seeds", "2", "--no-grads", "--pre-norm",
            "--workers", "2", "-q", "--out", str(out)]  # fmt: skip
    at_sweep_update(monkeypatch, lambda counts: counts["done"] >= 2, kill_a_worker)  # 10 still to run
    res = runner.invoke(app, argv)  # 12 points
    assert killed, "no worker to kill"
    doc = config(out)
    failed = {n: p for n, p in doc["sweep"]["points"].items() if p["state"] != "done"}
    assert len(doc["sweep"]["points"]) == 12
    assert len(failed) <= 1, failed  # the victim's point (none if it was between two points)
    for p in failed.values():
        assert "worker process died (killed by SIGKILL)" in p["reason"]
    assert res.exit_code == (1 if failed else 0), res.output
    assert "Traceback" not in res.output


# --- case 14: a full disk while merging, an empty record ------------------------------------


def test_a_full_disk_while_merging_is_one_line_and_config_says_why(tmp_path, monkeypatch):
    """RLIMIT_FSIZE makes every write past 100 kB fail (EFBIG), as a full disk does: the
    point files fit, the merged plot does not. config.json stayed "running". The limit is
    set on this process for the sweep (SIGXFSZ ignored, as a shell's ulimit -f with the
    signal ignored), after the fork server and the resource tracker started: none of the
    processes it starts keeps it."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    start_fork_server()
    out = tmp_path / "run"
    argv = ["sweep", "variance", *TINY, "--layers", "2", "--init", "naive", "--workers", "1", "-q",
            "--out", str(out)]  # fmt: skip
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, hard))
    try:
        res = runner.invoke(app, argv)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert res.exit_code == 1, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write" in lines[0] and "variance.png" in lines[0], res.stderr
    doc = config(out)
    assert doc["complete"] is False and "variance.png" in doc["error"] and doc["error"] != "running"
    assert (out / "variance.csv").is_file()


@pytest.mark.parametrize(
    "record",
    [
        {},
        {"command": "variance"},
        {"command": "rm", "args": [], "runs": []},
        {"command": "variance", "args": "x", "runs": []},
        [],
        None,
    ],
)
def test_resume_on_an_empty_or_edited_record_is_one_line(tmp_path, record):
    (tmp_path / "config.json").write_text(json.dumps({"sweep": record}))
    assert_one_line_error(runner.invoke(app, ["sweep", "--resume", str(tmp_path)]), "--resume")


# --- case 15: a newline in an sbatch value ------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--slurm-arg", "constraint=a100\n#SBATCH --wrap=evil"),
        ("--partition", "gpu\nX"),
        ("--account", "a\rb"),
        ("--qos", "q\n"),
        ("--mem", "16G\n"),
    ],
)
def test_sbatch_values_with_a_newline_are_refused(tmp_path, option, value):
    pytest.importorskip("submitit")
    out = tmp_path / "run"
    res = runner.invoke(
        app,
        ["sweep", "variance", *TINY, "--executor", "slurm", "--dry-run", option, value, "--out", str(out)],
    )
    assert_one_line_error(res, option, out)
    assert "#SBATCH --wrap" not in res.stdout
