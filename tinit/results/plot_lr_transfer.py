"""lr_transfer.png: the optimum learning rate against width and against depth, per
scheme, with error bars over seeds (``tinit lr-sweep``).

Read it like the muP paper's Figure 1 turned on its side: a flat line means the best
lr found at the small model is the best at the large one (it transfers); a line
falling one octave per doubling means the optimum halves whenever the model doubles.
Each point is the mean over seeds of log2 lr* (each seed's optimum the parabola vertex
of its own loss curve), the bar its standard error; a point whose optimum lies at the
lr grid's edge (not bracketed, it may lie beyond) is drawn hollow with a cross. The
legend gives each line's drift and verdict (criterion under the figure)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..criteria import LR_CRITERION
from .plot_train import LINESTYLES, _figure, _legend_rows
from .style import FONT, NEUTRAL, config_label, config_style, footnote, integer_axis, styled, suptitle

#: axis -> (the column along it, the column held fixed, its label, the held value's label)
AXES = {"width": ("d_model", "n_layers", "width d_model", "L"),
        "depth": ("n_layers", "d_model", "layers L", "d")}


def _points(g: pd.DataFrame, along: str) -> pd.DataFrame:
    """Mean and SE over seeds of log2 lr* at each value along the axis, and whether any
    seed's optimum there is at the grid's edge."""
    out = []
    for x, h in g.groupby(along, sort=True):
        y = h["log2_lr_opt"].to_numpy(float)
        y = y[np.isfinite(y)]
        se = float(y.std(ddof=1) / np.sqrt(y.size)) if y.size >= 2 else 0.0
        out.append({"x": x, "mean": float(y.mean()) if y.size else np.nan, "se": se,
                    "edge": bool((~h["interior"].astype(bool)).any())})  # fmt: skip
    return pd.DataFrame(out)


@styled
def plot_lr_transfer(seed_optima: pd.DataFrame, drift: pd.DataFrame, title: str = "") -> Figure:
    """One panel per axis that varies (width, depth): log2 lr* against the axis (log2),
    a line per (scheme, norm position, warmup) in its colour and marker and per held
    value in its line style, error bars = SE over seeds."""
    axes_used = [a for a, (along, *_rest) in AXES.items() if seed_optima[along].nunique() >= 2]
    configs = list(dict.fromkeys(zip(seed_optima["init"], seed_optima["norm_position"], strict=True)))
    n_lines = sum(seed_optima[AXES[a][1]].nunique() for a in axes_used) * len(configs)
    fig, axes, key = _figure(n_lines + 2, ncols=max(len(axes_used), 1), row_height=3.4, ncol=2)
    handles, notes = [], []
    for ax, axis in zip(axes, axes_used, strict=False):
        along, fixed, xlabel, held_name = AXES[axis]
        helds = sorted(seed_optima[fixed].unique())
        keys = ["init", "norm_position", "warmup", fixed]
        for (init, pos, w, held), g in seed_optima.groupby(keys, sort=False):
            st = config_style(str(init), str(pos), configs.index((init, pos)))
            ls = LINESTYLES[helds.index(held) % len(LINESTYLES)]
            p = _points(g, along)
            x = p["x"].to_numpy(float)  # drawn on a log axis
            ax.errorbar(x, p["mean"], yerr=p["se"], color=st["color"], marker=st["marker"], mfc="none", ls=ls,
                        capsize=3, lw=1.4)  # fmt: skip
            edge = p["edge"].to_numpy(bool)
            if edge.any():
                ax.plot(x[edge], p["mean"][edge], ls="none", marker="x", ms=9, color=st["color"])
            d = drift[(drift["axis"] == axis) & (drift["init"] == init) & (drift["norm_position"] == pos)
                      & (drift["warmup"] == w) & (drift[fixed] == held)]  # fmt: skip
            fit = ""
            if len(d) and np.isfinite(d["slope"].iloc[0]):
                r = d.iloc[0]
                se = f" ± {r['slope_se']:.2f}" if np.isfinite(r["slope_se"]) else ""
                fit = f": {round(float(r['slope']), 2) + 0.0:+.2f}{se} per doubling, {r['verdict']}"
            handles.append(Line2D([], [], color=st["color"], marker=st["marker"], mfc="none", ls=ls,
                                  label=f"{config_label(str(init), str(pos))}, {held_name}={held}, "
                                  f"warmup {w} ({axis}){fit}"))  # fmt: skip
        integer_axis(ax, seed_optima[along].unique(), log=True)
        ax.set_xlabel(f"{xlabel} (log scale)")
        ax.set_ylabel("log2 optimum lr*\n(mean ± SE over seeds)")
        ax.set_title(f"Optimum lr against {axis}", fontsize=FONT)
    if not axes_used:
        axes[0].text(0.5, 0.5, "one width and one depth: no transfer to show", ha="center", va="center",
                     transform=axes[0].transAxes, fontsize=FONT)  # fmt: skip
    if (~seed_optima["interior"].astype(bool)).any():
        edge = "an optimum at the lr grid's edge (may lie beyond): not resolved"
        handles.append(Line2D([], [], color=NEUTRAL, marker="x", ls="none", ms=8, label=edge))
    _legend_rows(key, handles, ncol=1 if len(handles) > 6 else 2)
    notes.append(f"Drift = d log2 lr* / d log2 (width or L): mean of the per-seed least-squares slopes, "
                 f"± its SE over seeds (one seed: the regression's). Verdict: {LR_CRITERION}.")  # fmt: skip
    suptitle(fig, title)
    footnote(fig, notes)
    return fig
