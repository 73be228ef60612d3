"""``tinit sweep COMMAND [its options]``: the command's grid as independent points, run
by a local process pool or a SLURM job array, gathered into one run folder."""

from __future__ import annotations

import os
import re
import shutil
import threading
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..model.config import ConfigError
from . import options as opt
from .common import CONSOLE, SWEEP_CAPTURE
from .configs import OptionError, Options, configs_or_exit
from .options import Param

EXECUTOR, SLURM, RESUME = "Executor", "SLURM (--executor slurm)", "Resume"
#: The sweep's own options, recorded so --resume reuses what was not given again.
SWEEP_OPTIONS = ("executor", "workers", "partition", "gpus_per_job", "cpus_per_job", "mem", "time_limit",
                 "array_parallelism", "account", "qos", "slurm_arg", "points_per_job")  # fmt: skip
SLURM_ONLY = {"partition": "--partition", "gpus_per_job": "--gpus-per-job", "cpus_per_job": "--cpus-per-job",
              "mem": "--mem", "time_limit": "--time", "array_parallelism": "--array-parallelism",
              "account": "--account", "qos": "--qos", "slurm_arg": "--slurm-arg",
              "points_per_job": "--points-per-job"}  # fmt: skip
TIME_RE = re.compile(r"^(\d+|\d+:\d{2}(:\d{2})?|\d+-\d{1,2}(:\d{2}){0,2})$")
MEM_RE = re.compile(r"^\d+[KMGT]?$", re.IGNORECASE)
KEY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def _err(message: str, option: str) -> typer.BadParameter:
    return typer.BadParameter(message, param_hint=f"'{option}'")


def capture_plan(ctx: typer.Context, command: str, args: list[str], sweepable: tuple[str, ...],
                 quiet: bool = False):  # fmt: skip
    """Parse ``tinit COMMAND ARGS`` exactly as the command does and return its plan
    (points), its options (quiet when the sweep is) and its outputs, running nothing."""
    if command not in sweepable:
        raise _err(f"{command!r} cannot be swept; choose from {', '.join(sweepable)}", "COMMAND")
    root = ctx.find_root()
    sub = root.command.get_command(root, command)  # type: ignore[attr-defined]
    got: dict = {}
    token = SWEEP_CAPTURE.set(lambda c, o, p, out: got.update(opts=o, plan=p, outputs=out))
    try:
        # the root's help names (-h, --help): click keeps the first help option it makes
        # for a command, so a context without them would take -h from it for the rest of
        # the process (a program calling the CLI more than once, as the tests do)
        sub.main(args=list(args), prog_name=f"tinit sweep {command}", standalone_mode=False,
                 help_option_names=root.help_option_names)  # fmt: skip
    finally:
        SWEEP_CAPTURE.reset(token)
    if not got:  # --help was printed
        raise typer.Exit(0)
    opts = got["opts"].replace(quiet=True) if quiet else got["opts"]
    return configs_or_exit(got["plan"]), opts, got["outputs"]


def _slurm_args(values: list[str]) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, value = v.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not KEY_RE.match(key):
            raise _err(f"{v!r} is not KEY=VALUE (an sbatch option without its dashes, e.g. constraint=a100)",
                       "--slurm-arg")  # fmt: skip
        _one_line_value(value, "--slurm-arg")
        out[key] = value
    return out


