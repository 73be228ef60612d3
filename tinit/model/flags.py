"""How a config field is set from the command line: the declaration it carries in its
dataclass metadata (``field(default=12, metadata=flag("--layers", "-L", help=...,
panel=MODEL, min=1))``), read by :mod:`tinit.cli.options`, which makes the option of every
command that takes the field's config (docs/design.md §2, §12). Pure data: no typer, no
torch, so the configs stay importable on their own and ``tinit --help`` stays fast.

The value checks here raise ``ValueError`` with the message the user sees; the CLI turns
it into a usage error naming the option (exit 2)."""

import math
from dataclasses import dataclass, field
from typing import Any

#: The sections of ``--help`` (click's rich help panels).
MODEL, INIT, RUN, OUTPUT = "Model", "Initialisation", "Run", "Output"
TRAIN, DATA = "Training", "Data"
#: A Flag's default when the option's default is the field's.
FIELD_DEFAULT: Any = type("FieldDefault", (), {"__repr__": lambda self: "FIELD_DEFAULT"})()


@dataclass(frozen=True)
class Flag:
    """The command-line option of one config field."""

    decls: tuple[str, ...]  # --layers, -L (click's declarations: "--qk-norm/--no-qk-norm")
    help: str
    panel: str  # its --help section
    param: str | None = None  # the parameter's name when not the field's (--untie: untie)
    negates: bool = False  # a flag setting the field to its negation (--untie: tie_embeddings)
    type: Any = None  # the option's type when not the field's (--sigma takes a string)
    default: Any = FIELD_DEFAULT  # the option's default when not the field's (a negation's: its negation)
    #: other click/typer keywords: min, max, metavar, show_default, and ``parser`` (the
    #: string given) or ``callback`` (the converted value): checks that raise ValueError
    kw: dict[str, Any] = field(default_factory=dict)


def flag(*decls: str, help: str, panel: str, param: str | None = None, negates: bool = False,
         type: Any = None, default: Any = FIELD_DEFAULT, **kw: Any) -> dict[str, Flag]:  # fmt: skip
    """The metadata of a field set by the option ``decls``."""
    return {"flag": Flag(decls, help, panel, param, negates, type, default, kw)}


def flag_of(f: Any) -> Flag | None:
    """The option declared on a dataclass field, or None (the field has no option)."""
    return f.metadata.get("flag")


# --- checks of values that a type alone does not say (they raise ValueError) ---


def positive(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{value} is not a positive number")
    return value


def nonneg(value: float) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{value} is not a finite number >= 0")
    return value


def sigma(value: str) -> float | str:
    if value == "inv-sqrt-d":
        return value
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{value!r} is not a positive number or 'inv-sqrt-d'")
    return x


def on_off(value: str) -> bool:
    if value not in ("on", "off"):
        raise ValueError(f"{value!r}: give on or off")
    return value == "on"


def learning_rate(value: float) -> float:
    """A learning rate: a positive number up to MAX_LR (tinit.model.config says why)."""
    from .config import LR_WHY, MAX_LR

    if not (math.isfinite(value) and 0 < value <= MAX_LR):
        raise ValueError(f"{value} is not a number > 0 and <= {MAX_LR:g} ({LR_WHY})")
    return value
