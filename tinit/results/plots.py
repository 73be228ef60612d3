"""Figures over the tidy frames: matplotlib's object-oriented API, Agg backend,
no global style changes (the look is :mod:`tinit.results.style`'s, scoped to each
plot function). Each function returns the figure; :func:`save_figure` writes it in
every requested format."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .rundir import atomic_write
from .style import (
    CONFIG_COLORS,
    MEASURED_UNDER,
    NEUTRAL,
    THEORY,
    THEORY_ALT,
    coincidence_note,
    coincidences,
    config_color,
    config_label,
    config_style,
    footnote,
    integer_axis,
    mark_clipped,
    markevery,
    near,
    nested_marker_size,
    new_figure,
    styled,
    suptitle,
    value_axis,
    wants_log,
)

__all__ = [
    "CONFIG_COLORS", "FORMATS", "config_color", "config_label", "new_figure", "plot_variance", "save_figure",
    "wants_log",
]  # fmt: skip


from .formats import FORMATS  # noqa: F401  (re-exported)


def save_figure(fig: Figure, run_dir: Path, stem: str, formats: Iterable[str] = ("png",)) -> list[Path]:
    paths = []
    for fmt in formats:
        path = Path(run_dir) / f"{stem}.{fmt}"
        dpi = 200 if fmt == "png" else None

        def write(tmp: Path, fmt: str = fmt, dpi: int | None = dpi) -> None:
            fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches="tight")

        paths.append(atomic_write(path, write))
    return paths


def _short(init: str, pos: str) -> str:
    return f"{init}/{pos}"


def _law_panel(ax, groups, pos: str) -> tuple[list[str], list[str]]:
    """Stream variance v_k of the configurations at one norm position: measured
    (thick, translucent), the cumulative law (dashed) and the closed form (dotted) on
    top. Returns (labels, notes)."""
    rows = [(init, p, df) for (init, p), df in groups if p == pos]
    # post-norm: k = 0, 1 precede the first norm (v ~ v0, a different scale)
    kmin = 2 if pos == "post" else 0
    measured, notes, errs = {}, [], []
    for i, (init, p, df) in enumerate(rows):
        d = df[df["k"] >= kmin]
        st = config_style(init, p)
        n = len(d)
        ax.plot(d["k"], d["stream_var"], color=st["color"], marker=st["marker"], mfc="none",
                ms=nested_marker_size(i), markevery=markevery(n, i, len(rows)), label=config_label(init, p),
                gid=f"measured:{init}/{p}",
                **MEASURED_UNDER)  # fmt: skip
        ax.plot(d["k"], d["pred_cumulative"], color=st["color"], gid=f"theory:{init}/{p}", **THEORY)
        if pos == "pre":
            ax.plot(d["k"], d["pred_closed"], color=st["color"], gid=f"closed:{init}/{p}", **THEORY_ALT)
        measured[_short(init, p)] = d["stream_var"].to_numpy()
        err = (d["stream_var"] / d["pred_cumulative"] - 1).abs().max()
        errs.append(f"{_short(init, p)} {100 * err:.2g}%")
    values = np.concatenate(list(measured.values())) if measured else np.array([])
    preds = [df[df["k"] >= kmin][c] for _, _, df in rows for c in ("pred_cumulative", "pred_closed")]
    lim = value_axis(ax, values, log_ratio=30, include=near(values, np.concatenate(preds) if preds else []))
    for init, p, df in rows:  # predictions leaving the measured range: clipped, marked
        d = df[df["k"] >= kmin]
        for col in ("pred_cumulative",) + (("pred_closed",) if pos == "pre" else ()):
            if mark_clipped(ax, d["k"], d[col], lim, config_color(init, p)):
                notes.append(f"{pos}-norm: {col} of {_short(init, p)} leaves the measured range (triangles)")
    if errs:
        notes.insert(0, f"{pos}-norm, largest |measured/law - 1| over k: " + ", ".join(errs))
    notes.append(coincidence_note(coincidences(measured, ax), f"{pos}-norm v_k"))
    after = " (0 = embedding)" if kmin == 0 else f" (k >= {kmin}: after a norm)"
    ax.set_xlabel("residual addition k" + after)
    if pos == "pre":
        ax.set_ylabel("stream variance $v_k$")
        ax.set_title("Pre-norm: residual-stream variance")
    else:
        ax.set_ylabel("$v_k$ (the sum before the norm)")
        ax.set_title("Post-norm: variance of each sum")
    return [config_label(i, p) for i, p, _ in rows], notes


def _branch_panel(ax, groups, sub: str) -> list[str]:
    """Branch variance s^2 per layer of one sublayer, every configuration; layer-0
    points far outside the others (their input is the unnormalised embedding) are
    clipped and marked. Returns notes."""
    series, notes = {}, []
    n_all = len(groups)
    for i, ((init, pos), df) in enumerate(groups):
        d = df[df["sublayer"] == sub].sort_values("layer")
        st = config_style(init, pos)
        ax.plot(d["layer"], d["branch_var"], color=st["color"], marker=st["marker"], mfc="none",
                ms=nested_marker_size(i), markevery=markevery(len(d), i, n_all), lw=1.4,
                label=config_label(init, pos), gid=f"measured:{init}/{pos}")  # fmt: skip
        series[_short(init, pos)] = d["branch_var"].to_numpy()
    rest = np.concatenate([v[1:] for v in series.values()]) if series else np.array([])
    first = np.array([v[0] for v in series.values() if len(v)])
    fin = rest[np.isfinite(rest) & (rest > 0)]
    if fin.size:
        lo, hi = fin.min(), fin.max()
        keep = first[(first >= lo / 10) & (first <= hi * 10)]
        lim = value_axis(ax, np.concatenate([rest, keep]), log_ratio=30, min_rel_span=0.2)
    else:
        lim = value_axis(ax, first)
    for (init, pos), df in groups:
        d = df[df["sublayer"] == sub]
        n = mark_clipped(ax, d["layer"], d["branch_var"], lim, config_color(init, pos))
        if n:
            v = float(d.sort_values("layer")["branch_var"].iloc[0])
            notes.append(f"{sub}: layer 0 of {_short(init, pos)} (s^2 = {v:.2g}; its input is the embedding) "
                         "is off the axis (triangle)")  # fmt: skip
    notes.append(coincidence_note(coincidences(series, ax), f"{'attention' if sub == 'attn' else 'FFN'} s^2"))
    ax.set_xlabel("layer")
    ax.set_ylabel(f"{'attention' if sub == 'attn' else 'FFN'} branch variance $s^2$")
    ax.set_title(f"{'Attention' if sub == 'attn' else 'FFN'} branch variance per layer")
    layers = sorted(variance_layers(series))
    integer_axis(ax, layers, "x")
    return notes


def variance_layers(series: dict) -> list[int]:
    n = max((len(v) for v in series.values()), default=0)
    return list(range(n))


@styled
def plot_variance(variance: pd.DataFrame, title: str = "") -> Figure:
    """Top: stream variance v_k against addition k, one panel per norm position;
    measured (thick, translucent) with the cumulative law v0 + sum s_j^2 (dashed) and,
    pre-norm, the closed form v0 + k mean(s^2) (dotted) on top. Bottom: branch variance
    s^2 per layer, attention and FFN in separate panels. Coinciding curves, clipped
    points and the law's largest error are named in the notes under the figure."""
    groups = list(variance.groupby(["init", "norm_position"], sort=False))
    positions = [p for p in ("pre", "post") if (variance["norm_position"] == p).any()]
    fig = Figure(figsize=(7.0, 6.4), layout="constrained")
    gs = fig.add_gridspec(3, 2, height_ratios=[1, 1, 0.1])
    tops = [fig.add_subplot(gs[0, j]) for j in range(len(positions))] if len(positions) == 2 else [
        fig.add_subplot(gs[0, :])]  # fmt: skip
    bots = [fig.add_subplot(gs[1, 0]), fig.add_subplot(gs[1, 1])]
    for a in tops + bots:
        a.tick_params(labelsize=8)
        a.grid(True, which="major", alpha=0.3)
    notes: list[str] = []
    for ax, pos in zip(tops, positions, strict=True):
        _, n = _law_panel(ax, groups, pos)
        notes += n
        style = [
            Line2D([], [], color=NEUTRAL, **{**MEASURED_UNDER, "zorder": None}, label="measured"),
            Line2D([], [], color=NEUTRAL, **{**THEORY, "zorder": None}, label=r"law $v_{k-1} + s_k^2$"
                   if pos == "post" else r"law $v_0 + \sum_{j\leq k} s_j^2$"),  # fmt: skip
        ]
        if pos == "pre":
            style.append(Line2D([], [], color=NEUTRAL, **{**THEORY_ALT, "zorder": None},
                                label=r"closed form $v_0 + k\,\overline{s^2}$"))  # fmt: skip
        ax.legend(handles=style, loc="best")  # the configurations: one legend under the figure
    for ax, sub in zip(bots, ("attn", "ffn"), strict=True):
        notes += _branch_panel(ax, groups, sub)
    handles, _ = bots[0].get_legend_handles_labels()
    key = fig.add_subplot(gs[2, :])  # a row of its own for the configurations' legend
    key.axis("off")
    key.legend(handles=handles, loc="center", ncol=min(len(handles), 4), handlelength=2.2, columnspacing=1.2,
               frameon=False)
    suptitle(fig, title)
    footnote(fig, notes)
    return fig
