"""Figure and terminal table of ``tinit depth-sweep``: the final stream variance
against depth, with the variance law's lines, and the transfer check."""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter, ScalarFormatter
from rich.table import Table

from .. import theory
from ..criteria import SPREAD_K
from .plots import config_color, config_label, new_figure, wants_log
from .tables import fmt, summary_table

_MARKERS = ("o", "s", "^", "v")


def _log_x(depths: np.ndarray) -> bool:
    """Log depth axis when the depths span a factor of 8 or more."""
    return len(depths) > 1 and depths.min() > 0 and depths.max() / depths.min() >= 8


def _depth_axis(ax, depths: np.ndarray, log: bool, label: str) -> None:
    """Depth on x: log scale for wide ranges, ticks at the swept depths when few."""
    if log:
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
    if len(depths) <= 12:
        ax.set_xticks(depths, [str(int(d)) for d in depths])
    elif log:
        ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel(label)


def _theory_curve(fit_row, v0: float, lo: float, hi: float, log: bool) -> tuple[np.ndarray, np.ndarray]:
    """The configuration's theory line v_2L(L) on a dense grid of depths."""
    grid = np.geomspace(lo, hi, 200) if log else np.linspace(lo, hi, 200)
    pos, scaled = fit_row["norm_position"], bool(fit_row["depth_scaled"])
    return grid, theory.v_final_depth(grid, v0, fit_row["theory_branch_var"], pos, scaled)


def _errorbars(ax, d: pd.DataFrame, y: str, init: str, pos: str, i: int) -> None:
    """Mean over seeds with one-standard-error bars; later configurations thinner."""
    ax.errorbar(d["n_layers"], d[f"{y}_mean"], yerr=d[f"{y}_se"].fillna(0.0),
                color=config_color(init, pos, i), lw=max(2.4 - 0.4 * i, 1.0), marker=_MARKERS[i % 4],
                ms=7 - i, mfc="none", capsize=3, label=config_label(init, pos))  # fmt: skip


def plot_depth_sweep(summary: pd.DataFrame, fit: pd.DataFrame, title: str = "") -> Figure:
    """The final stream variance against depth L, mean with error bars of one
    standard error over seeds, with each configuration's theory line dashed:

    - pre-norm panel: v_2L / v0, theory 1 + 2L sigma^2 (naive) and 1 + sigma^2 (scaled),
      sigma^2 = s^2 / v0 with s^2 the configuration's own mean (unscaled-equivalent)
      branch variance (:func:`tinit.experiments.depth_sweep.theory_branch_var`);
    - post-norm panel: v_2L itself (the sum before the last norm), theory 1 + s^2
      (naive) and 1 + s^2 / 2L (scaled): the norm resets the stream, v0 plays no part;
    - gradient panel: the first/last-layer W_down gradient-norm ratio (omitted when
      every ratio is missing, e.g. a run without gradients).
    """
    positions = [p for p in ("pre", "post") if (summary["norm_position"] == p).any()]
    has_grads = bool(summary["grad_ratio_mean"].notna().any())
    fig, axes = new_figure(ncols=len(positions) + has_grads, width=5.6)
    depths = np.sort(summary["n_layers"].unique()).astype(float)
    logx = _log_x(depths)
    n_seeds = int(summary["n_seeds"].max())
    groups = list(summary.groupby(["init", "norm_position"], sort=False))
    spread = f"mean ± 1 s.e. over {n_seeds} seeds" if n_seeds > 1 else "measured (1 seed: no error bars)"
    for ax, pos in zip(axes, positions, strict=False):
        values = []
        rel = pos == "pre"
        y = "v_final_rel" if rel else "v_final"
        for i, ((init, p), d) in enumerate(groups):
            if p != pos:
                continue
            d = d.sort_values("n_layers")
            _errorbars(ax, d, y, init, p, i)
            values.append(d[f"{y}_mean"])
            row = fit[(fit["init"] == init) & (fit["norm_position"] == p)]
            if len(row):
                v0 = float(d["v0_mean"].mean())
                x, curve = _theory_curve(row.iloc[0], v0, depths[0], depths[-1], logx)
                with np.errstate(all="ignore"):  # v0 = 0 (vanished): no theory line to draw
                    curve = curve / v0 if rel else curve
                ax.plot(x, curve, color=config_color(init, p, i), lw=1.3, ls="--", alpha=0.9)
                values.append(pd.Series(curve))
        _depth_axis(ax, depths, logx, "layers L (2L residual additions)")
        if rel and wants_log(pd.concat(values)):
            ax.set_yscale("log")
        if not rel:
            ax.ticklabel_format(axis="y", useOffset=False, style="plain")
        if rel:
            ax.set_ylabel(r"final stream variance $v_{2L}\,/\,v_0$")
            ax.set_title("Pre-norm: final stream variance")
            law = r"theory: $1 + 2L\sigma^2$ (naive), $1 + \sigma^2$ (scaled)"
        else:
            ax.set_ylabel(r"$v_{2L}$ (the sum before the last norm)")
            ax.set_title("Post-norm: final sum's variance")
            law = r"theory: $1 + s^2$ (naive), $1 + s^2/2L$ (scaled)"
        handles, _ = ax.get_legend_handles_labels()
        style = [
            Line2D([], [], color="0.3", lw=1.8, marker="o", mfc="none", label=spread),
            Line2D([], [], color="0.3", lw=1.3, ls="--", label=law),
        ]
        ax.legend(handles=handles + style, fontsize=8, loc="best")
        ax.grid(True, which="major", alpha=0.3)
    if has_grads:
        bx = axes[-1]
        for i, ((init, pos), d) in enumerate(groups):
            _errorbars(bx, d.sort_values("n_layers"), "grad_ratio", init, pos, i)
        bx.axhline(1.0, color="0.4", ls=":", lw=1.2, label="equal first and last layer")
        _depth_axis(bx, depths, logx, "layers L")
        if wants_log(summary["grad_ratio_mean"], ratio=10):
            bx.set_yscale("log")
        bx.set_ylabel(r"$\|\nabla W_{down}\|$ first layer / last layer")
        bx.set_title(r"$W_{down}$ gradient ratio, first/last layer")
        bx.legend(fontsize=8, loc="best")
        bx.grid(True, which="major", alpha=0.3)
    if title:  # wrapped to the figure's width (about 11 characters an inch)
        fig.suptitle(textwrap.fill(title, int(fig.get_figwidth() * 11)))
    return fig


