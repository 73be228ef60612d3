"""Figures over the tidy frames: matplotlib's object-oriented API, Agg backend,
no global style changes. Each function returns the figure; :func:`save_figure`
writes it in every requested format."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..model.schemes import CATALOGUE, get_scheme

FORMATS = ("png", "pdf", "svg")

# One colour per scheme, by its place in the catalogue (naive red, gpt2 blue, ...), so
# every plot of every run agrees; placements other than pre-norm get a darker shade.
PALETTE = (
    "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
    "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354",
)  # fmt: skip
_SHADE = {"pre": 1.0, "post": 0.55, "sandwich": 0.75, "reordered": 0.85, "none": 0.7}


def scheme_color(init: str, i: int = 0) -> str:
    """The scheme's colour (an alias shares its scheme's; a user's scheme a tab10 one)."""
    try:
        name = get_scheme(init).name
    except KeyError:
        return f"C{i % 10}"
    order = list(CATALOGUE)
    return PALETTE[order.index(name) % len(PALETTE)] if name in order else f"C{i % 10}"


def config_color(init: str, norm_position: str, i: int = 0) -> tuple[float, float, float]:
    r, g, b = to_rgb(scheme_color(init, i))
    k = _SHADE.get(norm_position, 1.0)
    return (r * k, g * k, b * k)


def config_label(init: str, norm_position: str) -> str:
    return f"{init} init, {norm_position}-norm"


def wants_log(values: Iterable[float], ratio: float = 30.0) -> bool:
    """Log scale when the positive values span more than ``ratio``."""
    v = np.asarray([x for x in values if np.isfinite(x) and x > 0])
    return v.size > 0 and v.max() / v.min() > ratio


def save_figure(fig: Figure, run_dir: Path, stem: str, formats: Iterable[str] = ("png",)) -> list[Path]:
    paths = []
    for fmt in formats:
        path = Path(run_dir) / f"{stem}.{fmt}"
        fig.savefig(path, dpi=150 if fmt == "png" else None, bbox_inches="tight")
        paths.append(path)
    return paths


def new_figure(
    ncols: int = 1, nrows: int = 1, width: float = 6.0, height: float = 4.5
) -> tuple[Figure, np.ndarray]:
    """A figure with an Agg canvas (no pyplot state), and its axes as an array."""
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes.ravel()


def _facets(n: int, ncols_max: int = 3, width: float = 5.2, height: float = 4.2):
    """A figure of ``n`` panels in rows of at most ``ncols_max``; unused axes hidden."""
    ncols = min(n, ncols_max)
    nrows = -(-n // ncols)
    fig, axes = new_figure(ncols=ncols, nrows=nrows, width=width, height=height)
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def scheme_legend(fig: Figure, groups, ncol_max: int = 5, suffix: dict | None = None) -> None:
    """One legend for the whole figure, below it: a colour per configuration
    (``suffix``: extra words for some configurations, e.g. that they are off scale)."""
    suffix = suffix or {}
    handles = [Line2D([], [], color=config_color(init, pos, i), lw=2.2,
                      label=f"{init} ({pos})" + suffix.get((init, pos), ""))
               for i, (init, pos) in enumerate(groups)]  # fmt: skip
    ncol = min(ncol_max, max(1, len(handles)))
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol, fontsize=8, frameon=False)


#: A configuration whose stream grows past this many times v0 (or overflows) is drawn
#: but left out of its panel's y range, and marked in the legend.
OFF_SCALE = 1e8


