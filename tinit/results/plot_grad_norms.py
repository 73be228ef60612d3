"""Figures and the terminal table of ``tinit grad-norms``: per-layer gradient norms
of the stream-writing matrices, and the stream gradient against the identity-path
prediction."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from rich.table import Table

from ..model.placements import PLACEMENTS, normed_stream_names
from . import style
from .palette import config_label, config_style
from .tables import error_style, summary_table

#: --tensor choice -> the tensors drawn, with their panel titles
TENSORS = {"down": ("down",), "o": ("o",), "both": ("down", "o")}
TENSOR_TITLES = {"down": r"$W_{down}$ (FFN output)", "o": r"$W_O$ (attention output)"}
#: The stream-gradient predictions drawn (column, name): each is clipped and marked alike.
PREDICTIONS = (("pred_stream_grad_rms", "identity-path"), ("pred_full_stream_grad_rms", "full-path"))


def _label(init: str, pos: str, n: int) -> str:
    """The configuration's name in a legend: in full for a few, init/pos for many (a legend that fits)."""
    return config_label(init, pos) if n <= 6 else f"{init}/{pos}"


@style.styled
def plot_grad_norms(grad_norms: pd.DataFrame, tensor: str = "both", title: str = "") -> Figure:
    """Gradient Frobenius norm per layer, one line per configuration (its colour and
    marker), a panel per tensor (W_down and W_O with ``tensor="both"``); log or linear
    by the span of the data. Lines on top of each other are named under the figure."""
    names = TENSORS[tensor]
    groups = list(grad_norms.groupby(["init", "norm_position"], sort=False))
    key_h = max(0.35, style.key_rows_height(len(groups), 4))
    fig, axes, key = style.new_figure_with_key(ncols=len(names), key_height=key_h)
    notes = []
    for ax, name in zip(axes, names, strict=True):
        series = {}
        for i, ((init, pos), df) in enumerate(groups):
            d = df[df["tensor"] == name].sort_values("layer")
            st = config_style(init, pos)
            ax.plot(d["layer"], d["grad_norm"], color=st["color"], marker=st["marker"], mfc="none",
                    ms=style.nested_marker_size(i % 4), markevery=style.markevery(len(d), i, len(groups)),
                    label=_label(init, pos, len(groups)), gid=f"measured:{init}/{pos}",
                    **style.MEASURED)  # fmt: skip
            series[f"{init}/{pos}"] = d["grad_norm"].to_numpy()
        vals = grad_norms[grad_norms["tensor"] == name]["grad_norm"].to_numpy(dtype=np.float64)
        pos_vals = vals[np.isfinite(vals) & (vals > 0)]
        zeros = [k for k, v in series.items() if (np.asarray(v) == 0).any()]
        if zeros and style.wants_log(pos_vals, 10):  # a zero gradient (a zero gain) beside decades of others
            lim = style.value_axis(ax, pos_vals, log_ratio=10, min_rel_span=0.2)
            for (init, pos), df in groups:
                d = df[df["tensor"] == name].sort_values("layer")
                style.mark_clipped(ax, d["layer"], d["grad_norm"], lim, config_style(init, pos)["color"])
            notes.append(f"{TENSOR_TITLES[name].split(' (')[0]}: a zero gradient of " + ", ".join(zeros)
                         + ": triangles at the bottom edge")  # fmt: skip
        else:
            style.value_axis(ax, vals, log_ratio=10, min_rel_span=0.2)
        what = TENSOR_TITLES[name].split(" (")[0]
        notes.append(style.coincidence_note(style.coincidences(series, ax), what))
        style.integer_axis(ax, grad_norms["layer"].unique(), "x")
        ax.set_xlabel("layer")
        ax.set_ylabel(r"$\|\nabla_W\, \mathrm{loss}\|_F$")
        ax.set_title(f"Gradient norm of {TENSOR_TITLES[name]}")
    style.key_legend(key, axes[0].get_legend_handles_labels()[0])
    style.suptitle(fig, title)
    style.footnote(fig, [n.replace("$", "").replace("\\", "").replace("_{down}", "_down") for n in notes])
    return fig


