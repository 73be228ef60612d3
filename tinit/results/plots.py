"""Figures over the tidy frames: matplotlib's object-oriented API, Agg backend,
no global style changes. Each function returns the figure; :func:`save_figure`
writes it in every requested format."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .formats import FORMATS  # noqa: F401  (re-exported)

# One colour per configuration, fixed so every plot of a run agrees.
CONFIG_COLORS = {
    ("naive", "pre"): "#d62728",
    ("scaled", "pre"): "#1f77b4",
    ("naive", "post"): "#ff7f0e",
    ("scaled", "post"): "#2ca02c",
}


def config_color(init: str, norm_position: str, i: int = 0) -> str:
    return CONFIG_COLORS.get((init, norm_position), f"C{i % 10}")


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


def plot_variance(variance: pd.DataFrame, title: str = "") -> Figure:
    """Left: stream variance v_k against k per configuration, with the cumulative law
    (dashed) and the seed's closed form (dotted) beside each. Right: branch variance
    per layer, attention (solid) and FFN (dash-dot)."""
    fig, (ax, bx) = new_figure(ncols=2)
    groups = list(variance.groupby(["init", "norm_position"], sort=False))
    for i, ((init, pos), df) in enumerate(groups):
        c = config_color(init, pos, i)
        # later lines drawn thinner, so configurations that coincide stay visible
        ax.plot(df["k"], df["stream_var"], color=c, lw=2.6 - 0.4 * i, label=config_label(init, pos))
        ax.plot(df["k"], df["pred_cumulative"], color=c, lw=1.2, ls="--", alpha=0.9)
        ax.plot(df["k"], df["pred_closed"], color=c, lw=1.0, ls=":", alpha=0.9)
        for sub, ls in (("attn", "-"), ("ffn", "-.")):
            d = df[df["sublayer"] == sub]
            bx.plot(d["layer"], d["branch_var"], color=c, ls=ls, lw=1.3, marker="o" if sub == "attn" else "^",
                    ms=2.5)  # fmt: skip
    if wants_log(variance["stream_var"]):
        ax.set_yscale("log")
    if wants_log(variance["branch_var"].dropna(), ratio=10):
        bx.set_yscale("log")
    ax.set_xlabel("residual addition k (0 = embedding)")
    ax.set_ylabel("stream variance $v_k$ (post-norm: before the norm)")
    ax.set_title("Residual-stream variance")
    style = [
        Line2D([], [], color="0.3", lw=1.8, label="measured"),
        Line2D([], [], color="0.3", lw=1.2, ls="--", label=r"law: $v_0 + \sum_{j\leq k} s_j^2$"),
        Line2D([], [], color="0.3", lw=1.0, ls=":", label=r"closed form: $v_0 + k\,\overline{s^2}$"),
    ]
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles=handles + style, fontsize=8, loc="best")
    bx.set_xlabel("layer")
    bx.set_ylabel("branch variance $s_k^2$")
    bx.set_title("Branch variance per addition")
    bx.legend(
        handles=[
            Line2D([], [], color="0.3", ls="-", marker="o", ms=3, label="attention branch"),
            Line2D([], [], color="0.3", ls="-.", marker="^", ms=3, label="FFN branch"),
        ],
        fontsize=8,
        loc="best",
    )
    for a in (ax, bx):
        a.grid(True, which="major", alpha=0.3)
    if title:
        fig.suptitle(title)
    return fig
