"""Figure of ``tinit attention-scale``: logit variance and softmax sharpness against d_h."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .palette import ATTENTION_COLORS
from .style import new_figure, styled, suptitle

#: One colour per (input, scaled), fixed so both panels agree (from the common style).
SERIES_COLORS = ATTENTION_COLORS
THEORY_LABELS = {
    ("unit", False): r"theory $d_h$",
    ("unit", True): "theory 1",
    ("model", False): r"theory $d_h (d\sigma^2)^2$",
    ("model", True): r"theory $(d\sigma^2)^2$",
}


def series_label(name: str, scaled: bool) -> str:
    what = "unit q, k" if name == "unit" else "model at init"
    return f"{what}, {'scaled' if scaled else 'unscaled'}"


@styled
def plot_attention_scale(frame: pd.DataFrame, title: str = "") -> Figure:
    """Left: logit variance against d_h (log-log), measured (markers, +-2 SE bars) and
    theory (dashed): d_h and 1 for unit q, k; d_h (d sigma^2)^2 and (d sigma^2)^2 for
    the model, whose d = n_heads * d_h grows with d_h. Right: softmax entropy relative
    to its maximum (solid) and the largest attention weight (dotted), with uniform
    attention (grey dashed) for reference."""
    fig, (ax, bx) = new_figure(ncols=2, row_height=4.4)
    has_model = bool((frame["input"] == "model").any())
    dims = sorted(frame["head_dim"].unique())
    for (name, scaled), df in frame.groupby(["input", "scaled"], sort=False):
        df = df.sort_values("head_dim")
        c = SERIES_COLORS.get((name, bool(scaled)), "0.3")
        marker = "o" if not scaled else "s"
        ax.errorbar(
            df["head_dim"], df["logit_var"], yerr=2 * df["logit_var_se"].fillna(0), color=c, marker=marker,
            ms=5, lw=0, elinewidth=1.2, capsize=2, label=series_label(name, bool(scaled)),
        )  # fmt: skip
        ax.plot(df["head_dim"], df["pred_logit_var"], color=c, ls="--", lw=1.3,
                label=THEORY_LABELS.get((name, bool(scaled)), "theory"))  # fmt: skip
        bx.plot(df["head_dim"], df["entropy_rel"], color=c, marker=marker, ms=4, lw=1.6)
        bx.plot(df["head_dim"], df["max_weight"], color=c, marker=marker, ms=4, lw=1.4, ls=":")
    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.set_xticks(dims, [str(d) for d in dims])
        a.minorticks_off()
        model_note = r" (model input: $d = n_\mathrm{heads}\, d_h$)" if has_model else ""
        a.set_xlabel(r"head size $d_h$" + model_note)
        a.grid(True, which="major", alpha=0.3)
    ax.set_yscale("log")
    ax.set_ylabel(r"logit variance  var$(q \cdot k)$ (scaled: $/ d_h$)")
    ax.set_title("Attention-logit variance at init")
    # one entry per series (its marker on its dashed theory line), below the axes
    handles = [
        Line2D(
            [],
            [],
            color=SERIES_COLORS[k],
            marker="o" if not k[1] else "s",
            ms=5,
            ls="--",
            lw=1.3,
            label=f"{series_label(*k)}: {THEORY_LABELS[k]}",
        )  # fmt: skip
        for k in SERIES_COLORS
        if ((frame["input"] == k[0]) & (frame["scaled"] == k[1])).any()
    ]
    handles.append(Line2D([], [], color="0.3", marker="o", ls="none", label="markers: measured (±2 SE)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=1)

    uniform = frame.groupby("head_dim")["max_weight_uniform"].mean().sort_index()
    bx.plot(uniform.index, uniform.to_numpy(), color="0.5", ls="--", lw=1.2)
    bx.axhline(1.0, color="0.5", ls="--", lw=1.2)
    bx.set_ylim(0, 1.08)
    bx.set_ylabel("entropy / log(keys);  largest weight")
    bx.set_title("Softmax at init (mean over heads and queries)")
    handles = [
        Line2D([], [], color=SERIES_COLORS[k], marker="o" if not k[1] else "s", ms=4, label=series_label(*k))
        for k in SERIES_COLORS
        if ((frame["input"] == k[0]) & (frame["scaled"] == k[1])).any()
    ]
    handles += [
        Line2D([], [], color="0.3", lw=1.6, label="entropy (relative)"),
        Line2D([], [], color="0.3", lw=1.4, ls=":", label="largest weight"),
        Line2D([], [], color="0.5", lw=1.2, ls="--", label="uniform attention"),
    ]
    # below the axes: the curves fill the whole panel
    bx.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=1)
    suptitle(fig, title)
    return fig
