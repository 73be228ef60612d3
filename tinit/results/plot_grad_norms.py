"""Figures and the terminal table of ``tinit grad-norms``: per-layer gradient norms
of the stream-writing matrices, and the stream gradient against the identity-path
prediction."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from rich.table import Table

from .plots import config_color, config_label, new_figure, wants_log
from .tables import error_style, summary_table

#: --tensor choice -> the tensors drawn, with their panel titles
TENSORS = {"down": ("down",), "o": ("o",), "both": ("down", "o")}
_MARKERS = ("o", "s", "^", "v")
TENSOR_TITLES = {"down": r"$W_{down}$ (FFN output)", "o": r"$W_O$ (attention output)"}


def _width(i: int) -> float:
    """Later configurations drawn thinner, so ones that coincide stay visible."""
    return max(3.2 - 0.7 * i, 1.0)


def plot_grad_norms(grad_norms: pd.DataFrame, tensor: str = "both", title: str = "") -> Figure:
    """Gradient Frobenius norm per layer (log scale), one line per configuration; a
    panel per tensor (W_down and W_O with ``tensor="both"``)."""
    names = TENSORS[tensor]
    fig, axes = new_figure(ncols=len(names))
    groups = list(grad_norms.groupby(["init", "norm_position"], sort=False))
    for ax, name in zip(axes, names, strict=True):
        for i, ((init, pos), df) in enumerate(groups):
            d = df[df["tensor"] == name].sort_values("layer")
            ax.plot(d["layer"], d["grad_norm"], color=config_color(init, pos, i), lw=_width(i),
                    marker=_MARKERS[i % 4], ms=7 - i, mfc="none", label=config_label(init, pos))  # fmt: skip
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_ylabel(r"$\|\nabla_W\, \mathrm{loss}\|_F$")
        ax.set_title(f"Gradient norm of {TENSOR_TITLES[name]}")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    if title:
        fig.suptitle(title)
    return fig


def plot_stream_grads(stream_grads: pd.DataFrame, title: str = "") -> Figure:
    """RMS of d loss / d stream against addition k, per configuration (solid), with
    the identity-path prediction (dashed): the last addition's RMS times the
    predicted gain (1 for pre-norm, the product of the norm Jacobian gains for post-norm)."""
    fig, (ax,) = new_figure(width=7.0)
    groups = list(stream_grads.groupby(["init", "norm_position"], sort=False))
    for i, ((init, pos), df) in enumerate(groups):
        c = config_color(init, pos, i)
        ax.plot(df["k"], df["stream_grad_rms"], color=c, lw=_width(i), marker=_MARKERS[i % 4], ms=7 - i,
                mfc="none", markevery=max(1, len(df) // 12), label=config_label(init, pos))  # fmt: skip
        ax.plot(df["k"], df["pred_stream_grad_rms"], color=c, lw=1.2, ls="--", alpha=0.9)
        if "pred_full_stream_grad_rms" in df:
            ax.plot(df["k"], df["pred_full_stream_grad_rms"], color=c, lw=1.2, ls=":", alpha=0.9)
    wanted = ("stream_grad_rms", "pred_stream_grad_rms", "pred_full_stream_grad_rms")
    cols = [c for c in wanted if c in stream_grads]
    values = pd.concat([stream_grads[c] for c in cols])
    if wants_log(values, ratio=5):
        ax.set_yscale("log")
    ax.set_xlabel("residual addition k (0 = embedding output)")
    ax.set_ylabel(r"RMS of $\partial\,\mathrm{loss} / \partial\,\mathrm{stream}_k$")
    ax.set_title("Stream gradient (post-norm: at the normalised stream)")
    handles, _ = ax.get_legend_handles_labels()
    style = [
        Line2D([], [], color="0.3", lw=2.0, label="measured"),
        Line2D([], [], color="0.3", lw=1.2, ls="--", label="identity-path prediction"),
        Line2D([], [], color="0.3", lw=1.2, ls=":", label="full-path prediction (measured branch gains)"),
    ]
    ax.legend(handles=handles + style, fontsize=8, loc="best")
    ax.grid(True, which="major", alpha=0.3)
    if title:
        fig.suptitle(title)
    return fig


def _num(x: float) -> str:
    """Three significant digits, exponents short (2.3e4, 1.9e-11): ratios here span 20 decades."""
    if x != x:
        return "-"
    if 100 <= abs(x) < 1e4:
        return f"{x:.0f}"
    if x == 0 or 1e-2 <= abs(x) < 100:
        return f"{x:.3g}"
    mantissa, exp = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exp)}"


def grad_norms_table(summary: pd.DataFrame, title: str = "") -> Table:
    """One row per configuration: first/last-layer and max/min ratios of the
    W_down and W_O gradient norms, and the embedding/last-addition stream-gradient
    ratio measured vs the identity-path prediction."""
    t = summary_table(
        title,
        "f/l: gradient norm of W_down, W_O at layer 0 / layer L-1; stream: RMS of "
        "d loss/d stream at k=0 / k=2L; pred: its identity-path prediction; full: the full-path "
        "prediction (identity and branch, measured branch backward gains)",
    )
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
    for r in summary.itertuples(index=False):
        ratio = r.stream_grad_ratio / r.pred_stream_grad_ratio
        t.add_row(
            f"{r.init}/{r.norm_position}",
            *(_num(x) for x in (r.down_ratio_first_last, r.down_max_min, r.o_ratio_first_last, r.o_max_min)),
            _num(r.stream_grad_ratio),
            _num(r.pred_stream_grad_ratio),
            f"[{error_style(ratio - 1)}]{_num(ratio)}[/]",
            _num(r.pred_full_stream_grad_ratio),
            f"[{error_style(r.full_stream_grad_ratio_err)}]{_num(r.full_stream_grad_ratio_err + 1)}[/]",
        )
    return t
