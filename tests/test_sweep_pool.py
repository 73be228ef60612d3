"""Guards the local workers of `tinit sweep`: forked, not spawned, from a process that
imported torch and tinit once (`tinit sweep` itself, before any thread runs, for every
worker; a preloaded fork server where forking it is not safe), and when `tinit sweep`
returns nothing it started is still running: no worker, fork server or resource
tracker left in its process group."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TINY, one_fork_server, start_fork_server

from tinit.sweep import local


def group_members(pgid: int) -> list[str]:
    """'pid state command' of every process in process group ``pgid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if int(fields[2]) == pgid:
            out.append(f"{entry.name} {fields[0]} {stat[stat.index('(') : stat.rindex(')') + 1]}")
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_nothing_is_left_in_the_process_group_when_sweep_returns(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "tinit", "sweep", "depth-sweep", "--layers", "2,4", "--seeds", "1",
           "--no-grads", *TINY, "--device", "cpu", "--workers", "2", "--out", str(out), "-q"]  # fmt: skip
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    stdout, stderr = proc.communicate(timeout=300)
    left = group_members(proc.pid)  # at once: a helper exiting "soon after" is still there
    assert proc.returncode == 0, stderr
    assert stdout.strip() == str(out) and "leaked" not in stderr, stderr
    assert left == []
    assert (out / "config.json").is_file() and len(list((out / "points").iterdir())) == 8
    # both workers were forked from `tinit sweep` itself, at the start: neither came from a
    # fork server importing torch while the other measured (2 workers were slower than 1)
    where = [json.loads((d / "config.json").read_text())["where"] for d in (out / "points").iterdir()]
    assert {w["ppid"] for w in where} == {proc.pid} and len({w["pid"] for w in where}) == 2


def test_workers_are_forked_from_a_preloaded_server():
    """Linux: a fork server that imports the experiments (hence torch) once."""
    if sys.platform != "linux":
        pytest.skip("the start method differs by platform")
    ctx = local.context()
    assert ctx.get_start_method() == "forkserver"
    assert "tinit.experiments.measure.depth_sweep" in local.PRELOAD
    from multiprocessing import forkserver

    assert "tinit.experiments.measure.depth_sweep" in forkserver._forkserver._preload_modules


def test_a_worker_takes_the_environment_of_the_parent_not_of_the_server(monkeypatch, tmp_path):
    """A forked worker inherits the fork server's environment from when it started;
    the sweep hands it the parent's as it is now, as a spawned worker would have it."""
    from concurrent.futures import ProcessPoolExecutor

    with one_fork_server():  # (helpers: the server the sweep modules share, if it runs)
        ctx = local.context()
        start_fork_server()  # before the variable is set
        monkeypatch.setenv("TINIT_TEST_MARK", "after-the-server-started")
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        with ProcessPoolExecutor(1, mp_context=ctx, initializer=local._init_worker,
                                 initargs=(None, None, dict(os.environ))) as pool:  # fmt: skip
            mark, threads = pool.submit(_worker_view).result(timeout=120)
    assert mark == "after-the-server-started" and threads == 1


def _worker_view():
    import torch

    return os.environ.get("TINIT_TEST_MARK"), torch.get_num_threads()