def _pm(x: float, se: float, digits: int = 3) -> str:
    """x ± se, with at least enough digits in x to resolve se."""
    if x is None or not math.isfinite(x):
        return "-"
    if se is not None and math.isfinite(se) and se > 0 and x != 0:
        digits = min(max(digits, math.ceil(math.log10(abs(x) / se)) + 1), 8)
    return fmt(x, digits) + (f" ± {fmt(se, 2)}" if se is not None and math.isfinite(se) else "")


def depth_sweep_table(fit: pd.DataFrame, summary: pd.DataFrame, title: str = "") -> Table:
    """One row per configuration: the ratio v_2L(L_max) / v_2L(L_min), whether the
    deepest stays within the seeds' spread of the shallowest, the fitted slope of v_2L
    against L beside the theory's, and the W_down gradient ratio at L_max."""
    lo = int(fit["layers_min"].min()) if len(fit) else 0
    hi = int(fit["layers_max"].max()) if len(fit) else 0
    t = summary_table(
        title,
        f"ratio = v_2L(L={hi}) / v_2L(L={lo}) ± 1 s.e. over seeds. transfers: "
        f"|v_2L({hi}) − v_2L({lo})| ≤ {SPREAD_K:g}·sqrt(se({hi})² + se({lo})²) (needs ≥ 2 seeds). "
        "slope: least squares of v_2L on L over every (L, seed) ± s.e. over seeds; theory: "
        "2·mean(s²) naive pre-norm, 0 scaled or post-norm; z = (slope − theory) / s.e. "
        f"grad: |∇W_down| first / last layer at L={hi}.",
    )
    for col in ("config", "ratio", "transfers", "slope", "theory", "z", "grad"):
        t.add_column(col, justify="left" if col == "config" else "right", no_wrap=True)
    for r in fit.itertuples(index=False):
        s = summary[(summary["init"] == r.init) & (summary["norm_position"] == r.norm_position)]
        grad = s[s["n_layers"] == r.layers_max]["grad_ratio_mean"]
        if r.within_spread is None or (isinstance(r.within_spread, float) and math.isnan(r.within_spread)):
            verdict = "-"
        else:
            verdict = "[green]yes[/]" if bool(r.within_spread) else "[red]no[/]"
        slope_se = r.slope_se_seeds if r.n_seeds > 1 else r.slope_se
        z = r.slope_z
        ok = math.isfinite(z)
        z_style = "green" if ok and abs(z) <= 2 else "yellow" if ok and abs(z) <= 3 else "red"
        t.add_row(
            f"{r.init}/{r.norm_position}",
            "×" + _pm(r.ratio_max_min, r.ratio_max_min_se, 4),
            verdict,
            _pm(r.slope, slope_se),
            fmt(r.theory_slope, 3),
            f"[{z_style}]{fmt(z, 2)}[/]" if ok else "-",
            fmt(float(grad.iloc[0]), 3) if len(grad) else "-",
        )
    return t
