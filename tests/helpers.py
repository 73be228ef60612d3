"""Assertions the CLI tests share: the one-line usage error, and the reference pages."""

import functools
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def reference_page(command: str) -> str:
    """The text of ``docs/reference/<command>.md``, the command's reference page."""
    return (ROOT / "docs" / "reference" / f"{command}.md").read_text()


def assert_one_line_error(res, option: str, out: Path | None = None) -> None:
    """Bad input: exit 2, one line on stderr that starts with Error: and names the
    option, no traceback, and (when ``out`` is given) no run folder created."""
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), res.stderr
    assert option in lines[0], lines[0]
    assert "Traceback" not in res.output
    if out is not None:
        assert not out.exists()


class FirstStep(BaseException):
    """Raised by :func:`validation_only`'s progress callback at a run's first step. A
    BaseException: the runner reports any Exception out of an experiment as an internal
    error (exit 1), which would end every accepted call there instead of at exit 0."""


def validation_only(monkeypatch) -> None:
    """Make every command stop at the first measured step: parsing, validation, config
    building, device resolution, the run folder's claim and the experiment's own checks
    all run as usual, then the command exits 0. For fuzzing input handling at the cost
    of a single block (the full runs are fuzzed separately, with valid input)."""
    import sys

    import typer

    from tinit.cli import runner

    real = runner.execute

    def execute(command, opts, experiment, outputs, plan=None, wants_run_dir=False):
        def first_step(progress=None, on_partial=None, **extra):
            def stop(done, total):
                raise FirstStep

            experiment(progress=stop, on_partial=on_partial, **extra)
            raise FirstStep  # an experiment with no step to report

        try:
            real(command, opts, first_step, outputs, plan=plan, wants_run_dir=wants_run_dir)
        except FirstStep:
            raise typer.Exit(0) from None

    for name, module in list(sys.modules.items()):
        if name.startswith("tinit.cli.") and getattr(module, "execute", None) is real:
            monkeypatch.setattr(module, "execute", execute)


@functools.cache
def click_command(app):
    """``app``'s click command, built once per process: typer builds the whole tree of
    commands and options at every call (~60-120 ms for tinit's), where a `tinit` process
    builds it once. conftest hands it to every CliRunner; its callbacks look the
    command's module up at each call, so a monkeypatched ``execute`` or experiment is
    still what runs."""
    import typer.main

    return typer.main.get_command(app)


def command_context(name: str, args: list[str]):
    """The click context of ``tinit NAME ARGS``, parsed as the CLI parses it (nothing
    runs), under the group's context as ``tinit`` makes it. Made without that parent, a
    context would give the command click's default help names (``--help`` alone), and click
    keeps the first help option it builds on the command: a later ``tinit NAME -h`` in
    the same process would then fail. Use as a context manager to run its close
    callbacks."""
    import click

    from tinit.cli import app

    group = click_command(app)
    parent = click.Context(group, info_name="tinit", **group.context_settings)
    command = group.get_command(parent, name)
    assert command is not None, name
    return command.make_context(name, list(args), parent=parent)


def figures_built_not_saved(monkeypatch, rendered: tuple[str, ...] = ()) -> None:
    """Every figure a command builds is built (its plot function runs to the end), then
    not rendered: the files it would write are created empty. For tests that assert on a
    run's CSVs and exit code, where the 200-dpi PNG is most of the time (about 1 s a
    figure); the same figures are drawn, and held to the reader's rules, by
    tests/test_reader_rules.py and the plot tests. ``rendered``: the stems still saved
    as usual (a figure whose content only this test draws)."""
    from pathlib import Path

    from tinit.results import plots

    real = plots.save_figure

    def save_figure(fig, run_dir, stem, formats=("png",)):
        if stem in rendered:
            return real(fig, run_dir, stem, formats)
        paths = [Path(run_dir) / f"{stem}.{fmt}" for fmt in formats]
        for path in paths:
            path.touch()
        return paths

    monkeypatch.setattr(plots, "save_figure", save_figure)


