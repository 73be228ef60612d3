"""What tinit needs of click that Typer does not export. Typer >= 0.24 runs on its own
copy of click, whose classes are not the installed ``click``'s (catching
``click.UsageError`` would miss Typer's errors), so they are reached from what Typer
does export; this works with vendored and with external click."""

import typer

# click documents its exceptions as BadParameter(UsageError(ClickException)); Typer exports
# BadParameter, so its bases are the other two.
UsageError: type[Exception] = typer.BadParameter.__base__
ClickException: type[Exception] = UsageError.__base__
Abort = typer.Abort
Exit = typer.Exit


def given(ctx: typer.Context, name: str) -> bool:
    """Whether the parameter ``name`` was given on the command line (or by an environment
    variable), not left at its default or a preset's (click's default map). Its source is
    one of click's ParameterSource members, which Typer does not export: they are reached
    through the value's own class."""
    source = ctx.get_parameter_source(name)
    return source is not None and source not in (type(source).DEFAULT, type(source).DEFAULT_MAP)


def current_context() -> typer.Context | None:
    """The context of the command running now (click's ``get_current_context``), or None
    outside a command. click keeps it in its ``globals`` module, beside the module that
    defines its Context (Typer's own copy or the installed click)."""
    import importlib

    core = next(c for c in typer.Context.__mro__ if c.__module__.endswith(".core")).__module__
    return importlib.import_module(core.rsplit(".", 1)[0] + ".globals").get_current_context(silent=True)


__all__ = ["Abort", "ClickException", "Exit", "UsageError", "current_context", "given"]
