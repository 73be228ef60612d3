"""Who is drawn how: the colour, marker and label of every configuration and category.

A configuration (scheme x norm placement) has one colour and one marker in every figure
(:func:`config_style`), the same in every figure and run:

- the four classic configurations have their own (:data:`CONFIG_COLORS`: naive/pre red,
  gpt2/pre blue, naive/post orange, gpt2/post green); these four colours are reserved:
  nothing else is drawn in them;
- a catalogue scheme takes the colour and marker of its place in the catalogue
  (:func:`catalogue_style`: the i-th scheme of ``tinit.model.catalogue.CATALOGUE_LIST``
  the i-th of :data:`SCHEME_COLORS` and :data:`SCHEME_MARKERS`; past the list a colour
  made from its place, never a reserved one nor another scheme's), shaded by the
  placement (its ``shade``, :mod:`tinit.model.placements`) and with the placement's
  marker where it has one (sandwich, reordered, none). A new scheme is appended to the
  catalogue, so every other keeps its colour;
- a scheme outside the catalogue (a user's ``--init-file`` scheme) takes one of
  :data:`USER_COLORS` and of :data:`USER_MARKERS`, picked by a hash of its name: the
  same in every figure and run, never a reserved colour, however many schemes there are.

An alias is its scheme (``scaled`` draws as ``gpt2``); the catalogue's own lookup
(:func:`tinit.model.catalogue.get_scheme`) says so. Labels name the scheme as the run
named it.
"""

from __future__ import annotations

import functools
import hashlib

from matplotlib import colors as mcolors

from ..model.placements import PLACEMENTS

#: The classic configurations: their own colour and marker (naive and gpt2 at pre-norm
#: in the schemes' own colours; at post-norm orange and green).
CONFIG_COLORS = {
    ("naive", "pre"): "#d62728",
    ("gpt2", "pre"): "#1f77b4",
    ("naive", "post"): "#ff7f0e",
    ("gpt2", "post"): "#2ca02c",
}
CONFIG_MARKERS = {
    ("naive", "pre"): "o",
    ("gpt2", "pre"): "s",
    ("naive", "post"): "^",
    ("gpt2", "post"): "v",
}
#: The catalogue schemes' colours at pre-norm, in catalogue order: naive red and gpt2 blue
#: are the classic configurations'; every other avoids red, blue, orange and green, so those
#: four still mean the classic ones.
SCHEME_COLORS = (
    "#d62728", "#1f77b4", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79",
    "#637939", "#8c6d31", "#843c39", "#7b4173", "#5254a3", "#b5cf6b", "#e7969c", "#de9ed6", "#000000",
    "#6b6ecf", "#cedb9c", "#a55194", "#c49c94", "#dbdb8d", "#9edae5", "#756bb1", "#636363", "#bd9e39",
    "#ce6dbd", "#8ca252", "#9c9ede",
)  # fmt: skip
#: Their markers, in turn along the catalogue.
SCHEME_MARKERS = ("o", "s", "^", "v", "<", ">", "p", "h", "*", "d")
#: Colours of the schemes outside the catalogue: none reserved, none a catalogue scheme's,
#: each dark enough to show as a translucent measured line.
USER_COLORS = ("#4b0082", "#008080", "#e7298a", "#984ea3", "#a65628", "#b8860b", "#2f4f4f", "#9932cc",
               "#808000", "#e6ab02")  # fmt: skip
#: Their markers (none of the placements' own, nor one with a fixed meaning: x, *, |).
USER_MARKERS = ("o", "s", "^", "v", "<", ">", "p", "h", "d")

# Categories that are not configurations take colours the configurations never use, so
# that red, blue, orange and green always mean a configuration.
#: tinit attention-scale: (input, scaled) series.
ATTENTION_COLORS = {
    ("unit", False): "#8c564b",
    ("unit", True): "#e377c2",
    ("model", False): "#9467bd",
    ("model", True): "#17becf",
}
#: tinit norms: implementations.
IMPL_COLORS = {"eager": "#9467bd", "functional": "#8c564b", "compiled": "#17becf"}
#: tinit params: components of the parameter count, and equal / not equal to 8d^2.
COMPONENT_COLORS = {
    "embedding": "#8c564b",
    "positions": "#c49c94",
    "attention": "#9467bd",
    "ffn": "#17becf",
    "norms": "#7f7f7f",
    "final_norm": "#c7c7c7",
    "head": "#e377c2",
}
#: (one colour per meaning within the figure: none of the components' colours)
EQUAL_COLORS = {True: "#bcbd22", False: "#393b79"}
#: tinit audit: weight roles (colour, marker), none in the configurations' four colours.
ROLE_STYLES = {
    "embed": ("#8c564b", "o"), "pos": ("#c49c94", "s"), "q": ("#9467bd", "^"), "k": ("#c5b0d5", "v"),
    "v": ("#e377c2", "<"), "qkv": ("#9467bd", "^"), "o": ("#17becf", "D"), "gate": ("#bcbd22", ">"),
    "up": ("#7f7f7f", "p"), "down": ("#393b79", "h"), "head": ("#000000", "*"), "unknown": ("#bdbdbd", "X"),
}  # fmt: skip


