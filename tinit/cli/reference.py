"""The parts of the documentation written from the code: the README's table of the init
catalogue (from :data:`tinit.model.catalogue.CATALOGUE_LIST`) and the table of the shared
options in docs/reference/options.md (from their declarations and the registry's rows).

``python -m tinit.cli.reference`` rewrites them in place, between their markers;
tests/test_docs.py fails, naming that command, when one is stale. Not a command module:
nothing here runs when tinit does."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

from .options import DECLARED, Option
from .registry import COMMANDS, Command, parameters

ROOT = Path(__file__).resolve().parents[2]
#: What the command that rewrites the generated parts is.
REWRITE = "python -m tinit.cli.reference"


def _begin(what: str) -> str:
    return f"<!-- {what}: written by `{REWRITE}` from the code; edit the code, then run it -->"


END = "<!-- end of the generated part -->"


def catalogue_table() -> str:
    """The README's catalogue table."""
    from ..experiments.measure.inits import catalogue_markdown

    return catalogue_markdown()


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _takers(option: Option, rows: tuple[Command, ...]) -> str:
    """The commands that take ``option`` (its list form: "as a list"), with their default
    where it is their own."""
    one, many = [], []
    for row in rows:
        declared = parameters(row)[1]
        for form, out in ((option, one), (option.many, many)):
            if form is not None and any(d is form for d in declared):
                own = row.defaults.get(form.param, form.default)
                shown = own != form.default or form is option.many
                out.append(row.name + (f" ({_default(own)})" if shown else ""))
    text = ", ".join(one) or ("-" if not many else "")
    if many:
        text += ("; " if one else "") + "as a comma list: " + ", ".join(many)
    return text


def options_table() -> str:
    """docs/reference/options.md's table: every shared option (declared on a config field
    or in tinit.cli.options), by --help section: its flags, the commands that take it
    (with their own default where it differs), its default and what it does; then each
    config's fields that no option sets, at their defaults."""
    from ..experiments.training.configs import TrainConfig
    from ..model.config import InitConfig, ModelConfig, RunConfig
    from ..model.flags import flag_of

    rows = tuple(c for c in COMMANDS if not c.passes_options)
    singles = [o for o in DECLARED if o.lists is None]
    panels = list(dict.fromkeys(o.info.rich_help_panel for o in singles))
    lines = []
    for panel in panels:
        lines += [f"**{panel}**", "", "| option | default | the commands that take it | what it does |",
                  "|---|---|---|---|"]  # fmt: skip
        for o in (o for o in singles if o.info.rich_help_panel == panel):
            flags = [d for d in (o.info.default, *(o.info.param_decls or ())) if isinstance(d, str)]
            shown = ", ".join(f"`{f}`" for f in flags)
            lines.append(f"| {shown} | {_cell(_default(o.default))} | {_cell(_takers(o, rows))} | "
                         f"{_cell(o.info.help)} |")  # fmt: skip
        lines.append("")
    lines += ["**Set by no option** (the configs' own values; a library caller sets them):", ""]
    for cls in (ModelConfig, InitConfig, RunConfig, TrainConfig):
        plain = [f for f in dataclasses.fields(cls) if flag_of(f) is None and f.name not in _NOT_SHOWN]
        if plain:
            values = ", ".join(f"`{f.name}` {_default(f.default)}" for f in plain)
            lines.append(f"- `{cls.__name__}`: {values}")
    return "\n".join(lines).rstrip()


#: Fields no option sets that are not values a reader sets (set by the commands themselves).
_NOT_SHOWN = {"max_seq_len", "user_set", "schemes", "scheme", "extra", "data_seed", "mf_draws",
              "norm_position", "qk_norm_span"}  # fmt: skip

#: The generated parts: (file, what, the text).
PARTS: tuple[tuple[str, str, Callable[[], str]], ...] = (
    ("README.md", "the catalogue", catalogue_table),
    ("docs/reference/options.md", "the shared options", options_table),
)


def _replace(text: str, what: str, body: str) -> str:
    begin = _begin(what)
    if begin not in text or END not in text.split(begin, 1)[1]:
        raise ValueError(f"no generated part for {what}: put {begin!r} and {END!r} where it goes")
    head, rest = text.split(begin, 1)
    return f"{head}{begin}\n{body}\n{END}{rest.split(END, 1)[1]}"


def generated_lines(text: str) -> int:
    """How many lines of ``text`` its generated parts hold (their markers included)."""
    count, inside = 0, False
    for line in text.splitlines():
        starts = line.startswith("<!-- ") and f"`{REWRITE}`" in line
        inside = inside or starts
        count += inside
        inside = inside and line != END
    return count


def stale(root: Path = ROOT, write: bool = False) -> list[str]:
    """The files whose generated part differs from the code's (rewritten when ``write``)."""
    out = []
    for name, what, make in PARTS:
        path = root / name
        text = path.read_text()
        new = _replace(text, what, make())
        if new != text:
            out.append(name)
            if write:
                path.write_text(new)
    return out


def main() -> None:
    changed = stale(write=True)
    print("rewrote " + ", ".join(changed) if changed else "up to date")


if __name__ == "__main__":
    sys.exit(main())
