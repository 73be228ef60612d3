"""tinit's command line: ``tinit <command> [options]``.

Commands are thin: options -> configs -> experiment -> results. Bad input is one
line on stderr and exit code 2; a run that fails part-way keeps what it measured,
says why, and exits 1. The commands are those of :data:`registry.COMMANDS`.
"""

import sys
from importlib.metadata import PackageNotFoundError, version

import typer
from typer.core import TyperGroup

from .. import process
from ..interrupt import interrupted
from .clickcompat import Abort, ClickException, UsageError, plain_message, stray_after_comma
from .help import Command, HelpContext
from .registry import COMMANDS, command


class _OneLineErrors(TyperGroup):
    """Usage errors as a single line ``Error: ...`` (exit 2), never a traceback or a
    boxed panel, so scripts and logs stay readable."""

    context_class = HelpContext

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except UsageError as exc:
            if not standalone_mode:
                raise
            msg = " ".join(_usage_message(exc, sys.argv[1:] if args is None else list(args)).split())
            if not msg:  # (typer's rich help prints the help itself and leaves no message)
                sys.exit(0)
            typer.echo(f"Error: {msg}", err=True)
            sys.exit(2)
        except Abort:
            if not standalone_mode:
                raise
            typer.echo("Aborted.", err=True)
            sys.exit(1)
        except ClickException as exc:
            if not standalone_mode:
                raise
            typer.echo(f"Error: {' '.join(exc.format_message().split())}", err=True)
            sys.exit(exc.exit_code)
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:
            interrupted()

    def invoke(self, ctx):
        # typer turns a KeyboardInterrupt into a silent exit 130: say it in one line. (A
        # Ctrl-C during a measurement never gets here: the experiment keeps what it
        # measured and the run ends as incomplete, exit 1.)
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            interrupted()


def _usage_message(exc: Exception, args: list[str]) -> str:
    """A usage error's one line: a list written with a space after a comma is named with
    its option (click would find a stray argument, or a value it cannot read); typer's
    pydantic wording is put plainly, with the value given."""
    stray = stray_after_comma(args)
    if stray is not None:
        return stray
    plain = plain_message(exc)
    if plain is not None:
        exc.message = plain
    return exc.format_message()


def _print_version(value: bool) -> None:
    """``tinit --version``: tinit's and torch's versions from the installed metadata
    (torch is not imported)."""
    if not value:
        return
    from .. import __version__

    try:
        torch = version("torch")
    except PackageNotFoundError:
        torch = "not installed"
    py = ".".join(map(str, sys.version_info[:3]))
    typer.echo(f"tinit {__version__} (torch {torch}, python {py})")
    raise typer.Exit()


app = typer.Typer(
    name="tinit",
    cls=_OneLineErrors,
    help="Transformer initialization and depth studies: residual-stream variance and "
    "gradients at init, measured and set beside the theory.",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 80},
    invoke_without_command=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    add_completion=False,
)


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(
        False,
        "--version",
        help="Print tinit's and torch's versions and exit.",
        callback=_print_version,
        is_eager=True,
    ),
) -> None:
    """Transformer initialization and depth studies: residual-stream variance and
    gradients at init, measured and set beside the theory."""
    if ctx.invoked_subcommand is None:  # `tinit` alone: the help, nothing wrong
        typer.echo(ctx.get_help())
        raise typer.Exit()


# in the registry's order, which is the order of `tinit --help`
for _row in COMMANDS:
    app.command(_row.name, short_help=_row.short_help, cls=Command, context_settings=_row.context_settings)(
        command(_row)
    )


def main() -> None:
    """Console entry point."""
    from .common import CONSOLE

    CONSOLE.set(True)
    try:
        app()
    except KeyboardInterrupt:  # between Python's start and the command (parsing, building the CLI)
        interrupted()
    finally:
        # everything is written by now: the exit's last collection skips what is alive
        process.before_exit()
