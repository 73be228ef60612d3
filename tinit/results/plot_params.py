"""Figure of ``tinit params``: components stacked, tied vs untied head; and the gated
FFN at 8d/3 against the classic FFN at 4d."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .plots import new_figure

COMPONENT_COLORS = {
    "embedding": "#1f77b4",
    "positions": "#aec7e8",
    "attention": "#ff7f0e",
    "ffn": "#2ca02c",
    "norms": "#9467bd",
    "final_norm": "#c5b0d5",
    "head": "#d62728",
}
COMPONENT_LABELS = {
    "embedding": "embedding E (V·d)",
    "positions": "learned positions",
    "attention": "attention (all blocks)",
    "ffn": "FFN (all blocks)",
    "norms": "block norms",
    "final_norm": "final norm",
    "head": "untied head (V·d)",
}


def _scale(total: float) -> tuple[float, str]:
    for factor, unit in ((1e9, "billions"), (1e6, "millions"), (1e3, "thousands")):
        if total >= factor:
            return factor, unit
    return 1.0, ""


def plot_params(params: pd.DataFrame, ffn: pd.DataFrame, summary: pd.DataFrame, title: str = "") -> Figure:
    """Left: one stacked bar per tying (tied, untied), one segment per component, the
    saving V·d marked. Right: FFN weights per block for the classic 4d and the gated
    variants, with the classic count 8d² dashed."""
    fig, (ax, bx) = new_figure(ncols=2, width=6.8)
    s = summary.iloc[0]
    factor, unit = _scale(float(s["total_untied"]))
    tyings = list(dict.fromkeys(params["tying"]))
    for x, tying in enumerate(tyings):
        bottom = 0.0
        for r in params[params["tying"] == tying].itertuples(index=False):
            if r.count == 0:
                continue
            h = r.count / factor
            ax.bar(x, h, bottom=bottom, width=0.6, color=COMPONENT_COLORS.get(r.component, "0.5"),
                   edgecolor="white", linewidth=0.6)  # fmt: skip
            bottom += h
        ax.annotate(f"{int(round(bottom * factor)):,}", (x, bottom), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 2), textcoords="offset points")  # fmt: skip
    top = float(s["total_untied"]) / factor
    ax.set_ylim(0, top * 1.12)
    ax.set_xticks(range(len(tyings)), [f"{t} head" for t in tyings])
    ax.set_xlim(-0.6, len(tyings) - 0.4)
    ax.set_ylabel(f"parameters ({unit})" if unit else "parameters")
    ax.set_title(f"Tying saves {int(s['saved']):,} ({100 * s['saved_frac_untied']:.1f}% of untied)")
    present = [c for c in COMPONENT_LABELS if (params["component"].eq(c) & params["count"].gt(0)).any()]
    handles = [Patch(color=COMPONENT_COLORS[c], label=COMPONENT_LABELS[c]) for c in present]
    ax.legend(handles=handles[::-1], fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="y", alpha=0.3)

    y = list(range(len(ffn)))
    diff = 100 * (ffn["ratio"] - 1.0)
    colors = ["#2ca02c" if bool(e) else "#ff7f0e" for e in ffn["equal"]]
    bx.barh(y, diff, color=colors, height=0.4)
    span = max(float(diff.abs().max()), 0.05)
    for yi, r, dv in zip(y, ffn.itertuples(index=False), diff, strict=True):
        d_ff = f"{r.d_ff:.2f}" if r.d_ff != int(r.d_ff) else f"{int(r.d_ff)}"
        bx.annotate(f"d_ff = {d_ff}: {r.weights:,.0f} ({dv:+.3f}%)", (0, yi), xytext=(4, 12),
                    textcoords="offset points", va="center", fontsize=7.5)  # fmt: skip
    bx.axvline(0.0, color="0.2", ls="--", lw=1.2, label="theory: 3·d·(8d/3) = 2·d·4d = 8d²")
    bx.set_yticks(y, list(ffn["variant"]), fontsize=8)
    bx.invert_yaxis()
    bx.set_xlim(-1.15 * span, 2.2 * span)
    bx.set_ylim(len(ffn) - 0.4, -0.9)
    bx.set_xlabel("FFN weights per block vs the classic FFN at 4d (%)")
    bx.set_title("Gated FFN at 8d/3 vs classic FFN at 4d")
    bx.legend(fontsize=8, loc="upper right")
    bx.grid(True, axis="x", alpha=0.3)
    if title:
        fig.suptitle(title)
    return fig
