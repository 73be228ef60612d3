"""Colours and markers (results/palette.py): the classic four keep their reserved colours
and nothing else takes them, a catalogue scheme takes its place's colour (a scheme
appended to the catalogue, a 31st or a 60th, gets one of its own and changes no other's),
a scheme outside the catalogue gets a colour of its own that is none of the reserved
ones however many there are, and the same name draws the same in every figure and
process."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import matplotlib as mpl
import pandas as pd
import pytest

from tinit.model import catalogue
from tinit.model.placements import PLACEMENTS
from tinit.results import palette
from tinit.results.palette import CONFIG_COLORS, SCHEME_COLORS, USER_COLORS, config_style, scheme_name, shades

RESERVED = {mpl.colors.to_hex(c) for c in CONFIG_COLORS.values()}
#: More user schemes than USER_COLORS has colours, and than colours x markers.
USER_NAMES = [f"my-scheme-{j}" for j in range(4 * len(USER_COLORS) * len(palette.USER_MARKERS))]


def _hex(c: str) -> str:
    return mpl.colors.to_hex(c)


def test_the_classic_four_keep_their_colours_and_markers():
    # the literal values the README's figures and every earlier run used
    assert config_style("naive", "pre") == {"color": "#d62728", "marker": "o"}
    assert config_style("scaled", "pre") == {"color": "#1f77b4", "marker": "s"}
    assert config_style("naive", "post") == {"color": "#ff7f0e", "marker": "^"}
    assert config_style("gpt2", "post") == {"color": "#2ca02c", "marker": "v"}


def test_an_alias_draws_as_its_scheme():
    for alias, name in catalogue.ALIASES.items():
        assert scheme_name(alias) == name
        for p in PLACEMENTS:
            assert config_style(alias, p) == config_style(name, p)


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_catalogue_schemes_distinct_and_never_reserved(placement):
    """At each placement every catalogue scheme has its own colour (and so its own
    look), and only the classic configurations are drawn in a reserved colour."""
    styles = {n: config_style(n, placement) for n in catalogue.CATALOGUE}
    colours = [_hex(s["color"]) for s in styles.values()]
    assert len(set(colours)) == len(catalogue.CATALOGUE)
    for n, s in styles.items():
        if (n, placement) not in CONFIG_COLORS:
            assert _hex(s["color"]) not in RESERVED, (n, placement)


def test_the_catalogue_order_gives_the_colours():
    """The i-th scheme is drawn in the palette's i-th colour, and no user scheme's colour
    is one of them."""
    for name, colour in zip(catalogue.CATALOGUE, SCHEME_COLORS, strict=False):
        assert config_style(name, "pre")["color"] == colour, name
    for i, name in enumerate(catalogue.CATALOGUE):
        color, marker = palette.catalogue_style(i)
        assert config_style(name, "pre") == {"color": color, "marker": marker}, name
    assert not {_hex(c) for c in USER_COLORS} & {_hex(c) for c in SCHEME_COLORS}
    assert not {_hex(c) for c in USER_COLORS} & RESERVED


def _appended(n: int) -> dict:
    """The catalogue with ``n`` copies of gpt2 appended under new names."""
    new = {f"zz-new-{j}": dataclasses.replace(catalogue.CATALOGUE["gpt2"], name=f"zz-new-{j}", aliases=())
           for j in range(n)}  # fmt: skip
    return {**catalogue.CATALOGUE, **new}


def test_a_scheme_appended_has_its_own_colour_and_changes_no_other(monkeypatch):
    """Schemes appended to the catalogue, past the palette's list (a 31st, ..., a 70th),
    each get a colour of their own, never a reserved one nor a user scheme's; every
    scheme before them keeps its colour and marker."""
    before = {(n, p): config_style(n, p) for n in catalogue.CATALOGUE for p in PLACEMENTS}
    n = len(catalogue.CATALOGUE)
    monkeypatch.setattr(catalogue, "CATALOGUE", _appended(40))
    palette.scheme_name.cache_clear()
    try:
        assert {key: config_style(*key) for key in before} == before
        colours = [_hex(config_style(n, "pre")["color"]) for n in catalogue.CATALOGUE]
        assert len(set(colours)) == len(colours) == n + 40
        new = colours[len(SCHEME_COLORS) :]  # the made ones
        assert not set(new) & (RESERVED | {_hex(c) for c in USER_COLORS}), new
    finally:
        palette.scheme_name.cache_clear()


def test_user_schemes_beyond_the_palette_never_take_a_reserved_colour():
    for name in USER_NAMES:
        for p in PLACEMENTS:
            st = config_style(name, p)
            assert _hex(st["color"]) not in RESERVED, (name, p)
            assert st["marker"] not in ("x", "*", "|", "", "none", "None"), (name, p)
    # the palette is used, not one colour for all
    used = {config_style(n, "pre")["color"] for n in USER_NAMES}
    assert used == set(USER_COLORS)


def test_a_user_schemes_style_depends_on_its_name_only():
    """The same name draws the same in any order, figure and process (a salted
    ``hash`` would differ between processes)."""
    names = USER_NAMES[:12]
    forward = [config_style(n, "pre") for n in names]
    palette.scheme_name.cache_clear()
    assert [config_style(n, "pre") for n in reversed(names)] == forward[::-1]
    code = ("from tinit.results.palette import config_style; "
            f"print([tuple(config_style(n, 'pre').values()) for n in {names!r}])")  # fmt: skip
    outs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        outs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True).stdout)  # fmt: skip
    assert outs == {repr([tuple(s.values()) for s in forward]) + "\n"}


def test_a_figure_of_many_user_schemes_draws_no_reserved_colour():
    """A figure of more user schemes than the palette has colours (the old palette, by
    position in the figure, wrapped onto naive's red and gpt2's blue from the 7th)."""
    from tinit.results.plot_grad_norms import plot_grad_norms

    names = USER_NAMES[: 2 * len(USER_COLORS) + 3]
    gn = pd.DataFrame([
        {"init": n, "norm_position": "pre", "layer": layer, "tensor": "down", "grad_norm": 1.0 + j}
        for j, n in enumerate(names) for layer in range(3)
    ])  # fmt: skip
    fig = plot_grad_norms(gn, "down")
    drawn = {_hex(line.get_color()) for ax in fig.axes for line in ax.lines}
    assert drawn and not drawn & RESERVED
    by_gid = {ln.get_gid(): ln for ln in fig.axes[0].lines}
    for n in names:
        assert _hex(by_gid[f"measured:{n}/pre"].get_color()) == _hex(config_style(n, "pre")["color"])


def test_shades_run_light_to_dark_through_the_colour():
    r, g, b = mpl.colors.to_rgb("#1f77b4")
    light, mid, dark = shades("#1f77b4", 3)
    assert mid == pytest.approx((r, g, b))
    assert light == pytest.approx((r + 0.6 * (1 - r), g + 0.6 * (1 - g), b + 0.6 * (1 - b)))
    assert dark == pytest.approx((0.5 * r, 0.5 * g, 0.5 * b))
