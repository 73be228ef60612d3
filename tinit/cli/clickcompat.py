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


#: pydantic's wording of a value typer could not convert, as tinit says it.
_PLAIN = {
    "int_parsing": "is not a whole number",
    "int_from_float": "is not a whole number",
    "float_parsing": "is not a number",
    "bool_parsing": "is not true or false",
}


def plain_message(exc: Exception) -> str | None:
    """The message of a usage error typer raised from a pydantic validation (its
    ``__cause__``), in tinit's words: the value given, what is wrong with it, without
    pydantic's "Input should be" or "Value error," prefixes. None for any other error."""
    cause = exc.__cause__
    errors = getattr(cause, "errors", None)
    if type(cause).__name__ != "ValidationError" or not callable(errors):
        return None
    try:
        first = errors()[0]
    except (IndexError, TypeError):
        return None
    value, msg = first.get("input"), str(first.get("msg", ""))
    msg = msg.removeprefix("Value error, ").rstrip(".")
    if first.get("type") in _PLAIN:
        return f"{value!r} {_PLAIN[first['type']]}"
    msg = msg.replace("Input should be", "must be")
    return msg if repr(value) in msg else f"{value!r}: {msg}"


def stray_after_comma(args: list[str], extra: str | None = None) -> str | None:
    """The message for a comma list written with a space after a comma (``--d-model 64,
    128``): the option, its value and the stray argument, and the list to write instead.
    ``extra``: the argument click found unexpected, when it says so. None when the
    arguments hold no such list."""
    for i in range(1, len(args) - 1):
        option, value, stray = args[i - 1], args[i], args[i + 1]
        if not (option.startswith("-") and value.endswith(",") and not stray.startswith("-")):
            continue
        if extra is not None and stray != extra:
            continue
        # every stray piece of the list: the arguments up to the next option
        pieces = [value]
        for a in args[i + 1 :]:
            if a.startswith("-"):
                break
            pieces.append(a)
            if not a.endswith(","):
                break
        joined = "".join(pieces)
        return (f"Invalid value for '{option}': {value!r} and then {stray!r}, a separate argument: write "
                f"the list without spaces, {option} {joined}")  # fmt: skip
    return None
