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


#: The tiny model of the CLI tests: d 16, 2 heads, 8 tokens, batch 2, vocabulary 32.
TINY = ["--d-model", "16", "--heads", "2", "--seq-len", "8", "--batch", "2", "--vocab", "32"]


def tiny(layers: int | None = None, **over: str) -> list[str]:
    """The tiny model's arguments (:data:`TINY`), at ``layers`` and with ``over`` (by
    option: ``vocab="16"``) in place of its values."""
    args = dict(zip(TINY[::2], TINY[1::2], strict=True))
    args.update({"--" + k.replace("_", "-"): str(v) for k, v in over.items()})
    out = [x for kv in args.items() for x in kv]
    return ["--layers", str(layers), *out] if layers is not None else out


def at_sweep_update(patch, ready: Callable[[dict], bool], act: Callable[[], None]) -> list:
    """Call ``act()`` once, inside the sweep, at its first progress update
    (``tinit.sweep.run.run_sweep``'s ``update``, after a point changed state) at which
    ``ready(counts)`` holds (``counts``: points by state, done, running, queued, failed).
    The sweep waits while ``act`` runs, so what it acts on (a worker, the points still to
    run) is there: no poller racing the points. ``patch`` is pytest's monkeypatch (or
    anything with its ``setattr``). Returns a list that holds True once it acted."""
    from tinit.sweep import run as sweep_run

    real, acted = sweep_run.run_sweep, []

    def run_sweep(plan, executor, run_dir, args, update=lambda info: None, *rest, **kw):
        def hooked(info):
            update(info)
            if not acted and ready(sweep_run.counts(info)):
                acted.append(True)
                act()

        return real(plan, executor, run_dir, args, hooked, *rest, **kw)

    patch.setattr(sweep_run, "run_sweep", run_sweep)
    return acted


def at_rows_written(patch, ready: Callable[[int], bool], act: Callable[[], None]) -> list:
    """Call ``act()`` once, right after the run's writer (``tinit.cli.runner.RunWriter``)
    has put rows on disk for the ``n``-th time with ``ready(n)``: the run goes on only
    once ``act`` returns."""
    from tinit.cli import runner

    real, acted, writes = runner.RunWriter.partial, [], []

    def partial(self, so_far):
        before = self.last
        real(self, so_far)
        if self.last is not before:
            writes.append(1)
            if not acted and ready(len(writes)):
                acted.append(True)
                act()

    patch.setattr(runner.RunWriter, "partial", partial)
    return acted


#: A real `python -m tinit ARGS` process that sends itself SIGNAL at an event of its run
#: (:func:`signalled_run`): the tests' helpers installed, then tinit's own main.
_SIGNALLED = """
import os, signal, sys, types
sys.path.insert(0, {tests!r})
import helpers
patch = types.SimpleNamespace(setattr=setattr)
if {figures!r}:
    helpers.figures_built_not_saved(patch)
sig = getattr(signal, {sig!r})


def send():
    if {children!r}:  # who this process has started (its workers), for the test to watch
        with open({children!r}, "w") as f:
            f.write(" ".join(map(str, helpers.children_of(os.getpid()))))
    if {group!r}:
        os.killpg(os.getpgrp(), sig)
    else:
        os.kill(os.getpid(), sig)


if {event!r} == "sweep":
    helpers.at_sweep_update(patch, lambda c: c["done"] >= {n!r}, send)
else:
    helpers.at_rows_written(patch, lambda n: n >= {n!r}, send)
import runpy
runpy.run_module("tinit", run_name="__main__", alter_sys=True)
"""


def signalled_run(args: list[str], env: dict, sig: str, event: str, n: int, group: bool = False,
                  figures: bool = False, children: Path | None = None, timeout: float = 600,
                  **popen):  # fmt: skip
    """Run ``tinit ARGS`` in a real process that sends ``sig`` (``"SIGTERM"``) to itself,
    or to its whole process group (``group``: what closing a terminal does with SIGHUP),
    when its sweep has ``n`` points done (``event="sweep"``) or its rows have been written
    ``n`` times (``event="rows"``): an event of the run itself, never a guess at its pace.
    With ``children``, the pids of the processes it has started then (its workers) are
    written to that file first. Returns the finished ``subprocess.Popen`` and its
    (stdout, stderr); ``timeout`` guards against a hang only."""
    import subprocess
    import sys

    code = _SIGNALLED.format(tests=str(ROOT / "tests"), figures=figures, sig=sig, group=group, event=event,
                             n=n, children=str(children) if children else None)  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc, stdout, stderr


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
