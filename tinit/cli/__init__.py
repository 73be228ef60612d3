"""tinit's command line: ``tinit <command> [options]``.

Commands are thin: options -> configs -> experiment -> results. Bad input is one
line on stderr and exit code 2; a run that fails part-way keeps what it measured,
says why, and exits 1.
"""

import sys

import typer
from typer.core import TyperGroup

from .clickcompat import Abort, ClickException, UsageError


class _OneLineErrors(TyperGroup):
    """Usage errors as a single line ``Error: ...`` (exit 2), never a traceback or a
    boxed panel, so scripts and logs stay readable."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except UsageError as exc:
            msg = " ".join(exc.format_message().split())
            if not standalone_mode:
                raise
            if not msg:  # `tinit` alone: the help was printed, nothing went wrong
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


app = typer.Typer(
    name="tinit",
    cls=_OneLineErrors,
    help="Transformer initialization and depth studies: residual-stream variance and "
    "gradients at init, measured and set beside the theory.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Transformer initialization and depth studies: residual-stream variance and
    gradients at init, measured and set beside the theory."""


def _register() -> None:
    # commands register themselves on import; this order is the order in `tinit --help`
    from . import variance, grad_norms, depth_sweep, attention_scale, norms, params, check  # noqa: F401, I001
    from . import train  # noqa: F401


_register()


def main() -> None:
    """Console entry point."""
    app()