@style.styled
def plot_stream_grads(stream_grads: pd.DataFrame, title: str = "") -> Figure:
    """RMS of d loss / d stream against addition k, per configuration: measured (thick,
    translucent) with the identity-path prediction (dashed) on top: the last addition's
    RMS times the predicted gain (1 for pre-norm, the product of the norm Jacobian gains
    for post-norm). The y range is the measurements'; predictions outside it are
    clipped and marked with triangles at the edge, and named under the figure."""
    groups = list(stream_grads.groupby(["init", "norm_position"], sort=False))
    key_h = max(0.55, style.key_rows_height(len(groups) + 3, 3))
    fig, (ax,), key = style.new_figure_with_key(row_height=3.3, key_height=key_h)
    series = {}
    for i, ((init, pos), df) in enumerate(groups):
        st = config_style(init, pos)
        ax.plot(df["k"], df["stream_grad_rms"], color=st["color"], marker=st["marker"], mfc="none",
                ms=style.nested_marker_size(i % 4), markevery=style.markevery(len(df), i, len(groups)),
                label=_label(init, pos, len(groups)), gid=f"measured:{init}/{pos}",
                **style.MEASURED_UNDER)  # fmt: skip
        ax.plot(df["k"], df["pred_stream_grad_rms"], color=st["color"], gid=f"theory:{init}/{pos}",
                **style.THEORY)  # fmt: skip
        if "pred_full_stream_grad_rms" in df and df["pred_full_stream_grad_rms"].notna().any():
            ax.plot(df["k"], df["pred_full_stream_grad_rms"], color=st["color"], gid=f"full:{init}/{pos}",
                    **style.THEORY_ALT)  # fmt: skip
        series[f"{init}/{pos}"] = df["stream_grad_rms"].to_numpy()
    meas = stream_grads["stream_grad_rms"]
    pred_cols = [c for c in ("pred_stream_grad_rms", "pred_full_stream_grad_rms") if c in stream_grads]
    pred = style.near(meas, pd.concat([stream_grads[c] for c in pred_cols]))
    lim = style.value_axis(ax, meas, log_ratio=5, min_rel_span=0.2, include=pred)
    notes = []
    for (init, pos), df in groups:
        for col, what in PREDICTIONS:
            if col not in df:
                continue
            pred = df[col].to_numpy(dtype=np.float64)
            n = style.mark_clipped(ax, df["k"], pred, lim, config_style(init, pos)["color"])
            if n:
                notes.append(
                    f"{init}/{pos}: the {what} prediction leaves the measured range at {n} of {len(df)} "
                    f"additions (its range {_num(np.nanmin(pred))} to {_num(np.nanmax(pred))}); clipped, "
                    "triangles at the edge"
                )
    factors = []
    for (init, pos), df in groups:
        with np.errstate(divide="ignore", invalid="ignore"):
            q = df["stream_grad_rms"].to_numpy() / df["pred_stream_grad_rms"].to_numpy()
            f = np.nanmax(np.maximum(q, 1 / q))
        factors.append(f"{init}/{pos} ×{_num(f)}")
    notes.insert(0, "largest factor between measurement and prediction over k: " + ", ".join(factors)
                 + " (near ×1: the dashed line lies on the solid one; far from it: the branch paths, which "
                 "the identity-path prediction leaves out, carry the gradient)")  # fmt: skip
    notes.append(style.coincidence_note(style.coincidences(series, ax), "measured"))
    style.integer_axis(ax, stream_grads["k"].unique(), "x")
    ax.set_xlabel("residual addition k (0 = embedding output)")
    ax.set_ylabel(r"RMS of $\partial\,\mathrm{loss} / \partial\,\mathrm{stream}_k$")
    present = set(stream_grads["norm_position"])
    normed = [PLACEMENTS[name].label for name in normed_stream_names() if name in present]
    ax.set_title("Stream gradient" + "".join(f" ({label}: at the normalised stream)" for label in normed))
    handles, _ = ax.get_legend_handles_labels()
    kinds = [
        Line2D([], [], color=style.NEUTRAL, **{**style.MEASURED_UNDER, "zorder": None}, label="measured"),
        Line2D(
            [], [], color=style.NEUTRAL, **{**style.THEORY, "zorder": None}, label="identity-path prediction"
        ),
    ]
    full = stream_grads.get("pred_full_stream_grad_rms")
    if full is not None and full.notna().any():
        kinds.append(Line2D([], [], color=style.NEUTRAL, **{**style.THEORY_ALT, "zorder": None},
                            label="full-path prediction (measured branch gains)"))  # fmt: skip
    style.key_legend(key, handles + kinds, ncol=3)
    style.suptitle(fig, title)
    style.footnote(fig, notes)
    return fig


