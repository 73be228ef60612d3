"""Shared fixtures: tiny seeded configurations that run in milliseconds on the CPU, and
the one-node SLURM cluster every sweep test module shares (one per test process: two
started by one process would share its folder)."""

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# Python's byte-code cache, on for the suite even where the environment turns it off
# (PYTHONDONTWRITEBYTECODE=1 on these machines): every `tinit` the tests start would
# otherwise compile tinit's ~100 modules from source (~0.3 s a process), and pytest would
# rewrite every test module's asserts afresh in each worker. Test modules collected
# after this file are cached; child processes inherit the environment.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# numpy's OpenBLAS on one thread in the xdist workers and every process a test starts
# (they inherit this environment; this process's numpy is loaded already, by a plugin):
# with a pool of its own per worker on 2 cores, its small solves (coord-check's Markov
# chain, the fits) spun against the other worker, ~20% of the coord-check, lr-transfer
# and depth-sweep tests' CPU. The models' compute is torch's, one thread (below).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from tinit.model.config import InitConfig, ModelConfig, RunConfig  # noqa: E402 (after the byte-code switch)

#: Seconds each heavy test file took in a recent run (scripts/test_file_seconds.py writes it).
FILE_SECONDS = Path(__file__).with_name("file-seconds.json")


def pytest_configure(config):
    # xdist orders the files by their number of tests, which put one-test files of 10 s
    # at the end, on one worker while the other had finished; they go by weight instead
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    """The heaviest files first, by FILE_SECONDS (longest first: under ``--dist loadfile``
    a worker takes the next file when it is free, so the short ones fill the end). A
    stable sort: each file's tests keep their order, files of no record theirs."""
    import json

    seconds = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.exists() else {}
    items.sort(key=lambda item: -seconds.get(item.path.name, 0.0))


@pytest.fixture(scope="session", autouse=True)
def _one_thread_for_every_fixture():
    # module-scoped fixtures are set up before a function-scoped autouse fixture: without
    # this they ran at torch's default thread count (2 x 2 threads on 2 cores under -n 2,
    # up to 6x the CPU time of one thread on these tiny models)
    torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _click_command_built_once():
    # typer's CliRunner.invoke builds the app's click command at every call; every test's
    # runner takes the one built once (helpers.click_command)
    import typer.testing
    from helpers import click_command

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(typer.testing, "_get_command", click_command)
        yield


@pytest.fixture(autouse=True)
def _help_names_kept():
    """Every command keeps -h and --help after each test. The click command is shared by
    the whole process (above), and click keeps the first help option it makes for a
    command: a context made without the group's settings gave it --help alone, and a
    later test of `tinit COMMAND -h` failed, on whichever worker drew that order. Checked
    after every test, so the test that did it fails, on every machine."""
    yield
    from helpers import click_command

    from tinit.cli import app

    for name, command in click_command(app).commands.items():
        made = getattr(command, "_help_option", None)  # (click 8.2+: the cached help option)
        if made is not None and set(made.opts) != {"-h", "--help"}:
            command._help_option = None  # (the next test starts clean)
            pytest.fail(f"this test left `tinit {name}` with help names {made.opts}: make contexts "
                        "under the group's (helpers.command_context)")  # fmt: skip


@pytest.fixture(scope="module")
def shared_fork_server():
    """For a module whose sweeps run in process (``pytestmark =
    pytest.mark.usefixtures("shared_fork_server")``): their workers come from one
    preloaded fork server (helpers.one_fork_server)."""
    from helpers import one_fork_server

    with one_fork_server():
        yield


@pytest.fixture(autouse=True)
def _deterministic_threads():
    # small models are faster single-threaded and results do not depend on the thread count
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def tiny_model() -> ModelConfig:
    return ModelConfig(n_layers=3, d_model=32, n_heads=2, vocab_size=64, max_seq_len=16)


@pytest.fixture
def tiny_run() -> RunConfig:
    return RunConfig(batch=2, seq_len=16, device="cpu")


@pytest.fixture
def tiny_init() -> InitConfig:
    return InitConfig(seed=3)


ROOT = Path(__file__).resolve().parents[1]


def slurm_missing() -> str | None:
    """Why the one-node SLURM cluster cannot run here (a skip reason), or None."""
    import importlib.util

    missing = [b for b in ("slurmctld", "slurmd", "munged", "sbatch") if shutil.which(b) is None]
    if missing:
        return f"SLURM not installed ({', '.join(missing)} missing): apt-get install -y slurm-wlm munge"
    if os.geteuid() != 0:
        return "the one-node SLURM cluster needs root (slurmd runs jobs as their user)"
    if importlib.util.find_spec("submitit") is None:
        return "could not import 'submitit': pip install -e '.[slurm]'"
    return None


@pytest.fixture(scope="session")
def _slurm_starting():
    """scripts/slurm-local-cluster.sh start, begun (not waited for): the folder and the
    script's process. Stopped at the session's end without waiting: the daemons take
    ~1.5 s to exit, and their folder is removed after them, in the background."""
    folder = Path(f"/tmp/tinit-slurm-test-{os.getpid()}")  # short: munge's socket path has a limit
    script = str(ROOT / "scripts" / "slurm-local-cluster.sh")
    env = {**os.environ, "TINIT_SLURM_PORT": str(free_port_pair())}
    start = subprocess.Popen([script, "start", str(folder)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=env)  # fmt: skip
    yield folder, start
    try:
        start.wait(timeout=60)  # (its output: one line)
    finally:
        stop = '{ "$0" stop "$1"; rm -rf "$1"; } </dev/null >/dev/null 2>&1 &'
        subprocess.run(["bash", "-c", stop, script, str(folder)], timeout=60)


@pytest.fixture(scope="module", autouse=True)
def _slurm_starts_with_its_module(request):
    """A module with a selected test that takes slurm_cluster begins starting it with the
    module's first test, not its own: slurmctld schedules no job in its first ~3 s, which
    the module's other tests then cover."""
    mine = [i for i in request.session.items if getattr(i, "module", None) is request.module]
    if any("slurm_cluster" in getattr(i, "fixturenames", ()) for i in mine):
        if slurm_missing() is None:
            request.getfixturevalue("_slurm_starting")


@pytest.fixture(scope="session")
def slurm_cluster(request):
    """The one-node cluster of scripts/slurm-local-cluster.sh, started (once per test
    process, by _slurm_starting), with SLURM_CONF set meanwhile."""
    reason = slurm_missing()
    if reason is not None:
        pytest.skip(reason)
    folder, start = request.getfixturevalue("_slurm_starting")
    output, _ = start.communicate(timeout=60)
    assert start.returncode == 0, output
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(folder / "slurm.conf")
    yield folder
    if before is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = before


def free_port_pair() -> int:
    """A port p with p and p + 1 free (slurmctld's and slurmd's), so a test cluster
    never meets another SLURM on this machine."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise RuntimeError("no two free consecutive ports")
