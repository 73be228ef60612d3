"""Figure of ``tinit norms``: LayerNorm/RMSNorm time ratio, absolute times, saved bytes."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from .palette import IMPL_COLORS
from .style import new_figure, styled, suptitle, wants_log

#: RMSNorm vs LayerNorm: solid vs dotted (dashed means forward + backward, in every panel)
NORM_STYLES = {"rmsnorm": "-", "layernorm": ":"}
PASS_STYLES = {"forward": "-", "forward_backward": "--"}
PASS_LABELS = {"forward": "forward", "forward_backward": "forward + backward"}


def size_order(frame: pd.DataFrame) -> list[tuple[int, int]]:
    """The (rows, d_model) sizes, by number of elements then d_model."""
    sizes = frame[["rows", "d_model"]].drop_duplicates().itertuples(index=False, name=None)
    return sorted(sizes, key=lambda s: (s[0] * s[1], s[1]))


def _size_axis(ax, sizes: list[tuple[int, int]]) -> None:
    ax.set_xticks(range(len(sizes)), [f"{r}x{d}" for r, d in sizes], rotation=35, ha="right", fontsize=8)
    ax.set_xlabel("rows x d_model")
    ax.set_xlim(-0.5, len(sizes) - 0.5)
    ax.grid(True, which="major", alpha=0.3)


@styled
def plot_norms(timing: pd.DataFrame, ratio: pd.DataFrame, title: str = "") -> Figure:
    """Top left: LayerNorm / RMSNorm time per size, implementation (colour) and pass
    (forward solid, forward+backward dashed), with equal cost (grey dashed). Top right
    and bottom left: absolute median times, RMSNorm solid and LayerNorm dashed. Bottom
    right: bytes saved for backward beyond the input and parameters, per input byte,
    at the largest size."""
    fig, axes = new_figure(ncols=2, nrows=2, row_height=3.3)
    ax, tx, bx, sx = axes
    sizes = size_order(timing)
    pos = {s: i for i, s in enumerate(sizes)}
    ok = timing[timing["available"].astype(bool)]
    impls = [i for i in IMPL_COLORS if i in set(ok["impl"])]

    for (impl, pass_), df in ratio.groupby(["impl", "pass"], sort=False):
        x = [pos[(r, d)] for r, d in zip(df["rows"], df["d_model"], strict=True)]
        order = np.argsort(x)
        ax.plot(np.array(x)[order], df["time_ratio"].to_numpy()[order], color=IMPL_COLORS.get(impl, "0.3"),
                ls=PASS_STYLES[pass_], marker="o", ms=4, lw=1.5)  # fmt: skip
    ax.axhline(1.0, color="0.5", ls="-.", lw=1.1)
    # ratios are multiplicative: log scale, labelled in plain numbers (0.2, 0.5, 1, 2)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel("time ratio  LayerNorm / RMSNorm")
    ax.set_title("LayerNorm / RMSNorm time (median)")
    # one legend under the panels for all four (in a panel, legends covered lines and bar labels)
    handles = [Line2D([], [], color=IMPL_COLORS[i], lw=1.5, label=i) for i in impls]
    handles += [Line2D([], [], color="0.3", ls=PASS_STYLES[p], lw=1.5, label=f"ratio: {PASS_LABELS[p]}")
                for p in PASS_STYLES]  # fmt: skip
    handles.append(Line2D([], [], color="0.5", ls="-.", lw=1.1, label="equal cost"))
    _size_axis(ax, sizes)

    for a, pass_ in ((tx, "forward"), (bx, "forward_backward")):
        d = ok[ok["pass"] == pass_]
        for (norm, impl), df in d.groupby(["norm", "impl"], sort=False):
            x = np.array([pos[(r, m)] for r, m in zip(df["rows"], df["d_model"], strict=True)])
            order = np.argsort(x)
            a.plot(x[order], df["time_ms"].to_numpy()[order], color=IMPL_COLORS.get(impl, "0.3"),
                   ls=NORM_STYLES[norm], marker="o" if norm == "rmsnorm" else "^", ms=4, lw=1.5)  # fmt: skip
        a.set_yscale("log")
        a.set_ylabel("median time per call (ms)")
        a.set_title(f"Absolute time, {PASS_LABELS[pass_]}")
        _size_axis(a, sizes)
    handles += [Line2D([], [], color="0.3", ls="-", marker="o", ms=4, label="time: RMSNorm"),
                Line2D([], [], color="0.3", ls=":", marker="^", ms=4, label="time: LayerNorm")]  # fmt: skip

    fb = ok[ok["pass"] == "forward_backward"]
    if len(fb):
        big = max(sizes, key=lambda s: s[0] * s[1])
        d = fb[(fb["rows"] == big[0]) & (fb["d_model"] == big[1])]
        width = 0.38
        for j, norm in enumerate(("rmsnorm", "layernorm")):
            n = d[d["norm"] == norm].set_index("impl")
            vals = [float(n.loc[i, "saved_bytes_extra"] / n.loc[i, "input_bytes"]) if i in n.index else np.nan
                    for i in impls]  # fmt: skip
            bars = sx.bar(np.arange(len(impls)) + (j - 0.5) * width, vals, width,
                          color=[IMPL_COLORS[i] for i in impls], alpha=1.0 if j == 0 else 0.55,
                          hatch=None if j == 0 else "//", edgecolor="0.2",
                          label="RMSNorm" if j == 0 else "LayerNorm")  # fmt: skip
            sx.bar_label(bars, fmt="%.3g", fontsize=8, padding=2)
        sx.set_xticks(range(len(impls)), impls)
        sx.set_xlabel("implementation")
        sx.set_ylabel("saved for backward / input size")
        sx.set_title(f"Extra bytes saved for backward ({big[0]}x{big[1]})")
        allv = [v for v in d["saved_bytes_extra"] / d["input_bytes"] if v == v]
        if wants_log([v for v in allv if v > 0], ratio=30) and min(allv) > 0:
            sx.set_yscale("log")  # small bars (compiled) stay visible beside large ones
            sx.set_ylim(min(allv) / 3, max(allv) * 4)
        else:
            sx.margins(y=0.15)
        handles += [Patch(fc="0.55", ec="0.2", label="bytes: RMSNorm"),
                    Patch(fc="0.85", ec="0.2", hatch="//", label="bytes: LayerNorm")]  # fmt: skip
        sx.grid(True, axis="y", alpha=0.3)
    fig.legend(handles=handles, loc="outside lower center", ncols=4, frameon=False)
    suptitle(fig, title)
    return fig