def _num(x: float) -> str:
    """Three significant digits, exponents short (2.3e4, 1.9e-11): ratios here span 20 decades."""
    if x != x:
        return "-"
    if x in (np.inf, -np.inf):
        return "inf" if x > 0 else "-inf"
    if 100 <= abs(x) < 1e4:
        return f"{x:.0f}"
    if x == 0 or 1e-2 <= abs(x) < 100:
        return f"{x:.3g}"
    mantissa, exp = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exp)}"


#: meas/pred outside [1/FAR, FAR] gets a one-line explanation under the table.
FAR = 2.0
#: meas/full beyond this relative error is marked: the full path's own tolerance.
FULL_TOL = 0.2


def grad_norms_table(summary: pd.DataFrame, title: str = "") -> Table:
    """One row per configuration: first/last-layer and max/min ratios of the
    W_down and W_O gradient norms, and the embedding/last-addition stream-gradient
    ratio measured vs the identity-path prediction; a meas/pred far from 1 is marked
    (†) and explained (the path the prediction leaves out)."""
    ratios = summary["stream_grad_ratio"] / summary["pred_stream_grad_ratio"]
    far = [f"{r.init}/{r.norm_position}" for r, q in zip(summary.itertuples(index=False), ratios, strict=True)
           if q == q and not (1 / FAR <= q <= FAR)]  # fmt: skip
    caption = (
        "f/l: gradient norm of W_down, W_O at layer 0 / layer L-1; stream: RMS of "
        "d loss/d stream at k=0 / k=2L; pred: its identity-path prediction; full: the full-path "
        "prediction (identity and branch, measured branch backward gains, post-norm's norm per token)"
    )
    full_far = [f"{r.init}/{r.norm_position}" for r in summary.itertuples(index=False)
                if abs(r.full_stream_grad_ratio_err) > FULL_TOL]  # fmt: skip
    if full_far:
        caption += (
            f". ‡ {', '.join(full_far)}: meas/full beyond {FULL_TOL:.0%}: the full path takes each "
            "addition's identity and branch parts as uncorrelated; grad_cross_corr in stream_grads.csv is "
            "the part it leaves out"
        )
    if far:
        caption += (
            f". † {', '.join(far)}: meas/pred beyond {FAR:g}x either way: the identity-path prediction "
            "leaves out the branch paths (the backward gain through each branch, dF/dx), which carry the "
            "gradient where the norms' product shrinks the identity path (post-norm) or add to it (pre-norm)"
        )
    t = summary_table(title, caption)
    cols = (
        "config",
        "down\nf/l",
        "down\nmax/min",
        "O\nf/l",
        "O\nmax/min",
        "stream\nk0/k2L",
        "pred",
        "meas/\npred",
        "full",
        "meas/\nfull",
    )
    for col in cols:
        t.add_column(col, justify="left" if col == "config" else "right", no_wrap=True)
    for r, ratio in zip(summary.itertuples(index=False), ratios, strict=True):
        mark = "†" if f"{r.init}/{r.norm_position}" in far else ""
        t.add_row(
            f"{r.init}/{r.norm_position}",
            *(_num(x) for x in (r.down_ratio_first_last, r.down_max_min, r.o_ratio_first_last, r.o_max_min)),
            _num(r.stream_grad_ratio),
            _num(r.pred_stream_grad_ratio),
            f"[{error_style(ratio - 1)}]{_num(ratio)}{mark}[/]",
            _num(r.pred_full_stream_grad_ratio),
            f"[{error_style(r.full_stream_grad_ratio_err)}]{_num(r.full_stream_grad_ratio_err + 1)}"
            f"{'‡' if f'{r.init}/{r.norm_position}' in full_far else ''}[/]",
        )
    return t
