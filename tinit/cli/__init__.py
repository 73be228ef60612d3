"""tinit's command line: ``tinit <command> [options]``.

Commands are thin: options -> configs -> experiment -> results. Bad input is one
line on stderr and exit code 2; a run that fails part-way keeps what it measured,
says why, and exits 1.
"""

import gc
import re
import sys
import textwrap
from importlib.metadata import PackageNotFoundError, version

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from ..interrupt import interrupted
from .clickcompat import Abort, ClickException, UsageError

#: Plain names for the value an option takes (click's parameter-type name -> metavar);
#: typer's own (``<int range>``, ``<bool>``) are wider and say less.
METAVARS = {"integer": "INT", "integer range": "INT", "int": "INT", "int range": "INT", "float": "FLOAT",
            "float range": "FLOAT", "path": "PATH", "text": "TEXT", "str": "TEXT"}  # fmt: skip


def _type_name(param) -> str:
    """The parameter's type as typer (``<int range>``) or click (``integer range``) names it."""
    try:
        name = param.display_type(None) if hasattr(param, "display_type") else param.type.name
    except Exception:  # a typer/click internals change must not break --help
        return ""
    return str(name).strip("<>")


def _wrap(text: str, width: int, indent: str = "") -> list[str]:
    """Paragraphs wrapped at spaces only: never inside a word, nor at a hyphen (so
    ``--seq-len`` or ``depth-scaled`` stay whole and can be copied)."""
    lines: list[str] = []
    for i, para in enumerate(re.split(r"\n\s*\n", text.strip())):
        lines += [""] if i else []
        lines += textwrap.wrap(
            " ".join(para.split()), max(width, 10), initial_indent=indent, subsequent_indent=indent,
            break_long_words=False, break_on_hyphens=False,
        )  # fmt: skip
    return lines


class _Formatter(TyperCommand.context_class.formatter_class):
    """click's help layout, wrapping with :func:`_wrap`."""

    def write_text(self, text: str) -> None:
        self.write("\n".join(_wrap(text, self.width, " " * self.current_indent)) + "\n")

    def write_dl(self, rows, col_max: int = 30, col_spacing: int = 2) -> None:
        rows = list(rows)
        first_col = min(max((len(first) for first, _ in rows), default=0), col_max) + col_spacing
        pad = " " * (first_col + self.current_indent)
        for first, second in rows:
            self.write(" " * self.current_indent + first)
            if not second:
                self.write("\n")
                continue
            if len(first) <= first_col - col_spacing:
                self.write(" " * (first_col - len(first)))
            else:
                self.write("\n" + pad)
            lines = _wrap(second, self.width - first_col - 2) or [""]
            self.write(lines[0] + "\n" + "".join(pad + line + "\n" for line in lines[1:]))


class _Context(TyperCommand.context_class):
    formatter_class = _Formatter


class _Command(TyperCommand):
    """Help as click lays it out (an option column of at most 30 characters, the help
    wrapped at word boundaries beside it, at most 80 columns wide), in one section per
    help panel (Model, Initialisation, Run, Output, ...), with short metavars (INT,
    FLOAT) and none on flags."""

    context_class = _Context

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if getattr(param, "metavar", None) is None and not getattr(param, "is_flag", False):
                name = _type_name(param)
                # a repeatable option (list[str]) takes one value at a time: name that value
                param.metavar = METAVARS.get(name.removeprefix("list[").removesuffix("]"), param.metavar)
            if isinstance(param, TyperArgument):
                # typer adds the type to an argument's name ("TEXT <str>"): the metavar says it
                param.display_type_rich = lambda ctx=None: ""

    def format_options(self, ctx, formatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                sections.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append(record)
        for name, rows in sections.items():
            with formatter.section(name):
                formatter.write_dl(rows)


class _OneLineErrors(TyperGroup):
    """Usage errors as a single line ``Error: ...`` (exit 2), never a traceback or a
    boxed panel, so scripts and logs stay readable."""

    context_class = _Context

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except UsageError as exc:
            if not standalone_mode:
                raise
            if type(exc).__name__ == "NoArgsIsHelpError":  # `tinit` alone: the help, nothing wrong
                typer.echo(exc.format_message())
                sys.exit(0)
            msg = " ".join(exc.format_message().split())
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
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    add_completion=False,
)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", help="Print tinit's and torch's versions and exit.", callback=_print_version,
        is_eager=True,
    ),
) -> None:
    """Transformer initialization and depth studies: residual-stream variance and
    gradients at init, measured and set beside the theory."""


def _register() -> None:
    # commands register themselves on import; this order is the order in `tinit --help`
    from . import variance, grad_norms, depth_sweep, attention_scale, norms, params, check  # noqa: F401, I001
    from . import train, coord_check, inits, audit, sweep  # noqa: F401, I001

    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):
            info.cls = _Command


_register()


def main() -> None:
    """Console entry point."""
    from .common import CONSOLE

    CONSOLE.set(True)
    try:
        app()
    except KeyboardInterrupt:  # between Python's start and the command (parsing, building the CLI)
        interrupted()
    finally:
        # Everything is written and flushed by now. Python's exit runs a last garbage
        # collection over every object alive, and after torch, pandas and matplotlib
        # that is ~1e6 objects: 1 s or more of a process's time. Freezing them leaves
        # them to the operating system instead (they are freed with the process; the
        # atexit handlers still run). Only the console entry point does this.
        sys.stdout.flush()
        sys.stderr.flush()
        gc.freeze()