def final_result_only(monkeypatch) -> None:
    """No result so far after each unit (driver.Run.partial does nothing): for tests that
    read what a finished run leaves. The result so far is assembled (fits, summaries) and
    written after the first unit and then whenever the writer's interval has passed, and
    replaced by the final one; tests/test_run_promises.py (rows on disk as measured, at a
    bounded cost; a signal keeps them) and test_hostile_train.py hold the partial
    results to their rules."""
    from tinit.experiments import driver

    monkeypatch.setattr(driver.Run, "partial", lambda self: None)


_SERVER_STOPPED_AT_EXIT = False


@contextmanager
def one_fork_server():
    """While inside, every in-process local sweep shares one preloaded fork server (an
    in-process sweep may not fork its workers from a process that has computed, and
    stops its fork server when it ends: each started its own, importing torch and the
    experiments, ~3 s of CPU), which preloads torch's compiler too (the first optimizer
    imports it: each worker of a training command did). For a module-scoped fixture. The
    server is left running when the module ends, for the next module of this test
    process that takes it (one start per process, not per module), and stopped when the
    process exits (a sweep outside this helper stops it as every sweep does); that nothing
    of a sweep outlives `tinit sweep` is tests/test_sweep_pool.py's, on a real process."""
    import atexit

    import pytest

    from tinit.sweep import local

    global _SERVER_STOPPED_AT_EXIT
    if not _SERVER_STOPPED_AT_EXIT:
        atexit.register(local.stop_helpers)  # the real one: not patched here yet
        _SERVER_STOPPED_AT_EXIT = True
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(local, "stop_helpers", lambda tracker=True: None)
        mp.setattr(local, "PRELOAD", [*local.PRELOAD, "torch._dynamo"])
        yield


def start_fork_server() -> int:
    """Start (inside :func:`one_fork_server`) the fork server and multiprocessing's
    resource tracker now, if they are not running; returns the server's pid, the parent
    of every in-process local sweep's workers."""
    from multiprocessing import forkserver

    from tinit.sweep import local

    local.context()  # (the preload)
    local.start_tracker()
    forkserver.ensure_running()
    return forkserver._forkserver._forkserver_pid


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (from /proc), in pid order: a real
    `tinit sweep`'s workers, or the fork server's (an in-process sweep's)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return sorted(out)


@contextmanager
def act_when(ready: Callable[[], bool], act: Callable[[], None], timeout: float = 120):
    """While inside, another thread polls ``ready()`` (every 10 ms, for ``timeout`` s) and
    calls ``act()`` once when it holds: a signal to this process or a kill of a worker,
    from outside an in-process run, as another process would send it."""
    import threading
    import time

    done = threading.Event()

    def poll() -> None:
        deadline = time.monotonic() + timeout
        while not done.is_set() and time.monotonic() < deadline:
            if ready():
                act()
                return
            time.sleep(0.01)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=10)


def sigterm_when(
    cmd: list[str], env: dict, ready: Callable[[], bool], timeout: float = 120
) -> tuple[int, str, str]:
    """Start ``cmd``, wait (it still running, within ``timeout``) until ``ready()``, send
    it SIGTERM and return (exit code, stdout, stderr); the process is killed in any case."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc.returncode, stdout, stderr


def skip_module_without(package: str) -> None:
    """Skip the calling test module when ``package`` (an extra) is not installed, without
    importing it: ``pytest.importorskip`` would import transformers (~1 s) in every
    process that merely collects the module."""
    import importlib.util

    import pytest

    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (pip install -e '.[hf]')", allow_module_level=True)


def slurm_polls_every(monkeypatch, seconds: float) -> None:
    """Every SLURM executor the CLI builds polls ``squeue`` and the point folders every
    ``seconds`` instead of its default 0.5 s: a test sees a task end sooner (each
    detection waited 0.25 s on average), with nothing else of the executor changed."""
    from tinit.sweep.slurm import SlurmExecutor

    real = SlurmExecutor.__init__

    def init(self, *args, **kwargs):
        real(self, *args, **{**kwargs, "poll_s": seconds})

    monkeypatch.setattr(SlurmExecutor, "__init__", init)