def plot_variance(variance: pd.DataFrame, title: str = "") -> Figure:
    """One panel per norm placement: stream variance against k for each scheme, over
    its own v0 (post-norm: the sum itself, which the norm resets), measured (solid),
    with its cumulative law from the measured branches (dashed) and its closed form
    (dotted). Last panel: branch variance per layer, attention (solid) and FFN
    (dash-dot), every configuration. Colours: one per scheme, in a legend below; a
    configuration that overflows or grows past 1e8 v0 is marked there and does not set
    its panel's scale."""
    groups = list(variance.groupby(["init", "norm_position"], sort=False))
    positions = list(dict.fromkeys(pos for (_, pos), _ in groups))
    many = len(groups) > 6
    rank = "cos_sim" in variance and bool(variance["cos_sim"].notna().any())
    n_panels = len(positions) + 1 + rank
    fig, axes = _facets(n_panels, ncols_max=3 if n_panels > 2 else 2, width=4.6, height=3.8)
    bx = axes[len(positions)]
    cx = axes[-1] if rank else None
    panel = {pos: axes[i] for i, pos in enumerate(positions)}
    in_range: dict[str, list] = {pos: [] for pos in positions}
    off: dict = {}
    for i, ((init, pos), df) in enumerate(groups):
        c = config_color(init, pos, i)
        ax = panel[pos]
        scale = 1.0 if pos == "post" else float(df["stream_var"].iloc[0])
        y = [df[col] / scale for col in ("stream_var", "pred_cumulative", "pred_closed")]
        if not np.isfinite(y[0]).all() or float(np.nanmax(y[0])) > OFF_SCALE:
            off[(init, pos)] = " — off scale (overflow)" if not np.isfinite(y[0]).all() else " — off scale"
        else:
            in_range[pos] += [v for series in y for v in series if np.isfinite(v) and v > 0]
        lw = 1.6 if many else 2.6 - 0.4 * i  # later lines thinner, so coinciding ones stay visible
        ax.plot(df["k"], y[0], color=c, lw=max(lw, 1.0), label=config_label(init, pos))
        ax.plot(df["k"], y[1], color=c, lw=1.1, ls="--", alpha=0.9)
        ax.plot(df["k"], y[2], color=c, lw=1.0, ls=":", alpha=0.9)
        if cx is not None:
            cx.plot(df["k"], df["cos_sim"], color=c, lw=1.3)
            cx.plot(df["k"], df["res_ratio"], color=c, lw=1.0, ls="--")
        for sub, ls in (("attn", "-"), ("ffn", "-.")):
            d = df[df["sublayer"] == sub]
            bx.plot(d["layer"], d["branch_var"], color=c, ls=ls, lw=1.1, marker="o" if sub == "attn" else "^",
                    ms=2.0)  # fmt: skip
    for pos, ax in panel.items():
        vals = np.asarray(in_range[pos])
        if vals.size and wants_log(vals):
            ax.set_yscale("log")
        if vals.size:
            lo, hi = vals.min(), vals.max()
            pad = 0.05 * (hi - lo) + 1e-12 * hi
            ax.set_ylim(*((lo / 1.5, hi * 1.5) if ax.get_yscale() == "log" else (lo - pad, hi + pad)))
        ax.set_xlabel("residual addition k (0 = embedding)")
        ax.set_ylabel("$v_k$ (the sum, before the norm)" if pos == "post" else "stream variance $v_k / v_0$")
        ax.set_title(f"{pos}-norm: residual-stream variance", fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
    style = [
        Line2D([], [], color="0.3", lw=1.8, label="measured"),
        Line2D([], [], color="0.3", lw=1.1, ls="--",
               label=r"law: $a^2 v_{k-1} + g^2 s_k^2$ (measured $s_k^2$)"),  # fmt: skip
        Line2D([], [], color="0.3", lw=1.0, ls=":", label="the scheme's closed form"),
    ]
    axes[0].legend(handles=style, fontsize=7, loc="best")
    if wants_log(variance["branch_var"].dropna(), ratio=10):
        bx.set_yscale("log")
    bx.set_xlabel("layer")
    bx.set_ylabel("branch variance $s_k^2$ (before g)")
    bx.set_title("Branch variance per addition", fontsize=10)
    bx.legend(
        handles=[
            Line2D([], [], color="0.3", ls="-", marker="o", ms=3, label="attention branch"),
            Line2D([], [], color="0.3", ls="-.", marker="^", ms=3, label="FFN branch"),
        ],
        fontsize=7,
        loc="best",
    )
    bx.grid(True, which="major", alpha=0.3)
    if cx is not None:
        cx.set_xlabel("residual addition k (0 = embedding)")
        cx.set_ylabel("token similarity")
        cx.set_title("Rank collapse: tokens of a sequence", fontsize=10)
        cx.set_ylim(-0.05, 1.05)
        cx.legend(handles=[
            Line2D([], [], color="0.3", lw=1.3, label="mean pairwise cosine (1: collapsed)"),
            Line2D([], [], color="0.3", lw=1.0, ls="--", label="Dong et al. residual ratio (0: collapsed)"),
        ], fontsize=7, loc="best")  # fmt: skip
        cx.grid(True, which="major", alpha=0.3)
    scheme_legend(fig, [g for g, _ in groups], suffix=off)
    if title:
        fig.suptitle(textwrap.fill(title, int(fig.get_figwidth() * 11)), fontsize=10)
    return fig
