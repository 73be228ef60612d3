"""The part every command shares after parsing: check the device, claim the run
folder, run the experiment under a progress bar writing rows as they are measured,
write CSVs, plots and config.json, print the summary and the folder.

What a run promises (docs/run-folders.md, "What a run promises"): the folder is claimed
exclusively before anything runs; config.json says ``"complete": false`` until every
file is in place; the rows of finished units are rewritten on disk as they are measured
(:class:`RunWriter`: the first at once, then whenever the time since the last write is
ten times what that write cost); SIGINT, SIGTERM and SIGHUP, out of memory, an internal
error and write failures all keep every finished unit, mark the run incomplete, name
the folder and exit 1."""

import gc
import signal
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from .. import process
from ..experiments.device import resolve_device
from ..experiments.result import (
    ExperimentResult,
    IncompleteRun,
    Stopped,
    failure_reason,
    is_run_failure,
)
from ..model.config import ConfigError
from ..model.structure import override_lines
from ..results.rundir import (
    FolderTaken,
    OutputError,
    RunFolder,
    claim_run_dir,
    environment,
    write_config,
    write_csvs,
)
from ..results.tables import cost_line, output_console, print_tables
from ..results.writer import internal_error, write_result
from .clickcompat import ClickException, Exit
from .common import SWEEP_CAPTURE
from .configs import OptionError, Options


@dataclass
class Outputs:
    """What a command adds to its run folder from a result."""

    # stem -> matplotlib Figure (matplotlib is imported by the plotting, not here: `tinit
    # sweep` loads it while its workers measure)
    figures: Callable[[ExperimentResult], dict] = lambda r: {}
    tables: Callable[[ExperimentResult], Iterable] = lambda r: ()
    files: Callable[[ExperimentResult, Path], list[Path]] = lambda r, d: []
    notes: list[str] = field(default_factory=list)


@contextmanager
def progress_bar(quiet: bool, description: str):
    """Yields a progress callback (done, total[, detail]); a rich bar on stderr, with the
    time spent, an estimate of the time left (from the rate of the steps so far) and the
    experiment's own detail (audit --checkpoint: the block, the bytes read, the rate)."""
    if quiet:
        yield None
        return
    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("left"), TimeRemainingColumn(), TextColumn("{task.fields[detail]}"), console=console,
        transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task(description, total=None, detail="")

        def update(done: int, total: int, detail: str | None = None) -> None:
            if detail is None:
                bar.update(task, completed=done, total=total)
            else:
                bar.update(task, completed=done, total=total, detail=detail)

        yield update


#: The signals that stop a run: each is handled like Ctrl-C.
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


