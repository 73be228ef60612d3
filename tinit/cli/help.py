"""How tinit's --help reads: click's layout (an option column of at most 30 characters,
the help wrapped beside it, at most 80 columns wide), one section per help panel (Model,
Initialisation, Run, Output, ...), short metavars (INT, FLOAT) and none on flags, and
text wrapped at spaces only, never inside a word or at a hyphen.

Built on public click API only: a command's ``context_class`` and the context's
``formatter_class``, ``format_options``, and the parameters' public attributes."""

import re
import textwrap

import typer
from typer.core import TyperCommand

#: Plain names for the value an option takes (the parameter type's name -> metavar);
#: typer's own (``<int range>``, ``<bool>``) are wider and say less.
METAVARS = {"integer": "INT", "integer range": "INT", "int": "INT", "int range": "INT", "float": "FLOAT",
            "float range": "FLOAT", "path": "PATH", "text": "TEXT", "str": "TEXT"}  # fmt: skip


def _type_name(param) -> str:
    """The parameter's type as typer (``<int range>``) or click (``integer range``) names it."""
    try:
        name = param.display_type(None) if hasattr(param, "display_type") else param.type.name
    except Exception:  # a typer/click change must not break --help
        return ""
    return str(name).strip("<>")


def wrap(text: str, width: int, indent: str = "") -> list[str]:
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


class HelpFormatter(typer.Context.formatter_class):
    """click's help layout, wrapping with :func:`wrap`."""

    def write_text(self, text: str) -> None:
        self.write("\n".join(wrap(text, self.width, " " * self.current_indent)) + "\n")

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
            lines = wrap(second, self.width - first_col - 2) or [""]
            self.write(lines[0] + "\n" + "".join(pad + line + "\n" for line in lines[1:]))


class HelpContext(typer.Context):
    formatter_class = HelpFormatter


class Command(TyperCommand):
    """A tinit command: its help in one section per help panel, with plain metavars."""

    context_class = HelpContext

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.metavar is None and not getattr(param, "is_flag", False):
                name = _type_name(param)
                # a repeatable option (list[str]) takes one value at a time: name that value
                param.metavar = METAVARS.get(name.removeprefix("list[").removesuffix("]"), param.metavar)

    def format_options(self, ctx, formatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument" and param.metavar:
                record = (param.metavar, record[1])  # its metavar says what it takes: no type beside it
            sections.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append(record)
        for name, rows in sections.items():
            with formatter.section(name):
                formatter.write_dl(rows)
