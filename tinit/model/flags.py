"""How a config field is set from the command line: the declaration it carries in its
dataclass metadata (``field(default=12, metadata=flag("--layers", "-L", help=...,
panel=MODEL, min=1))``), read by :mod:`tinit.cli.options`, which makes the option of every
command that takes the field's config (docs/design.md §2, §12). Pure data: no typer, no
torch, so the configs stay importable on their own and ``tinit --help`` stays fast.

The value checks a declaration names (``callback=positive``) are
:mod:`tinit.model.checks`'s."""

from dataclasses import dataclass, field
from typing import Any

#: The sections of ``--help`` (click's rich help panels).
MODEL, INIT, RUN, OUTPUT = "Model", "Initialisation", "Run", "Output"
TRAIN, DATA = "Training", "Data"
#: A Flag's default when the option's default is the field's.
FIELD_DEFAULT: Any = type("FieldDefault", (), {"__repr__": lambda self: "FIELD_DEFAULT"})()


@dataclass(frozen=True)
class Many:
    """The list form of a field's option, for the commands that run one value after
    another (depths, widths, learning rates): the same flag taking a comma list, under
    its own parameter name (``--layers``: ``layers``; the field's own, ``n_layers``, is
    the one value)."""

    param: str
    help: str
    metavar: str | None = None
    also: tuple[str, ...] = ()  # other fields the list decides (each width its own d_ff)


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
    many: Many | None = None  # its list form, for the commands that take a list of the field's values
    #: other click/typer keywords: min, max, metavar, show_default, and ``parser`` (the
    #: string given) or ``callback`` (the converted value): checks that raise ValueError
    kw: dict[str, Any] = field(default_factory=dict)


def flag(*decls: str, help: str, panel: str, param: str | None = None, negates: bool = False,
         type: Any = None, default: Any = FIELD_DEFAULT, many: Many | None = None,
         **kw: Any) -> dict[str, Flag]:  # fmt: skip
    """The metadata of a field set by the option ``decls``."""
    return {"flag": Flag(decls, help, panel, param, negates, type, default, many, kw)}


def flag_of(f: Any) -> Flag | None:
    """The option declared on a dataclass field, or None (the field has no option)."""
    return f.metadata.get("flag")