@functools.cache
def scheme_name(init: str) -> str:
    """The catalogue's name of the scheme ``init`` names (an alias gives its scheme's:
    ``scaled`` is ``gpt2``); a name the catalogue does not know, unchanged."""
    from ..model.catalogue import get_scheme

    try:
        return get_scheme(init).name
    except KeyError:
        return init


def catalogue_index(name: str) -> int | None:
    """The place of the scheme ``name`` (the catalogue's name) in the catalogue; None
    for a scheme outside it."""
    from ..model.catalogue import CATALOGUE

    return next((i for i, n in enumerate(CATALOGUE) if n == name), None)


#: Hues (degrees) a made colour keeps away from: the reserved red, orange, green, blue.
_RESERVED_HUES = (0.0, 30.0, 120.0, 205.0)


@functools.cache
def _made_colors(n: int) -> tuple[str, ...]:
    """The first ``n`` made colours: golden-angle steps round the hue circle at three
    lightnesses, each at least 20 degrees of hue from a reserved colour and none a listed
    one (of :data:`SCHEME_COLORS`, :data:`USER_COLORS`, the reserved)."""
    import colorsys

    taken = {c.lower() for c in (*SCHEME_COLORS, *USER_COLORS, *CONFIG_COLORS.values())}
    out: list[str] = []
    k = 0
    while len(out) < n:
        hue = (k * 137.50776405) % 360
        light = (0.38, 0.52, 0.30)[k % 3]
        k += 1
        if min(abs((hue - r + 180) % 360 - 180) for r in _RESERVED_HUES) < 20:
            continue
        color = mcolors.to_hex(colorsys.hls_to_rgb(hue / 360, light, 0.6))
        if color not in taken:
            taken.add(color)
            out.append(color)
    return tuple(out)


def catalogue_style(index: int) -> tuple[str, str]:
    """The colour and marker of the catalogue's ``index``-th scheme (at pre-norm):
    :data:`SCHEME_COLORS`, then made colours (a 31st scheme has its own, never a reserved
    one); :data:`SCHEME_MARKERS` in turn."""
    if index < len(SCHEME_COLORS):
        color = SCHEME_COLORS[index]
    else:
        color = _made_colors(index - len(SCHEME_COLORS) + 1)[-1]
    return color, SCHEME_MARKERS[index % len(SCHEME_MARKERS)]


def _user_style(name: str) -> tuple[str, str]:
    """A colour and marker for a scheme outside the catalogue, by its name alone (a
    stable hash: the same in every process, unlike ``hash``)."""
    h = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")
    return USER_COLORS[h % len(USER_COLORS)], USER_MARKERS[(h // len(USER_COLORS)) % len(USER_MARKERS)]


def shade(color: str, k: float) -> tuple[float, float, float]:
    """``color`` darkened (``k`` < 1: times k, towards black) or lightened (``k`` > 1:
    mixed with white by the excess, at most 0.9)."""
    r, g, b = mcolors.to_rgb(color)
    if k <= 1:
        return (r * k, g * k, b * k)
    w = min(k - 1, 0.9)
    return (r + (1 - r) * w, g + (1 - g) * w, b + (1 - b) * w)


def shades(color: str, n: int) -> list[tuple[float, float, float]]:
    """``n`` shades of ``color``, light (first: mixed 60% with white) to dark (last: half
    as bright), the colour itself in the middle."""
    out = []
    for i in range(n):
        t = i / max(n - 1, 1)  # 0: light, 1: dark
        out.append(shade(color, 1 + 0.6 * (1 - 2 * t)) if t < 0.5 else shade(color, 1 - 0.5 * (2 * t - 1)))
    return out


def config_style(init: str, norm_position: str) -> dict:
    """Colour and marker of a configuration, the same in every figure (module docstring):
    the classic four their own; any other scheme its colour (the catalogue's, else one
    picked by its name), shaded by the placement, with the placement's marker where it
    has one, else the scheme's."""
    name = scheme_name(init)
    key = (name, norm_position)
    if key in CONFIG_COLORS:
        return {"color": CONFIG_COLORS[key], "marker": CONFIG_MARKERS[key]}
    index = catalogue_index(name)
    color, marker = _user_style(name) if index is None else catalogue_style(index)
    placement = PLACEMENTS.get(norm_position)
    if placement is not None:
        color = mcolors.to_hex(shade(color, placement.shade))
        marker = placement.marker or marker
    return {"color": color, "marker": marker}


def placement_label(norm_position: str) -> str:
    """The placement as the figures name it ("pre-norm", "no norm"); a name outside the
    registry (a CSV from elsewhere) as "<name>-norm"."""
    p = PLACEMENTS.get(norm_position)
    return p.label if p is not None else f"{norm_position}-norm"


def config_label(init: str, norm_position: str) -> str:
    return f"{init} init, {placement_label(norm_position)}"
