"""Colours and markers keyed by scheme name (results/palette.py): the classic four keep
their reserved colours and nothing else takes them, a scheme keeps its colour when
another is added, a scheme outside the catalogue gets a colour of its own that is none
of the reserved ones however many there are, and the same name draws the same in every
figure and process."""

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
from tinit.results.palette import CONFIG_COLORS, SCHEME_STYLES, USER_COLORS, config_style, scheme_name, shades

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


def test_every_catalogue_scheme_has_a_colour_of_its_own_in_the_table():
    assert set(SCHEME_STYLES) == set(catalogue.CATALOGUE)
    # a user's scheme never shares a catalogue scheme's colour
    assert not {_hex(c) for c in USER_COLORS} & {_hex(c) for c, _m in SCHEME_STYLES.values()}
    assert not {_hex(c) for c in USER_COLORS} & RESERVED


def test_a_scheme_keeps_its_colour_when_another_is_added(monkeypatch):
    """A scheme added at the front of the catalogue (where a position-based palette
    would shift every colour after it) changes no other scheme's colour or marker."""
    before = {(n, p): config_style(n, p) for n in catalogue.CATALOGUE for p in PLACEMENTS}
    new = dataclasses.replace(catalogue.CATALOGUE["gpt2"], name="aaa-new", aliases=())
    monkeypatch.setattr(catalogue, "CATALOGUE", {"aaa-new": new, **catalogue.CATALOGUE})
    palette.scheme_name.cache_clear()
    try:
        after = {key: config_style(*key) for key in before}
        assert after == before
        assert _hex(config_style("aaa-new", "pre")["color"]) not in RESERVED
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