class StopSignals:
    """While active, SIGINT, SIGTERM and SIGHUP raise :class:`Stopped` in the main
    thread (the run stops and keeps its rows). After :meth:`defer`, they are only
    recorded in ``caught``: the writing checks between files and stops there."""

    def __init__(self) -> None:
        self.caught: list[str] = []
        self.deferred = False
        self._before: dict[int, object] = {}

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        self.caught.append(name)
        if not self.deferred:
            raise Stopped(name)

    def __enter__(self) -> "StopSignals":
        for sig in STOP_SIGNALS:
            try:
                self._before[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: signals stay as they were
                pass
        return self

    def defer(self) -> None:
        """From now on only record signals; ``caught`` starts empty again."""
        self.deferred = True
        self.caught = []

    def __exit__(self, *exc) -> None:
        for sig, before in self._before.items():
            signal.signal(sig, before)


#: A partial write waits until the time since the last one is this many times what that
#: one cost (building the frames and writing them): the rows on disk then cost at most
#: about 1/11 of the run, however many units, where a write after every unit grew with
#: the square of the units.
PARTIAL_INTERVAL = 10


class RunWriter:
    """Writes a run folder: the rows so far while the run measures (CSVs and a
    config.json still saying ``complete: false``), then everything at the end.

    :meth:`partial` is the experiment's ``on_partial``: after each finished unit it gets
    the function that builds the result so far, and builds and writes it after the
    first unit and then whenever ``PARTIAL_INTERVAL`` times the last write's cost has
    passed since that write ended. Every stop the run survives (a signal, out of memory,
    an error) writes every finished unit at the end (:meth:`so_far`, or the result an
    IncompleteRun holds); a hard kill (SIGKILL, power) loses the unit in progress and
    those finished since the last write: at most ten times that write's duration."""

    clock = staticmethod(time.perf_counter)

    def __init__(self, folder: RunFolder, command: str, base: dict):
        self.folder, self.command, self.base = folder, command, base
        self.last: ExperimentResult | None = None  # the result of the last write
        self.pending: Callable[[], ExperimentResult] | None = None  # units finished since
        self.due = -float("inf")  # (clock) when the next write may start
        self.written = False

    @property
    def path(self) -> Path:
        return self.folder.path

    def partial(self, so_far: Callable[[], ExperimentResult]) -> None:
        """After a finished unit: save the rows measured so far if a write is due (every
        file renamed into place), else keep ``so_far`` for :meth:`so_far`."""
        self.pending = so_far
        start = self.clock()
        if start < self.due:
            return
        result = self.last = so_far()
        self.pending = None
        write_csvs(self.path, result.frames, result.not_applicable)
        write_config(self.path, self.command, {**self.base, **result.meta}, complete=False, error=None)
        self.written = True
        end = self.clock()
        self.due = end + PARTIAL_INTERVAL * (end - start)

    def so_far(self) -> ExperimentResult | None:
        """The result of every finished unit (for a run stopped outside a unit, or by an
        error): built from the last ``so_far`` handed over, when it was not written."""
        if self.pending is not None:
            try:
                self.last, self.pending = self.pending(), None
            except Exception:  # (a run ending in tinit's error: its frames may be what fails)
                pass
        return self.last

    def config(self, result: ExperimentResult, complete: bool, error: str | None, **extra) -> None:
        meta = {**self.base, **result.meta}
        write_config(self.path, self.command, meta, complete=complete, error=error, **extra)


def release_memory() -> None:
    """After an out-of-memory stop: collect what the failed configuration left and, on
    glibc, hand freed heap pages back to the system (else RLIMIT_AS stays exhausted)."""
    gc.collect()
    process.return_freed_memory()


def _fail(message: str, run_dir: Path) -> None:
    typer.echo(f"Error: {message}; what was measured is in {run_dir}", err=True)


def execute(
    command: str,
    opts: Options,
    experiment: Callable[..., ExperimentResult],
    outputs: Outputs,
    plan: Callable | None = None,
    wants_run_dir: bool = False,
) -> ExperimentResult | None:
    """Run ``experiment(progress=..., on_partial=...)`` (``on_partial`` gets a function
    building the result so far after each unit: every experiment takes it; the rows are
    written as :class:`RunWriter` says) and write everything
    (:func:`tinit.results.writer.write_result`, as `tinit sweep` does); exit 1 on a
    failed, stopped or unwritable run.

    ``wants_run_dir``: the experiment also takes ``run_dir`` (the claimed folder: train
    writes its checkpoints there as they are saved).

    ``plan``: makes the command's grid as points (:mod:`tinit.experiments.points`) for
    ``tinit sweep``, which captures it here instead of running (returns None)."""
    process.imports_done()  # (tinit.process: the console's collector, off since its start)
    capture = SWEEP_CAPTURE.get()
    if capture is not None:
        capture(command, opts, plan, outputs)
        return None
    try:
        resolve_device(opts.values.get("device", "auto"))  # (params, inits: no --device, "auto")
    except ConfigError as exc:
        raise OptionError(exc) from None
    try:
        folder = claim_run_dir(command, opts.out, config={"command": command, **environment()})
    except FolderTaken as exc:
        raise typer.BadParameter(str(exc), param_hint="'--out'") from None
    except OutputError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--out'") from None
    run_dir = folder.path
    writer = RunWriter(folder, command, {})
    failure: str | None = None
    extra = {"run_dir": run_dir} if wants_run_dir else {}  # (train's checkpoints go into the run folder)
    with StopSignals() as signals:
        try:
            with progress_bar(opts.quiet, command) as progress:
                result = experiment(progress=progress, on_partial=writer.partial, **extra)
        except IncompleteRun as exc:
            result, failure = exc.result, str(exc)
        except ConfigError as exc:
            if not writer.written:  # nothing measured: leave no run folder behind
                folder.abandon()
            raise OptionError(exc) from None
        except OutputError as exc:
            try:  # say why in config.json, if the folder still takes it
                writer.config(writer.last or ExperimentResult({}), False, str(exc))
            except OutputError:
                pass
            _fail(f"run incomplete, {exc}", run_dir)
            typer.echo(str(run_dir))
            raise typer.Exit(1) from None
        except (ClickException, Exit):  # bad input the experiment found: as a ConfigError
            if not writer.written:
                folder.abandon()
            raise
        except BaseException as exc:
            if is_run_failure(exc):
                failure = failure_reason(exc)
            elif isinstance(exc, Exception):  # a bug: the rows so far are kept, the run says why
                failure = internal_error(exc, run_dir)
            else:
                raise
            result = writer.so_far() or ExperimentResult({}, {}, False, failure)
            result.complete, result.error = False, failure
        if failure and "out of memory" in failure:
            release_memory()  # the writing (plots) needs some
        signals.defer()  # from here a signal stops the writing between two files
        return _finish(command, opts, outputs, writer, result, failure, signals)


def _finish(
    command: str,
    opts: Options,
    outputs: Outputs,
    writer: RunWriter,
    result: ExperimentResult,
    failure: str | None,
    signals: StopSignals,
) -> ExperimentResult:
    run_dir = writer.path
    done = write_result(run_dir, command, result, outputs.figures, outputs.files, opts.format, signals.caught,
                        failure, writer.base)  # fmt: skip
    if done.write_error:
        _fail(f"run incomplete{f' ({failure})' if failure else ''}, {done.write_error}", run_dir)
        typer.echo(str(run_dir))
        raise typer.Exit(1)
    failure = failure or done.stopped
    if not opts.quiet and not done.stopped:
        print_summary(result, outputs, failure)
    if done.n_bad:
        typer.echo(non_finite_line(done.counts, done.n_bad), err=True)
    if failure:
        _fail(f"run incomplete ({failure})", run_dir)
    elif done.missing:
        _fail(f"run incomplete (missing {', '.join(done.missing)})", run_dir)
    typer.echo(str(run_dir))
    if failure or done.missing:
        raise typer.Exit(1)
    return result


def print_summary(result: ExperimentResult, outputs: Outputs, failure: str | None) -> None:
    """The terminal's summary of a run: the structure overrides, the command's tables,
    its notes and the cost line (a run stopped before a table's frame has no table)."""
    console = output_console()
    for line in override_lines(result.meta.get("structure") or {}):
        # the header: where a configuration is not the model its scheme's upstream runs
        console.print(f"Overrides the scheme's structure: {line}", highlight=False, soft_wrap=True)
    try:
        tables = outputs.tables(result)
    except KeyError:  # a run that stopped before the frame a table shows has no table
        if failure is None:
            raise
        tables = []
    print_tables(console, tables)
    for note in outputs.notes:
        console.print(note)
    cost = cost_line(result.meta)
    if cost:
        console.print(cost, style="dim", highlight=False)


def non_finite_line(counts: dict[str, dict[str, int]], total: int) -> str:
    """The one terminal line that announces non-finite measured values."""
    parts = [f"{stem}.csv " + ", ".join(f"{cfg} {n}" for cfg, n in by.items()) for stem, by in counts.items()]
    return (
        f"Warning: {total} measured value{'s are' if total != 1 else ' is'} not finite (written nan/inf): "
        + "; ".join(parts)
    )
