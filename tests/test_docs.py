"""Guards the documentation as a reader meets it: the README stays short enough to finish,
every link in it and in docs/ leads somewhere (a file that exists, a heading that exists),
every command of the app has its reference page and the README links it, and every
picture under docs/img/ is shown."""

import re
import shlex
from pathlib import Path

import pytest
from helpers import click_command, command_context, figures_built_not_saved
from typer.testing import CliRunner

from tinit.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: The pages this part of the project writes (docs/design.md is the maintainer's own).
PAGES = [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if p.name != "design.md")]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
GROUP = click_command(app)


def _commands() -> list[str]:
    return sorted(GROUP.commands)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than - and _ dropped,
    spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return LINK.findall(text)


def test_the_generated_parts_are_the_codes():
    """The README's catalogue table and options.md's table of options are what the code
    declares: a scheme or an option added, renamed or changed fails here until the command
    named rewrites them."""
    from tinit.cli.reference import REWRITE, stale

    assert not stale(ROOT), f"stale, rewrite with: {REWRITE}"


def test_readme_is_short_enough_to_finish():
    """300 lines at most, the catalogue's table (a row a scheme, written from the code)
    not counted: a scheme added costs the README nothing by hand."""
    from tinit.cli.reference import generated_lines

    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) - generated_lines(text) <= 300


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page):
    for target in _links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto: - not this repository's
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: {target} does not exist"
        assert ROOT in dest.parents or dest == ROOT, f"{page.name}: {target} leaves the repository"
        if anchor:
            assert dest.suffix == ".md", f"{page.name}: {target}"
            assert anchor in _anchors(dest), f"{page.name}: no heading #{anchor} in {dest.name}"


def test_readme_links_into_docs():
    """The README hands the reference to docs/: it links the pages below."""
    targets = {t.partition("#")[0] for t in _links(ROOT / "README.md")}
    for page in ("run-folders.md", "performance.md", "development.md", "library.md", "figures.md",
                 "reference/options.md"):  # fmt: skip
        assert f"docs/{page}" in targets, page


@pytest.mark.parametrize("command", _commands())
def test_every_command_has_a_reference_page_linked_from_the_readme(command):
    page = DOCS / "reference" / f"{command}.md"
    assert page.is_file(), f"no docs/reference/{command}.md"
    assert page.read_text().startswith(f"# `tinit {command}`")
    assert f"docs/reference/{command}.md" in {t.partition("#")[0] for t in _links(ROOT / "README.md")}
    # the page shows how the command is called
    assert re.search(rf"^tinit {command}\b", page.read_text(), flags=re.M), command


def test_no_reference_page_without_its_command():
    pages = {p.stem for p in (DOCS / "reference").glob("*.md")}
    assert pages - set(_commands()) == {"options"}


def test_every_picture_is_shown_and_small():
    shown = {(ROOT / t).resolve() for t in _links(ROOT / "README.md") if t.startswith("docs/img/")}
    for png in (DOCS / "img").glob("*.png"):
        assert png.resolve() in shown, f"{png.name} is not in the README"
        assert png.stat().st_size < 300 * 1024, f"{png.name}: {png.stat().st_size} bytes"


def _examples(page: Path) -> list[tuple[list[str], str]]:
    """Every `tinit ...` line of the page's bash blocks (continuations joined): its
    arguments and the comment after it."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command, _, comment = line.partition(" #")
            if command.startswith("tinit "):
                found.append((shlex.split(command)[1:], comment.strip()))
    return found


EXAMPLES = [(page, args, comment) for page in PAGES for args, comment in _examples(page)]


@pytest.mark.parametrize(
    ("page", "args", "comment"), EXAMPLES, ids=[f"{p.name}:{' '.join(a)[:40]}" for p, a, _ in EXAMPLES]
)
def test_every_example_is_a_command_line_the_app_accepts(page, args, comment):
    """Parsed as the app parses them (nothing runs): an option renamed or removed fails
    here rather than in a reader's terminal."""
    command_context(args[0], args[1:])


def test_readme_params_example_prints_what_its_comment_says(tmp_path, monkeypatch):
    """The README's numbers for a tied head (V·d = 128,000 × 2,048 = 262,144,000; 17.5% of
    1.5B) are what the command prints. (What it prints is read: its figure is built, not
    rendered; tests/test_params.py and test_reader_rules.py draw it.)"""
    figures_built_not_saved(monkeypatch)
    args, comment = next((a, c) for a, c in _examples(ROOT / "README.md") if a[0] == "params")
    assert comment == "262,144,000 saved, 17.5% of 1.5B"
    assert 128_000 * 2_048 == 262_144_000 and round(100 * 262_144_000 / 1.5e9, 1) == 17.5
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    assert comment in res.output


def test_readme_performance_figures_are_the_performance_page():
    """Every figure the README's Performance section states in bold is on docs/performance.md."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Performance", 1)[1].split("\n## ", 1)[0]
    page = (DOCS / "performance.md").read_text()
    figures = re.findall(r"\*\*([^*]+)\*\*", section)
    assert figures
    for figure in figures:
        assert f"**{figure}**" in page, figure
