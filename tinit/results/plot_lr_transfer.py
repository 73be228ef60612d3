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

from ..criteria import LR_CRITERION, LR_LEVEL
from . import style
from .palette import config_label, config_style

#: axis -> (the column along it, the column held fixed, its label, the held value's label)
AXES = {
    "width": ("d_model", "n_layers", "width d_model", "L"),
    "depth": ("n_layers", "d_model", "layers L", "d"),
}


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


@style.styled
def plot_lr_transfer(
    seed_optima: pd.DataFrame,
    drift: pd.DataFrame,
    title: str = "",
    lr_grid: tuple[float, float] | None = None,
) -> Figure:
    """One panel per axis that varies (width, depth): log2 lr* against the axis (log2),
    a line per (scheme, norm position, warmup) in its colour and marker and per held
    value in its line style, error bars = SE over seeds; ``lr_grid`` (lowest, highest lr
    swept) drawn as dotted lines: an optimum on one is not bracketed."""
    axes_used = [a for a, (along, *_rest) in AXES.items() if seed_optima[along].nunique() >= 2]
    configs = list(dict.fromkeys(zip(seed_optima["init"], seed_optima["norm_position"], strict=True)))
    n_lines = sum(seed_optima[AXES[a][1]].nunique() for a in axes_used) * len(configs)
    ncol = 1  # the labels are long (drift and verdict): one column
    key_h = style.key_rows_height(n_lines + 2, ncol)
    fig, axes, key = style.new_figure_with_key(max(len(axes_used), 1), row_height=3.4, key_height=key_h)
    handles, notes = [], []
    for ax, axis in zip(axes, axes_used, strict=False):
        along, fixed, xlabel, held_name = AXES[axis]
        helds = sorted(seed_optima[fixed].unique())
        keys = ["init", "norm_position", "warmup", fixed]
        series = {}
        for n, ((init, pos, w, held), g) in enumerate(seed_optima.groupby(keys, sort=False)):
            st = config_style(str(init), str(pos))
            ls = style.LINESTYLES[helds.index(held) % len(style.LINESTYLES)]
            p = _points(g, along)
            x = p["x"].to_numpy(float)  # drawn on a log axis
            ax.errorbar(x, p["mean"], yerr=p["se"], color=st["color"], marker=st["marker"], mfc="none", ls=ls,
                        capsize=3, lw=1.4, ms=style.nested_marker_size(n % 4))  # fmt: skip
            series[f"{init}/{pos}, {held_name}={held}, warmup {w}"] = p["mean"].to_numpy(float)
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
        if lr_grid is not None:
            for v in np.log2(lr_grid):
                ax.axhline(v, color=style.NEUTRAL, ls=":", lw=1)
            lo, hi = np.log2(lr_grid)
            ax.set_ylim(min(lo, ax.get_ylim()[0]) - 0.3, max(hi, ax.get_ylim()[1]) + 0.3)
        notes.append(style.coincidence_note(style.coincidences(series, ax), f"lr* against {axis}"))
        style.integer_axis(ax, seed_optima[along].unique(), log=True)
        ax.set_xlabel(f"{xlabel} (log scale)")
        ax.set_ylabel("log2 optimum lr*\n(mean ± SE over seeds)")
        ax.set_title(f"Optimum lr against {axis}", fontsize=style.FONT)
    if not axes_used:
        axes[0].text(0.5, 0.5, "one width and one depth: no transfer to show", ha="center", va="center",
                     transform=axes[0].transAxes, fontsize=style.FONT)  # fmt: skip
    if lr_grid is not None:
        handles.append(Line2D([], [], color=style.NEUTRAL, ls=":", label="lowest and highest lr swept"))
    if (~seed_optima["interior"].astype(bool)).any():
        edge = "an optimum at the lr grid's edge (may lie beyond): not resolved"
        handles.append(Line2D([], [], color=style.NEUTRAL, marker="x", ls="none", ms=8, label=edge))
    style.key_legend(key, handles, ncol, handlelength=2.6)
    notes.append(f"Drift = d log2 lr* / d log2 (width or L): mean of the per-seed least-squares slopes, "
                 f"± its SE over seeds (one seed: the regression's). Verdict: {LR_CRITERION}.")  # fmt: skip
    style.suptitle(fig, title)
    style.footnote(fig, notes)
    return fig


def _signed(x: float) -> str:
    return "-" if not np.isfinite(x) else f"{round(float(x), 2) + 0.0:+.2f}"


def drift_tables(frames: dict[str, pd.DataFrame]) -> list:
    """The terminal's tables: each drift with its SE, interval and verdict, and which
    scheme moves less (when several were swept)."""
    from .tables import fmt, summary_table

    out = []
    drift = frames.get("lr_drift")
    if drift is not None and len(drift):
        t = summary_table("lr* drift: d log2 lr* / d log2 (width or L)", LR_CRITERION)
        for col in ("scheme", "axis", "at", "drift", "±SE", "95% interval", "seeds", "verdict"):
            t.add_column(col, justify="left" if col in ("scheme", "axis", "verdict", "at") else "right")
        for _, r in drift.iterrows():
            at = f"L={int(r['n_layers'])}" if r["axis"] == "width" else f"d={int(r['d_model'])}"
            ci = f"[{r['ci_low']:+.2f}, {r['ci_high']:+.2f}]" if np.isfinite(r["ci_low"]) else "-"
            t.add_row(f"{r['init']}/{r['norm_position']}", str(r["axis"]), at, _signed(r["slope"]),
                      fmt(r["slope_se"], 2), ci, str(r["seeds"]),
                      str(r["verdict"]) + (f" ({r['note']})" if r["note"] else ""))  # fmt: skip
        out.append(t)
    cmp = frames.get("lr_drift_compare")
    if cmp is not None and len(cmp):
        why = (
            f"{LR_LEVEL:.0%} Student-t interval of the difference (SEs added in quadrature); not resolved "
            "when it includes 0 or a drift has no SE or bracketed optimum"
        )
        t = summary_table("whose optimum moves less: |drift b| - |drift a|", why)
        for col in ("a", "b", "axis", "at", "|a|", "|b|", "|b| - |a|", "±SE", "verdict"):
            t.add_column(col, justify="left" if col in ("a", "b", "axis", "at", "verdict") else "right")
        for _, r in cmp.iterrows():
            at = f"L={int(r['n_layers'])}" if r["axis"] == "width" else f"d={int(r['d_model'])}"
            at = f"{r['norm_position']}, {at}" if cmp["norm_position"].nunique() > 1 else at
            t.add_row(str(r["init_a"]), str(r["init_b"]), str(r["axis"]), at, _signed(r["abs_slope_a"]),
                      _signed(r["abs_slope_b"]), _signed(r["difference"]), fmt(r["difference_se"], 2),
                      str(r["verdict"]))  # fmt: skip
        out.append(t)
    return out
