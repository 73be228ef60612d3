"""The click that Typer runs on. Typer >= 0.24 vendors its own copy of click
(``typer._click``) whose exception classes are *not* the installed ``click``'s, so
catching ``click.UsageError`` misses Typer's errors. Take the classes from Typer's
own exceptions instead; this works with vendored and with external click."""

import typer

try:  # Typer with vendored click
    from typer._click.core import ParameterSource
    from typer._click.globals import get_current_context
except ImportError:  # Typer on the installed click
    from click.core import ParameterSource
    from click.globals import get_current_context


def _base(name: str) -> type[Exception]:
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)


UsageError = _base("UsageError")
ClickException = _base("ClickException")
Abort = typer.Abort
Exit = typer.Exit

__all__ = ["Abort", "ClickException", "Exit", "ParameterSource", "UsageError", "get_current_context"]
