"""Who is drawn how: the colour, marker and label of every configuration and category.

A configuration (scheme x norm placement) has one colour and one marker in every figure
(:func:`config_style`), keyed by the scheme's **name**, never by its place in the
catalogue or in a figure, so a scheme keeps its colour when another is added:

- the four classic configurations have their own (:data:`CONFIG_COLORS`: naive/pre red,
  gpt2/pre blue, naive/post orange, gpt2/post green); these four colours are reserved:
  nothing else is drawn in them;
- a catalogue scheme has its own colour and marker (:data:`SCHEME_STYLES`), shaded by
  the placement (its ``shade``, :mod:`tinit.model.placements`) and with the placement's
  marker where it has one (sandwich, reordered, none);
- a scheme the table does not name (a user's ``--init-file`` scheme, a scheme added to
  the catalogue without a colour of its own) takes one of :data:`USER_COLORS` and of
  :data:`USER_MARKERS`, picked by a hash of its name: the same in every figure and run,
  never a reserved colour, however many schemes there are.

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
#: Each catalogue scheme's (colour, marker) at pre-norm, by name. naive red and gpt2 blue
#: are the classic configurations'; every other colour avoids red, blue, orange and green,
#: so those four still mean the classic ones. A new scheme takes a colour no entry has.
SCHEME_STYLES = {
    "naive": ("#d62728", "o"),
    "gpt2": ("#1f77b4", "s"),
    "megatron": ("#9467bd", "^"),
    "depth-init": ("#8c564b", "v"),
    "small-wang": ("#e377c2", "<"),
    "mitchell": ("#7f7f7f", ">"),
    "full-megatron": ("#bcbd22", "p"),
    "olmo2": ("#17becf", "h"),
    "deepnet": ("#393b79", "*"),
    "t-fixup": ("#637939", "d"),
    "rezero": ("#8c6d31", "o"),
    "zero-out": ("#843c39", "s"),
    "nanochat": ("#7b4173", "^"),
    "mup": ("#5254a3", "v"),
    "completep": ("#b5cf6b", "<"),
    "depth-mup": ("#e7969c", ">"),
    "gemma": ("#de9ed6", "p"),
    "scaled-embed": ("#000000", "h"),
    "deepnet-torchscale": ("#6b6ecf", "*"),
    "magneto": ("#cedb9c", "d"),
    "megatron-mup": ("#a55194", "o"),
    "olmo-llama": ("#c49c94", "s"),
    "olmo-llama-depth": ("#dbdb8d", "^"),
    "olmo-fan-in": ("#9edae5", "v"),
    "olmo-normalized": ("#756bb1", "<"),
    "gemma2": ("#636363", ">"),
    "gemma3": ("#bd9e39", "p"),
    "mup-example": ("#ce6dbd", "h"),
    "deepnet-torchscale-lm": ("#8ca252", "*"),
    "magneto-lm": ("#9c9ede", "d"),
}
#: Colours of the schemes :data:`SCHEME_STYLES` does not name: none reserved, none a
#: catalogue scheme's, each dark enough to show as a translucent measured line.
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


def _user_style(name: str) -> tuple[str, str]:
    """A colour and marker for a scheme outside :data:`SCHEME_STYLES`, by its name alone
    (a stable hash: the same in every process, unlike ``hash``)."""
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
    color, marker = SCHEME_STYLES.get(name) or _user_style(name)
    placement = PLACEMENTS.get(norm_position)
    if placement is not None:
        color = mcolors.to_hex(shade(color, placement.shade))
        marker = placement.marker or marker
    return {"color": color, "marker": marker}


def config_color(init: str, norm_position: str) -> str:
    return config_style(init, norm_position)["color"]


def placement_label(norm_position: str) -> str:
    """The placement as the figures name it ("pre-norm", "no norm"); a name outside the
    registry (a CSV from elsewhere) as "<name>-norm"."""
    p = PLACEMENTS.get(norm_position)
    return p.label if p is not None else f"{norm_position}-norm"


def config_label(init: str, norm_position: str) -> str:
    return f"{init} init, {placement_label(norm_position)}"
