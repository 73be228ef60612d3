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

from ..experiments.depth_sweep import SPREAD_K
from .plots import config_color, config_label, new_figure, scheme_legend, wants_log
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


def _errorbars(ax, d: pd.DataFrame, y: str, init: str, pos: str, i: int, many: bool = False) -> None:
    """Mean over seeds with one-standard-error bars; later configurations thinner."""
    ax.errorbar(d["n_layers"], d[f"{y}_mean"], yerr=d[f"{y}_se"].fillna(0.0),
                color=config_color(init, pos, i), lw=1.4 if many else max(2.4 - 0.4 * i, 1.0),
                marker=_MARKERS[i % 4], ms=5 if many else 7 - i, mfc="none", capsize=3,
                label=config_label(init, pos))  # fmt: skip


def plot_depth_sweep(
    summary: pd.DataFrame, fit: pd.DataFrame, title: str = "", theory_curves: pd.DataFrame | None = None
) -> Figure:
    """The final stream variance against depth L, mean with error bars of one
    standard error over seeds, with each configuration's own closed form dashed
    (``theory_curves``: the ``depth_sweep_theory`` frame; without it, the closed form
    at the swept depths). One panel per norm placement:

    - pre-norm style placements (pre, sandwich, reordered, none): v_2L - v0, what the
      2L additions added to the embedding's variance (mean over seeds of each seed's
      difference), so that a scheme whose embedding dwarfs its branches (depth-init's
      N(0, 1)) still shows its depth law: ln L, flat, 1/L;
    - post-norm: v_2L itself (the sum before the last norm): the norm resets the
      stream, v0 plays no part;
    - gradient panel: the first/last-layer W_down gradient-norm ratio (omitted when
      every ratio is missing, e.g. a run without gradients).
    """
    positions = list(dict.fromkeys(summary["norm_position"]))
    has_grads = bool(summary["grad_ratio_mean"].notna().any())
    n = len(positions) + has_grads
    fig, axes = new_figure(ncols=min(n, 3), nrows=-(-n // 3), width=5.6)
    for ax in axes[n:]:
        ax.set_visible(False)
    depths = np.sort(summary["n_layers"].unique()).astype(float)
    logx = _log_x(depths)
    n_seeds = int(summary["n_seeds"].max())
    groups = list(summary.groupby(["init", "norm_position"], sort=False))
    many = len(groups) > 6
    spread = f"mean ± 1 s.e. over {n_seeds} seeds" if n_seeds > 1 else "measured (1 seed: no error bars)"
    for ax, pos in zip(axes, positions, strict=False):
        values = []
        rel = pos != "post"
        y = "v_growth" if rel else "v_final"
        for i, ((init, p), d) in enumerate(groups):
            if p != pos:
                continue
            d = d.sort_values("n_layers")
            _errorbars(ax, d, y, init, p, i, many)
            values.append(d[f"{y}_mean"])
            if theory_curves is not None:
                t = theory_curves[(theory_curves["init"] == init) & (theory_curves["norm_position"] == p)]
                x, curve = t["n_layers"].to_numpy(), t["theory_v_growth" if rel else "theory_v_final"]
            else:
                x, curve = d["n_layers"].to_numpy(), d["theory_v_growth" if rel else "theory_v_final"]
            ax.plot(x, curve, color=config_color(init, p, i), lw=1.3, ls="--", alpha=0.9)
            values.append(pd.Series(np.asarray(curve)))
        _depth_axis(ax, depths, logx, "layers L (2L residual additions)")
        if wants_log(pd.concat(values)):
            ax.set_yscale("log")
        elif not rel:
            ax.ticklabel_format(axis="y", useOffset=False, style="plain")
        if rel:
            ax.set_ylabel(r"$v_{2L} - v_0$ (added by the 2L branches)")
            ax.set_title(f"{pos}-norm: final stream variance", fontsize=10)
        else:
            ax.set_ylabel(r"$v_{2L}$ (the sum before the last norm)")
            ax.set_title("post-norm: final sum's variance", fontsize=10)
        style = [
            Line2D([], [], color="0.3", lw=1.8, marker="o", mfc="none", label=spread),
            Line2D([], [], color="0.3", lw=1.3, ls="--", label="each scheme's closed form"),
        ]
        ax.legend(handles=style, fontsize=7, loc="best")
        ax.grid(True, which="major", alpha=0.3)
    if has_grads:
        bx = axes[n - 1]
        for i, ((init, pos), d) in enumerate(groups):
            _errorbars(bx, d.sort_values("n_layers"), "grad_ratio", init, pos, i, many)
        bx.axhline(1.0, color="0.4", ls=":", lw=1.2, label="equal first and last layer")
        _depth_axis(bx, depths, logx, "layers L")
        if wants_log(summary["grad_ratio_mean"], ratio=10):
            bx.set_yscale("log")
        bx.set_ylabel(r"$\|\nabla W_{down}\|$ first layer / last layer")
        bx.set_title(r"$W_{down}$ gradient ratio, first/last layer", fontsize=10)
        bx.legend(handles=[Line2D([], [], color="0.4", ls=":", label="equal first and last layer")],
                  fontsize=7, loc="best")  # fmt: skip
        bx.grid(True, which="major", alpha=0.3)
    scheme_legend(fig, [g for g, _ in groups])
    if title:  # wrapped to the figure's width (about 11 characters an inch)
        fig.suptitle(textwrap.fill(title, int(fig.get_figwidth() * 11)), fontsize=10)
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
        "slope: least squares of v_2L on L over every (L, seed) ± s.e. over seeds; theory: the slope of "
        "the scheme's own closed form over the same depths (s² measured); z = (slope − theory) / s.e.; "
        "err: largest |v_2L / closed form − 1| over the depths (closed forms: depth_sweep_fit.csv). "
        f"grad: |∇W_down| first / last layer at L={hi}.",
    )
    for col in ("config", "ratio", "transfers", "slope", "theory", "z", "err", "grad"):
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
            f"{100 * r.theory_rel_err_max:.1f}%" if math.isfinite(r.theory_rel_err_max) else "-",
            fmt(float(grad.iloc[0]), 3) if len(grad) else "-",
        )
    return t
