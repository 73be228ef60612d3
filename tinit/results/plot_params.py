"""Figure of ``tinit params``: components stacked, tied vs untied head; and the gated
FFN at 8d/3 against the classic FFN at 4d."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from .palette import COMPONENT_COLORS, EQUAL_COLORS
from .style import footnote, styled, suptitle

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


def _count(n: float) -> str:
    """1.5e9 -> '1.5B', 1131464704 -> '1.13B' (three significant digits)."""
    for factor, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= factor:
            return f"{n / factor:.3g}{suffix}"
    return f"{n:.3g}"


def _saving_title(s: pd.Series) -> str:
    """The saving and what each share of it is a share of: this model untied, and the
    reference total where one is given (check's claim: 17.5% of a 1.5B model)."""
    shares = [f"{100 * s['saved_frac_untied']:.1f}% of this model untied ({_count(s['total_untied'])})"]
    ref = s.get("reference_total")
    if ref is not None and not pd.isna(ref):
        shares.append(f"{100 * s['saved_frac_reference']:.1f}% of a {_count(ref)} model")
    return f"Tying the head saves {int(s['saved']):,} parameters:\n{'; '.join(shares)}"


@styled
def plot_params(params: pd.DataFrame, ffn: pd.DataFrame, summary: pd.DataFrame, title: str = "") -> Figure:
    """Top: one horizontal stacked bar per tying (tied, untied), one segment per
    component, the totals at the bar ends; the title's shares say what they are shares
    of (this model untied; ``summary``'s ``reference_total`` where given). Bottom: FFN
    weights per block of each variant (bars from zero, so every variant is visible even
    when all are equal; the axis ends just past them), the classic count 8d² dashed, and
    each bar's count and difference from it written right of the axis."""
    n_ffn = len(ffn)
    fig = Figure(figsize=(7.0, 2.2 + 0.42 * n_ffn + 1.2), layout="constrained")
    # two subfigures: the FFN panel's long labels must not narrow the bars above
    top, bottom = fig.subfigures(2, 1, height_ratios=[2.2, 0.42 * n_ffn + 1.2])
    ax, bx = top.subplots(), bottom.subplots()
    for a in (ax, bx):
        a.tick_params(labelsize=8)
    s = summary.iloc[0]
    factor, unit = _scale(float(s["total_untied"]))
    tyings = list(dict.fromkeys(params["tying"]))
    for y, tying in enumerate(tyings):
        left = 0.0
        for r in params[params["tying"] == tying].itertuples(index=False):
            if r.count == 0:
                continue
            w = r.count / factor
            ax.barh(y, w, left=left, height=0.55, color=COMPONENT_COLORS.get(r.component, "0.5"),
                    edgecolor="white", linewidth=0.6, gid=f"bar:{tying}:{r.component}")  # fmt: skip
            left += w
        ax.annotate(f"{int(round(left * factor)):,}", (left, y), ha="left", va="center", fontsize=8,
                    xytext=(4, 0), textcoords="offset points")  # fmt: skip
    longest = float(s["total_untied"]) / factor
    ax.set_xlim(0, longest * 1.22)  # room for the total beside the longest bar
    ax.set_yticks(range(len(tyings)), [f"{t} head" for t in tyings])
    ax.invert_yaxis()
    ax.set_ylim(len(tyings) - 0.45, -0.55)
    ax.set_xlabel(f"parameters ({unit})" if unit else "parameters")
    ax.set_title(_saving_title(s))
    present = [c for c in COMPONENT_LABELS if (params["component"].eq(c) & params["count"].gt(0)).any()]
    # a component under half a percent of the total is narrower than a line at this width:
    # its legend entry says so (and how many) instead of pointing at nothing
    counts = params[params["tying"] == tyings[-1]].set_index("component")["count"]
    total = float(s["total_untied"])
    handles = []
    for c in present:
        n = int(counts.get(c, 0))
        thin = 0 < n < 0.005 * total
        label = COMPONENT_LABELS[c] + (f" ({n:,}: too thin)" if thin else "")
        handles.append(Patch(color=COMPONENT_COLORS[c], label=label))
    top.legend(handles=handles, loc="outside lower center", ncols=3, frameon=False)
    ax.grid(True, axis="x", alpha=0.3)

    ffn_factor, ffn_unit = _scale(float(ffn["weights"].max()))
    y = list(range(n_ffn))
    vals = ffn["weights"].to_numpy(dtype=float) / ffn_factor
    equal = [bool(e) for e in ffn["equal"]]
    bx.barh(y, vals, color=[EQUAL_COLORS[e] for e in equal], height=0.55, gid="ffn_bars")
    classic = float(ffn["classic_weights"].iloc[0]) / ffn_factor
    for yi, r in zip(y, ffn.itertuples(index=False), strict=True):
        d_ff = f"{r.d_ff:.2f}" if r.d_ff != int(r.d_ff) else f"{int(r.d_ff)}"
        diff = 100 * (r.ratio - 1.0)
        # beside the axis, not inside it: the axis ends just past the bars (an axis run out to
        # twice the bars for the text's room read as a scale the bars do not reach)
        bx.annotate(f"d_ff = {d_ff}: {r.weights:,.0f} ({'= 8d²' if r.equal else f'{diff:+.3f}%'})",
                    (1.0, yi), xycoords=bx.get_yaxis_transform(), xytext=(5, 0), textcoords="offset points",
                    va="center", fontsize=8, annotation_clip=False)  # fmt: skip
    bx.axvline(classic, color="0.2", ls=(0, (4, 2)), lw=1.1, zorder=3)
    bx.set_yticks(y, list(ffn["variant"]))
    bx.invert_yaxis()
    bx.set_xlim(0, max(vals.max(), classic) * 1.05)
    bx.set_xlabel(f"FFN weights per block ({ffn_unit})" if ffn_unit else "FFN weights per block")
    bx.set_title("Gated FFN at 8d/3 vs classic FFN at 4d")
    # under the whole lower figure, centred on it (centred on the panel, it ran past the edge)
    bottom.legend(
        handles=[
            Patch(color=EQUAL_COLORS[e], label="exactly the classic count" if e else "differs from it")
            for e in (True, False)
            if e in equal  # no entry for a kind of bar not drawn
        ]
        + [Line2D([], [], color="0.2", ls=(0, (4, 2)), lw=1.1, label="theory: 3·d·(8d/3) = 2·d·4d = 8d²")],
        loc="outside lower center",
        ncols=3,
        frameon=False,
    )
    bx.grid(True, axis="x", alpha=0.3)
    suptitle(fig, title)
    footnote(fig, [])
    return fig
