"""Figures and table of the coordinate check, in microsoft/mup's style
(``mup/coord_check.py`` ``plot_coord_data``): one panel per step, the activation scale
against width on log-log axes (base 2), the same y range across the steps of a row.

- :func:`plot_coord_width` (coord_check.png): one row per scheme and depth, one line per
  quantity (the geometric mean over the layers that carry it, i.e. what the fit fits),
  the fitted slope of the last step in the legend.
- :func:`plot_coord_layers` (coord_check_layers_*.png): mup's own view, one line per
  layer, coloured by depth in the stack, one row per quantity, for one scheme and depth.
- :func:`plot_coord_depth` (coord_check_depth.png): the same against depth, one row per
  scheme and width.

Each point is the mean over seeds of log2 RMS (a geometric mean); the verdict of the
row's scheme and axis stands in the row's title.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator
from rich.table import Table

from ..criteria import COORD_SLOPE_TOL
from .style import FONT, FULL_WIDTH, footnote, styled, suptitle
from .tables import summary_table

#: Quantities in stack order, with a colour each (tab10's, none of the four reserved for the
#: classic configurations, palette.CONFIG_COLORS).
QUANTITY_COLORS = {"embed": "#7f7f7f", "attn": "#9467bd", "ffn": "#8c564b", "stream": "#17becf",
                   "logits": "#e377c2"}  # fmt: skip
QUANTITY_LABELS = {"embed": "embedding", "attn": "attention branch", "ffn": "FFN branch",
                   "stream": "stream after block", "logits": "logits"}  # fmt: skip
AXIS = {"width": ("d_model", "n_layers", "width d", "L"), "depth": ("n_layers", "d_model", "depth L", "d")}


#: The most step panels a row draws: the plotting time must not grow with --steps.
MAX_STEP_PANELS = 6


def panel_steps(steps, most: int = MAX_STEP_PANELS) -> list[int]:
    """The steps that get a panel: all of them up to ``most``, else ``most`` chosen evenly,
    the first and the last always among them."""
    steps = sorted(int(s) for s in steps)
    if len(steps) <= most:
        return steps
    picks = sorted({round(i * (len(steps) - 1) / (most - 1)) for i in range(most)})
    return [steps[i] for i in picks]


def _steps_note(all_steps, drawn: list[int]) -> list[str]:
    """Says which steps have a panel when not all do."""
    all_steps = sorted(int(s) for s in all_steps)
    if len(drawn) == len(all_steps):
        return []
    return [
        f"Panels at steps {', '.join(map(str, drawn))} of {all_steps[0]}..{all_steps[-1]} "
        f"(at most {MAX_STEP_PANELS}, evenly spaced; the fit and coord_check.csv use every step)."
    ]


def _geo(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """2^(mean over layers and seeds of log2 RMS) per ``keys`` (an exactly zero RMS,
    which a log axis cannot show, and a non-finite one, an overflow, are left out and
    named in the notes)."""
    rms = frame["rms"].to_numpy(dtype=np.float64)
    f = frame[np.isfinite(rms) & (rms > 0)]
    with np.errstate(divide="ignore", invalid="ignore"):
        f = f.assign(log_rms=np.log2(f["rms"].to_numpy(dtype=np.float64)))
    per_seed = f.groupby([*keys, "seed"], sort=True)["log_rms"].mean()
    return np.exp2(per_seed.groupby(keys, sort=True).mean()).rename("rms").reset_index()


def _verdict_text(fit: pd.DataFrame, init: str, pos: str, axis: str) -> str:
    g = fit[(fit["init"] == init) & (fit["norm_position"] == pos) & (fit["axis"] == axis)]
    d = g[g["verdict"].notna()]
    if not len(d):
        return f"no {axis} verdict (one {axis})"
    r = d.iloc[0]
    fixed, label = AXIS[axis][1], AXIS[axis][3]
    over = "all depths" if axis == "width" else "all widths"
    return (
        f"{r['verdict']} over {over} (worst: {r['quantity']} at {label}={int(r[fixed])}, step "
        f"{int(r['step'])}, slope {_f2(r['slope'])})"
    )


def _log2_axes(ax, xs: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(xs))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(x) for x in xs], fontsize=FONT)
    ax.grid(True, which="major", alpha=0.3)


def _rows_figure(
    nrows: int, ncols: int, handles: list, row_h: float = 1.55
) -> tuple[Figure, list, np.ndarray]:
    """A figure with a key row (the legend) on top, then one subfigure per row of
    panels (its title says which scheme and verdict), the panels of a row sharing y."""
    key_h = 0.3 if handles else 0.5
    fig = Figure(figsize=(FULL_WIDTH, key_h + row_h * nrows + 0.5), layout="constrained")
    subs = fig.subfigures(nrows + 1, 1, height_ratios=[key_h] + [row_h] * nrows)
    if handles:
        subs[0].legend(handles=handles, loc="center", ncol=len(handles), fontsize=FONT, frameon=False)
    axes = np.empty((nrows, ncols), dtype=object)
    for i, sub in enumerate(subs[1:]):
        axes[i] = sub.subplots(1, ncols, sharey=True)
        for ax in axes[i]:
            ax.tick_params(labelsize=FONT)
    return fig, list(subs[1:]), axes


#: The strides (octaves) a log2 RMS axis is labelled at: the smallest that keeps its labels
#: to at most MAX_LABELS (matplotlib's own choice labelled 2^5, 2^-2, 2^-9, or two octaves).
OCTAVE_STRIDES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50)
MAX_LABELS = 5


def _octave_ticks(ax) -> None:
    """Label a log2 y axis at every octave, or at a regular stride of them (the smallest
    of :data:`OCTAVE_STRIDES` with at most :data:`MAX_LABELS` labels), so each axis
    carries three labels or more at one stated step (the row's shared axis: the panels
    of a row share their ticks)."""
    lo, hi = sorted(ax.get_ylim())
    if not (lo > 0 and np.isfinite(hi)):
        return
    first, last = math.ceil(math.log2(lo) - 1e-9), math.floor(math.log2(hi) + 1e-9)
    stride = next((s for s in OCTAVE_STRIDES if (last - first) // s + 1 <= MAX_LABELS), OCTAVE_STRIDES[-1])
    ks = list(range(-(-first // stride) * stride, last + 1, stride))
    if len(ks) < 3 and stride > 1:  # a multiple of the stride fell outside: start at the first octave
        ks = list(range(first, last + 1, stride))
    ax.yaxis.set_major_locator(FixedLocator([2.0**k for k in ks]))
    ax.yaxis.set_minor_locator(NullLocator())


def _min_span(axes_row, octaves: float = 3.0) -> None:
    """Widen a row's shared log2 y range to at least ``octaves`` around its middle: a
    flat quantity then looks flat (and the axis has three tick labels or more), then
    label it at a regular stride of octaves (:func:`_octave_ticks`)."""
    drawn = [y for ax in axes_row for line in ax.get_lines() for y in np.asarray(line.get_ydata(), float)]
    if not drawn:  # nothing finite and positive to draw (every RMS zero or an overflow): a valid empty axis
        axes_row[0].set_ylim(2 ** (-octaves / 2), 2 ** (octaves / 2))
        for ax in axes_row:
            ax.text(0.5, 0.5, "nothing drawable\n(see the notes)", transform=ax.transAxes, ha="center",
                    va="center", fontsize=FONT, color="0.4")  # fmt: skip
        return
    lo, hi = axes_row[0].get_ylim()
    if lo > 0 and hi > 0 and math.log2(hi / lo) < octaves:
        mid = math.sqrt(lo * hi)
        axes_row[0].set_ylim(mid * 2 ** (-octaves / 2), mid * 2 ** (octaves / 2))
    _octave_ticks(axes_row[0])


def _row_title(sub, text: str) -> None:
    sub.suptitle(text, fontsize=FONT, x=0.01, ha="left")


def _rows_panels(rows: pd.DataFrame, fit: pd.DataFrame, axis: str, title: str) -> Figure:
    x_col, fixed, x_label, fixed_label = AXIS[axis]
    steps = panel_steps(rows["step"].unique())
    rows_all, rows = rows, rows[rows["step"].isin(steps)]
    keys = list(rows[["init", "norm_position", fixed]].drop_duplicates().itertuples(index=False))
    xs = sorted(int(x) for x in rows[x_col].unique())
    agg = _geo(rows, ["init", "norm_position", fixed, "quantity", "step", x_col])
    quantities = [q for q in QUANTITY_COLORS if q in set(rows["quantity"])]
    handles = [Line2D([], [], color=QUANTITY_COLORS[q], marker="o", ms=3, lw=1.3, label=QUANTITY_LABELS[q])
               for q in quantities]  # fmt: skip
    fig, subs, axes = _rows_figure(len(keys), len(steps), handles)
    for i, (init, pos, fv) in enumerate(keys):
        sub = agg[(agg["init"] == init) & (agg["norm_position"] == pos) & (agg[fixed] == fv)]
        for j, step in enumerate(steps):
            ax = axes[i, j]
            for q in quantities:
                d = sub[(sub["quantity"] == q) & (sub["step"] == step)].sort_values(x_col)
                ax.plot(d[x_col], d["rms"], color=QUANTITY_COLORS[q], marker="o", ms=3, lw=1.3)
            _log2_axes(ax, xs)
            ax.set_title(f"step {step}", fontsize=FONT)
            ax.set_xlabel(x_label, fontsize=FONT)
            if j == 0:
                ax.set_ylabel("RMS", fontsize=FONT)
        _min_span(axes[i])
        _row_title(subs[i], f"{init}/{pos}, {fixed_label}={int(fv)}: {_verdict_text(fit, init, pos, axis)}")
    suptitle(fig, title)
    footnote(fig, [f"RMS: geometric mean over the layers carrying a quantity and over seeds; log2 axes. "
                   f"{axis}-stable: every slope of log RMS against log {x_label.split()[-1]} within "
                   f"{COORD_SLOPE_TOL:g} of 0 (logits: at most {COORD_SLOPE_TOL:g}) at every step "
                   "(coord_check_fit.csv)."] + _steps_note(rows_all["step"].unique(), steps)
                  + _zero_note(rows))  # fmt: skip
    return fig


@styled
def plot_coord_width(rows: pd.DataFrame, fit: pd.DataFrame, title: str = "") -> Figure:
    """RMS against width, one row per scheme and depth, one panel per step, one line
    per quantity."""
    return _rows_panels(rows, fit, "width", title)


@styled
def plot_coord_depth(rows: pd.DataFrame, fit: pd.DataFrame, title: str = "") -> Figure:
    """RMS against depth, one row per scheme and width, one panel per step."""
    return _rows_panels(rows, fit, "depth", title)


@styled
def plot_coord_layers(rows: pd.DataFrame, fit: pd.DataFrame, init: str, pos: str, n_layers: int,
                      title: str = "") -> Figure:  # fmt: skip
    """mup's view for one scheme and depth: RMS against width, one panel per step, one
    line per layer coloured by its depth in the stack (embedding first, logits last),
    one row per quantity."""
    g = rows[(rows["init"] == init) & (rows["norm_position"] == pos) & (rows["n_layers"] == n_layers)]
    steps = panel_steps(g["step"].unique())
    g_all, g = g, g[g["step"].isin(steps)]
    xs = sorted(int(x) for x in g["d_model"].unique())
    quantities = [q for q in QUANTITY_COLORS if q in set(g["quantity"])]
    agg = _geo(g, ["quantity", "layer", "step", "d_model"])
    fig, subs, axes = _rows_figure(len(quantities), len(steps), [], row_h=1.35)
    cmap, norm = colormaps["viridis"], Normalize(-1, n_layers)
    for i, q in enumerate(quantities):
        for j, step in enumerate(steps):
            ax = axes[i, j]
            d = agg[(agg["quantity"] == q) & (agg["step"] == step)]
            for layer, dl in d.groupby("layer", sort=True):
                dl = dl.sort_values("d_model")
                ax.plot(dl["d_model"], dl["rms"], color=cmap(norm(layer)), marker="o", ms=2.5, lw=1.1)
            _log2_axes(ax, xs)
            ax.set_title(f"step {step}", fontsize=FONT)
            ax.set_xlabel("width d", fontsize=FONT)
            if j == 0:
                ax.set_ylabel("RMS", fontsize=FONT)
        _min_span(axes[i])
        _row_title(subs[i], QUANTITY_LABELS[q])
    bar = subs[0].get_figure(root=True).subfigs[0]  # the key row: the colour scale of the layers
    cax = bar.add_axes((0.25, 0.35, 0.5, 0.3))
    cb = bar.colorbar(_mappable(cmap, norm), cax=cax, orientation="horizontal")
    cb.set_label("layer (-1: embedding, 0..L-1: blocks, L: logits)", fontsize=FONT)
    cb.ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole: no tick at -0.5
    cb.ax.tick_params(labelsize=FONT)
    suptitle(fig, f"{init}/{pos}, L={n_layers}: {_verdict_text(fit, init, pos, 'width')}" +
             (f"; {title}" if title else ""))  # fmt: skip
    footnote(
        fig,
        [
            "One line per layer (geometric mean over seeds), coloured by depth in the stack; log2 axes.",
            *_steps_note(g_all["step"].unique(), steps),
        ],
    )
    return fig


def _zero_note(rows: pd.DataFrame) -> list[str]:
    """A quantity exactly zero (a zero-initialised readout's logits at step 0) has no
    place on a log axis: say so rather than leave a silent gap."""
    notes = []
    rms = rows["rms"].to_numpy(dtype=np.float64)
    for mask, why in ((rms == 0, "Exactly zero, not drawn (nothing to fit)"),
                      (~np.isfinite(rms), "Not finite (overflow), not drawn")):  # fmt: skip
        bad = rows[mask]
        what = sorted({f"{q} at step {s}" for q, s in zip(bad["quantity"], bad["step"], strict=True)})
        if what:
            notes.append(f"{why}: {', '.join(what[:6])}{', ...' if len(what) > 6 else ''}")
    return notes


def _mappable(cmap, norm):
    from matplotlib.cm import ScalarMappable

    return ScalarMappable(norm=norm, cmap=cmap)


def layer_figure_stem(init: str, pos: str, n_layers: int) -> str:
    """coord_check_layers_<init>-<pos>-L<n>: a file name whatever the scheme is called."""
    return re.sub(r"[^A-Za-z0-9_.+=-]", "_", f"coord_check_layers_{init}-{pos}-L{n_layers}")


def coord_figures(rows: pd.DataFrame, fit: pd.DataFrame, title: str = "") -> dict[str, Figure]:
    """Every figure of a check: width (always), depth (two depths or more) and, with two
    widths or more, the per-layer view of each scheme at its deepest depth (the one with
    the most layers to tell apart; coord_check.csv has every depth's)."""
    figs = {"coord_check": plot_coord_width(rows, fit, title)}
    if rows["n_layers"].nunique() > 1:
        figs["coord_check_depth"] = plot_coord_depth(rows, fit, title)
    if rows["d_model"].nunique() > 1:
        deepest = rows.groupby(["init", "norm_position"], sort=False)["n_layers"].max()
        for (init, pos), L in deepest.items():
            figs[layer_figure_stem(init, pos, int(L))] = plot_coord_layers(
                rows, fit, init, pos, int(L), title
            )
    return figs


def coord_table(summary: list[dict], title: str) -> Table:
    """One row per scheme and axis: the verdict with its deciding (worst) slope."""
    tol = f"{COORD_SLOPE_TOL:g}"
    t = summary_table(title, f"stable: every |slope| of log RMS vs log width (depth) <= {tol} (logits: "
                             f"slope <= {tol}) at every step; worst row shown")  # fmt: skip
    for col in ("scheme", "axis", "verdict", "worst", "step", "at", "slope", "±SE", "outside"):
        t.add_column(col, justify="left" if col in ("scheme", "axis", "verdict", "worst") else "right",
                     no_wrap=col != "scheme")  # fmt: skip
    for s in summary:
        name = f"{s['init']}/{s['norm_position']}"
        if s["verdict"] is None:
            t.add_row(name, s["axis"], f"- (one {s['axis']})", "", "", "", "", "", "")
            continue
        fixed, label = AXIS[s["axis"]][1], AXIS[s["axis"]][3]
        fv = s.get(fixed)
        at = "" if fv is None or _nan(fv) else f"{label}={int(fv)}"
        t.add_row(name, s["axis"], s["verdict"], s["quantity"], str(s["step"]), at, _f2(s["slope"]),
                  _f2(s["slope_se"]), f"{s['outside']}/{s['rows']}")  # fmt: skip
    return t


def _nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _f2(x) -> str:
    """A slope with two decimals ('-' when missing)."""
    return "-" if x is None or _nan(float(x)) else f"{float(x):.2f}"