def _one_line_value(value: str, option: str) -> None:
    """An sbatch value goes into one ``#SBATCH`` line: a newline (or another control
    character) would add lines of its own to the script."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise _err(f"{value!r} holds a newline or another control character; give a one-line value", option)


def _progress(quiet: bool, description: str, total: int):
    """A rich bar over the points with their counts, or None when quiet."""
    from ..sweep.run import counts

    if quiet:
        return None
    bar = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"), TimeElapsedColumn(), console=Console(stderr=True),
        transient=True,
    )  # fmt: skip
    task = bar.add_task(description, total=total, counts="")

    def update(info: dict) -> None:
        c = counts(info)
        text = f"done {c['done']} · running {c['running']} · queued {c['queued']} · failed {c['failed']}"
        bar.update(task, completed=c["done"] + c["failed"], counts=text)

    return bar, update


OPTIONS = (
    Param("command", Annotated[str | None, typer.Argument(
        help="The command to sweep; its options follow it.", metavar="COMMAND [ITS OPTIONS]",
        show_default=False,
    )], None),
    opt.option("executor", Literal["local", "slurm"], "--executor", panel=EXECUTOR, default="local",
               help="local: worker processes here; slurm: one job array via submitit."),
    opt.option("workers", int | None, "--workers", panel=EXECUTOR, min=1, show_default=False,
               help="Local worker processes (default: one per GPU, else one per CPU core); with several GPUs "
               "each worker is pinned to one."),
    opt.option("dry_run", bool, "--dry-run", panel=EXECUTOR, default=False, show_default=False,
               help="Print the points and what would be run or submitted (the sbatch script); run nothing, "
               "write nothing."),
    opt.option("partition", str | None, "--partition", panel=SLURM, show_default=False,
               help="SLURM partition."),
    opt.option("gpus_per_job", int | None, "--gpus-per-job", panel=SLURM, min=0, show_default=False,
               help="GPUs per array task."),
    opt.option("cpus_per_job", int | None, "--cpus-per-job", panel=SLURM, min=1, show_default=False,
               help="CPUs per array task [1]."),
    opt.option("mem", str | None, "--mem", panel=SLURM, show_default=False,
               help="Memory per array task, e.g. 16G."),
    opt.option("time_limit", str | None, "--time", panel=SLURM, show_default=False,
               help="Time limit per array task: minutes, HH:MM:SS or D-HH:MM (SLURM's forms)."),
    opt.option("array_parallelism", int | None, "--array-parallelism", panel=SLURM, min=1, show_default=False,
               help="Most tasks running at once."),
    opt.option("account", str | None, "--account", panel=SLURM, show_default=False, help="SLURM account."),
    opt.option("qos", str | None, "--qos", panel=SLURM, show_default=False, help="SLURM quality of service."),
    opt.option("slurm_arg", list[str] | None, "--slurm-arg", panel=SLURM, show_default=False,
               help="Any other sbatch option as KEY=VALUE (repeatable), e.g. constraint=a100."),
    opt.option("points_per_job", int, "--points-per-job", panel=SLURM, default=1, min=1,
               help="Points one array task runs one after the other (fewer, longer tasks)."),
    opt.QUIET,
    opt.option("resume", Path | None, "--resume", panel=RESUME, metavar="RUN_DIR", show_default=False,
               help="Run only the missing or failed points of the sweep in RUN_DIR (its command and options "
               "are in its config.json), then gather again."),
)  # fmt: skip


def sweep(opts: Options, sweepable: tuple[str, ...]) -> None:
    """Run COMMAND's grid (depths x seeds x inits x norm positions) as independent points
    on local worker processes or as one SLURM job array, and gather them into one run
    folder: points/NAME/ per point and the command's merged CSVs and plots, equal to what
    `tinit COMMAND` writes for the same options. A failed point is recorded with its
    reason; `tinit sweep --resume RUN_DIR` runs only the missing and failed ones.

    Example: tinit sweep depth-sweep --layers 4,8,16 --seeds 2 --executor slurm --time 10
    """
    from ..results.rundir import OutputError, new_run_dir
    from ..sweep.folder import read_sweep_record, set_aside_merged

    ctx, command, resume, executor = opts.ctx, opts.command, opts.resume, opts.executor
    values = {name: opts.values[name] for name in SWEEP_OPTIONS}
    values["slurm_arg"] = list(values["slurm_arg"] or [])
    args = list(ctx.args)
    previous_runs = None
    if resume is not None:
        if command is not None or args:
            raise _err(
                "takes no COMMAND or command options: the sweep's are in RUN_DIR/config.json", "--resume"
            )
        try:
            doc = read_sweep_record(resume)
        except (OSError, ValueError) as exc:
            raise _err(f"{resume} is not a sweep's run folder ({exc})", "--resume") from None
        command, args, previous_runs = _resumable(doc["sweep"], resume, sweepable)
        recorded = previous_runs[-1].get("cli_options", {}) if previous_runs else {}
        if executor != recorded.get("executor") and opts.given("executor"):
            recorded = {}  # another executor: the last run's executor options do not apply
        for name in SWEEP_OPTIONS:  # what was not given again comes from the last run
            if name in recorded and not opts.given(name):
                values[name] = recorded[name]
    if command is None:
        raise _err(f"give the command to sweep ({', '.join(sweepable)}) and its options, or --resume RUN_DIR",
                   "COMMAND")  # fmt: skip
    dry_run = opts.dry_run
    plan, opts, outputs = capture_plan(ctx, command, args, sweepable, quiet=opts.quiet)
    executor_ = _executor(values, opts, plan, dry_run)
    if dry_run:
        _print_dry_run(plan, executor_, values)
        return
    if resume is None:
        try:
            run_dir = new_run_dir(command, opts.out, root="results/sweep")
        except OutputError as exc:
            raise _err(str(exc), "--out") from None
    else:
        run_dir = resume
        set_aside_merged(run_dir)
    if values["executor"] == "slurm":
        executor_.folder = run_dir / "slurm"
    from .runner import StopSignals

    if hasattr(executor_, "start"):
        executor_.start(len(plan.points))  # before the progress bar's thread: workers may fork
    bar = _progress(opts.quiet, f"sweep {command}", len(plan.points))
    # the plotting (matplotlib) is imported while the workers measure, not before or after
    prefetch = threading.Thread(target=_import_plotting, daemon=True)
    prefetch.start()
    # SIGTERM and SIGHUP stop the sweep as Ctrl-C does: the workers (or the SLURM tasks) are
    # stopped, the done points gathered, config.json says why; a second signal while the merged
    # files are written stops that between two files
    with StopSignals() as signals:
        try:
            try:
                if bar is None:
                    result, record = _run(plan, executor_, run_dir, args, _quiet, previous_runs, values,
                                          signals)  # fmt: skip
                else:
                    with bar[0]:
                        result, record = _run(plan, executor_, run_dir, args, bar[1], previous_runs, values,
                                              signals)  # fmt: skip
            except _Refused as exc:
                if resume is None:
                    shutil.rmtree(run_dir, ignore_errors=True)  # nothing was measured
                typer.echo(f"Error: {exc}", err=True)
                raise typer.Exit(1) from None
            prefetch.join()
            _write(run_dir, command, opts, result, outputs, signals)
        finally:
            if hasattr(executor_, "close"):
                executor_.close()  # nothing it started outlives the command
    c = record["counts"]
    if not opts.quiet:
        Console().print(f"{len(plan.points)} points: {c['done']} done, {c['failed']} failed "
                        f"({values['executor']}; job ids: {', '.join(record['job_ids']) or 'none'})",
                        highlight=False)  # fmt: skip
    if not result.complete:
        typer.echo(f"Error: sweep incomplete ({result.error}); what was measured is in {run_dir}; "
                   f"run the rest with: tinit sweep --resume {run_dir}", err=True)  # fmt: skip
    typer.echo(str(run_dir))
    if not result.complete:
        raise typer.Exit(1)


def _resumable(record, run_dir: Path, sweepable: tuple[str, ...]) -> tuple[str, list[str], list[dict]]:
    """The command, its arguments and the runs of a sweep's record (config.json's
    ``sweep``), each checked: a record edited or cut short is a one-line error."""
    ok = isinstance(record, dict)
    command, args, runs = (record.get(k) for k in ("command", "args", "runs")) if ok else (None,) * 3
    if not (command in sweepable and isinstance(args, list) and all(isinstance(a, str) for a in args)
            and isinstance(runs, list) and all(isinstance(r, dict) for r in runs)):  # fmt: skip
        raise _err(f"{run_dir}/config.json has no usable sweep record (its command, args and runs); "
                   "start a new sweep instead", "--resume")  # fmt: skip
    return command, list(args), runs


def _import_plotting() -> None:
    """Import the plotting (matplotlib), as the merged figures will need it."""
    from ..results import plots  # noqa: F401


def _quiet(info: dict) -> None:
    """No progress to show."""


class _Refused(RuntimeError):
    """The executor could not start (sbatch refused the array)."""


def _run(plan, executor_, run_dir, args, update, previous_runs, values, signals):
    from ..sweep.run import run_sweep
    from ..sweep.slurm import SubmitError

    try:  # once the points have run (or been stopped), signals only stop the writing
        return run_sweep(plan, executor_, run_dir, args, update, previous_runs, values, signals.defer)
    except SubmitError as exc:
        raise _Refused(f"sbatch refused the job array: {exc}") from None


def _executor(values: dict, opts, plan, dry_run: bool):
    """The executor the options ask for (usage errors for options that do not apply)."""
    if values["executor"] == "local":
        given = [flag for name, flag in SLURM_ONLY.items() if values[name] not in (None, [], 1)]
        if given:
            raise _err(f"{given[0]} applies to --executor slurm only", given[0])
        try:
            from ..experiments.device import resolve_device

            resolve_device(opts.device)
        except ConfigError as exc:
            raise OptionError(exc) from None
        from ..sweep.local import LocalExecutor, visible_gpus

        workers = values["workers"] or len(visible_gpus()) or os.cpu_count() or 1
        # forked from this process, as a plain pool: only as `tinit` (it has computed nothing)
        return LocalExecutor(workers, fork=CONSOLE.get())
    if values["workers"] is not None:
        raise _err("applies to --executor local only (use --array-parallelism for SLURM)", "--workers")
    for name, flag, pattern, allowed in (
        ("time_limit", "--time", TIME_RE, "minutes, HH:MM:SS or D-HH:MM"),
        ("mem", "--mem", MEM_RE, "a whole number with K, M, G or T"),
    ):
        if values[name] is not None and not pattern.fullmatch(str(values[name])):
            raise _err(f"{values[name]!r} is not a SLURM {flag[2:]}; give {allowed}", flag)
    for name in ("partition", "account", "qos"):
        if values[name] is not None:
            _one_line_value(str(values[name]), SLURM_ONLY[name])
    slurm_args = _slurm_args(values["slurm_arg"])
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise _err("slurm needs submitit: pip install -e '.[slurm]'", "--executor") from None
    if not dry_run and shutil.which("sbatch") is None:
        raise _err("slurm: no SLURM here (sbatch is not on PATH); try --dry-run", "--executor")
    from ..sweep.slurm import SlurmExecutor

    return SlurmExecutor(
        Path("results/sweep/slurm"), job_name=f"tinit-{plan.command}", partition=values["partition"],
        gpus_per_job=values["gpus_per_job"], cpus_per_job=values["cpus_per_job"], mem=values["mem"],
        time_limit=values["time_limit"], array_parallelism=values["array_parallelism"],
        account=values["account"], qos=values["qos"], slurm_args=slurm_args,
        points_per_job=values["points_per_job"],
    )  # fmt: skip


def _print_dry_run(plan, executor_, values) -> None:
    n = len(plan.points)
    typer.echo(f"tinit sweep {plan.command}: {n} points")
    for p in plan.points[:12]:
        typer.echo(f"  {p.name}")
    if n > 12:
        typer.echo(f"  ... and {n - 12} more")
    if values["executor"] == "local":
        d = executor_.describe()
        threads = d["threads_per_worker"] or "from OMP_NUM_THREADS"
        typer.echo(f"local: {d['workers']} worker processes; GPUs {d['pinned_gpus'] or 'not pinned'}; "
                   f"torch threads per worker {threads}")  # fmt: skip
        return
    tasks = -(-n // executor_.points_per_job)
    typer.echo(f"slurm: one job array of {tasks} tasks ({executor_.points_per_job} point(s) each); "
               "sbatch script (the run folder's slurm/ takes the place of RUN_DIR/slurm):")  # fmt: skip
    typer.echo(executor_.sbatch_script(tasks).replace(str(executor_.folder), "RUN_DIR/slurm"))


def _write(run_dir: Path, command: str, opts, result, outputs, signals) -> None:
    """The merged files, written as `tinit COMMAND` writes its own
    (:func:`tinit.results.writer.write_result`: config.json first says the files are
    being written, last whether the sweep is complete). A write that fails, or a second
    signal, ends the sweep incomplete: one line, exit 1."""
    from ..results.writer import write_result
    from .runner import non_finite_line, print_summary

    done = write_result(run_dir, command, result, outputs.figures, outputs.files, opts.format, signals.caught)
    result.complete, result.error = done.complete, done.error
    if done.n_bad:
        typer.echo(non_finite_line(done.counts, done.n_bad), err=True)
    if not opts.quiet and not signals.caught:
        print_summary(result, outputs, None if done.complete else done.error)
