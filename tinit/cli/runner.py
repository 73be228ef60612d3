"""The part every command shares after parsing: check the device, make the run
folder, run the experiment under a progress bar, write CSVs, config.json and
plots, print the summary and the folder. Failures keep what was measured."""

from collections.abc import Callable, Iterable
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

import typer
from matplotlib.figure import Figure
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..experiments.common import ExperimentResult, IncompleteRun, resolve_device
from ..model.config import ConfigError
from ..results.plots import save_figure
from ..results.rundir import OutputError, new_run_dir, write_config, write_csvs
from ..results.tables import cost_line
from .options import SharedOptions, bad_option


@dataclass
class Outputs:
    """What a command adds to its run folder from a result."""

    figures: Callable[[ExperimentResult], dict[str, Figure]] = lambda r: {}
    tables: Callable[[ExperimentResult], Iterable] = lambda r: ()
    files: Callable[[ExperimentResult, Path], list[Path]] = lambda r, d: []
    notes: list[str] = field(default_factory=list)


#: Set by ``tinit sweep``: :func:`execute` hands it (command, opts, plan, outputs) and runs nothing.
SWEEP_CAPTURE: ContextVar[Callable | None] = ContextVar("SWEEP_CAPTURE", default=None)


def configs_or_exit(build: Callable):
    """Call ``build`` (which makes configs); a ConfigError becomes a usage error."""
    try:
        return build()
    except ConfigError as exc:
        raise bad_option(exc) from None


@contextmanager
def progress_bar(quiet: bool, description: str):
    """Yields a progress callback (done, total); a rich bar on stderr."""
    if quiet:
        yield None
        return
    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def execute(
    command: str,
    opts: SharedOptions,
    experiment: Callable[..., ExperimentResult],
    outputs: Outputs,
    plan: Callable | None = None,
) -> ExperimentResult | None:
    """Run ``experiment(progress=...)`` and write everything; exit 1 on a failed run.

    ``plan``: makes the command's grid as points (:mod:`tinit.experiments.points`) for
    ``tinit sweep``, which captures it here instead of running (returns None)."""
    capture = SWEEP_CAPTURE.get()
    if capture is not None:
        capture(command, opts, plan, outputs)
        return None
    try:
        resolve_device(opts.device)
    except ConfigError as exc:
        raise bad_option(exc) from None
    try:
        run_dir = new_run_dir(command, opts.out)
    except OutputError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--out'") from None
    failure = None
    try:
        with progress_bar(opts.quiet, command) as progress:
            result = experiment(progress=progress)
    except IncompleteRun as exc:
        result, failure = exc.result, str(exc)
    except ConfigError as exc:
        if not any(run_dir.iterdir()):  # nothing measured: leave no empty run folder behind
            run_dir.rmdir()
        raise bad_option(exc) from None
    write_csvs(run_dir, result.frames)
    write_config(run_dir, command, result.meta, complete=result.complete, error=result.error)
    if result.frames and all(len(df) for df in result.frames.values()):
        for stem, fig in outputs.figures(result).items():
            save_figure(fig, run_dir, stem, opts.format)
        outputs.files(result, run_dir)
    console = Console()
    if not opts.quiet:
        for table in outputs.tables(result):
            console.print(table)
        for note in outputs.notes:
            console.print(note)
        cost = cost_line(result.meta)
        if cost:
            console.print(cost, style="dim", highlight=False)
    if failure:
        typer.echo(f"Error: run incomplete ({failure}); what was measured is in {run_dir}", err=True)
    typer.echo(str(run_dir))
    if failure:
        raise typer.Exit(1)
    return result
