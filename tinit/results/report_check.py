"""What ``tinit check`` shows: the rich table, the variance figure of items (a) and
(b), and check.md, a short report with the figures embedded as relative links."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from rich.table import Table

from ..criteria import ITEMS, z_quantile
from .palette import config_style
from .rundir import atomic_write_text
from .style import MEASURED, THEORY, footnote, new_figure, styled, suptitle
from .tables import fmt, fmt_column, pct, summary_table

#: Figure stem -> the items it illustrates, in report order.
FIGURES = {
    "check_variance": ("a", "b"),
    "stream_grads": ("c",),
    "params": ("d",),
    "attention_scale": ("e",),
}


def verdict(check: pd.DataFrame) -> str:
    failed = check[~check["passed"].astype(bool)]
    if failed.empty:
        return f"All {len(check)} claims pass."
    items = ", ".join(dict.fromkeys(failed["item"]))
    return f"{len(failed)} of {len(check)} claims FAIL (items {items})."


def check_table(check: pd.DataFrame, title: str = "") -> Table:
    """One row per claim: measured, theory, relative error, pass/fail and, beside it,
    the criterion it was judged by; a large error beside a pass is marked (†) and
    explained under the table."""
    caveats = [str(c) for c in check.get("caveat", pd.Series(dtype=str)).fillna("") if str(c)]
    caption = "criteria and details: check.md, check.csv"
    if caveats:
        caption = "† " + "; ".join(dict.fromkeys(caveats)) + ". " + caption
    t = summary_table(title, caption)
    t.add_column("", no_wrap=True)
    t.add_column("claim", min_width=22)
    for col in ("measured", "theory", "err"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("result", no_wrap=True)
    t.add_column("criterion", max_width=15, overflow="fold")
    last = None
    measured, theory = fmt_column(check["measured"]), fmt_column(check["theory"])  # one format a column
    for i, r in enumerate(check.itertuples(index=False)):
        ok = bool(r.passed)
        caveat = str(getattr(r, "caveat", "") or "")
        t.add_row(
            f"({r.item})" if r.item != last else "",
            r.claim,
            measured[i],
            theory[i],
            pct(r.rel_err) + ("†" if caveat else ""),
            "[green]pass[/]" if ok else "[bold red]FAIL[/]",
            str(getattr(r, "criterion", "") or ""),
            end_section=False,
        )
        last = r.item
    return t


@styled
def plot_check_variance(variance: pd.DataFrame, alpha: float, title: str = "") -> Figure:
    """Left: v_k / v0 against k for the (a)/(b) runs, measured (solid) and the law
    v0 + sum s_j^2 (dashed), with the Gaussian-branch run. Right: the z-score of the
    stream/branch covariance at every addition, with the Bonferroni bounds (dashed)."""
    fig, (ax, bx) = new_figure(ncols=2, row_height=5.2)
    model = variance[variance["branch"] == "model"]
    depths = sorted(model["n_layers"].unique())
    notes = []
    for (init, L), df in model.groupby(["init", "n_layers"], sort=False):
        st = config_style(init, "pre")
        c = st["color"]
        v0 = float(df["stream_var"].iloc[0])
        deep = L == depths[-1]
        if deep:  # the long run: a line, its configuration's marker now and then
            ax.plot(df["k"], df["stream_var"] / v0, color=c, label=f"{init} init, L={L}", marker=st["marker"],
                    mfc="none", markevery=max(1, len(df) // 8), gid=f"measured:{init}/{L}",
                    **{**MEASURED, "lw": 2.0})  # fmt: skip
        else:  # the short run lies on the long one (shared draws): open markers on top
            ax.plot(df["k"], df["stream_var"] / v0, color=c, ls="none", marker=st["marker"], mfc="white",
                    ms=4.5, mew=1.2, zorder=4, label=f"{init} init, L={L}",
                    gid=f"measured:{init}/{L}")  # fmt: skip
        ax.plot(df["k"], df["pred_cumulative"] / v0, color="k" if deep else c, lw=0.9, ls=THEORY["ls"],
                alpha=0.8, zorder=3)  # fmt: skip
        err = float(df["stream_var"].iloc[-1] / df["pred_cumulative"].iloc[-1] - 1)
        if abs(err) > 0.1:  # (a) passes there only on a wide standard error: say so beside the gap
            # the same quantity, sign and base as the table's err column: measured / law - 1
            notes.append(f"{init} init, L={L}: the measured v_2L is {pct(err)} off the law (measured / law"
                         f" - 1, the table's err); (a) at L={L} tests this gap against the covariances'"
                         " standard error, which is wide this deep (its row in check.md)")  # fmt: skip
        if not np.isfinite(df["stream_var"] / v0).any():
            notes.append(f"{init} init, L={L}: no finite v_k / v0 (an overflow, flagged in variance.csv): "
                         "nothing to draw")  # fmt: skip
        a = df[df["k"] > 0]
        bx.plot(a["k"], a["cov_z"], color=c, lw=0, marker=st["marker"], mfc="none" if deep else c,
                ms=2.5 if deep else 3.5, alpha=0.85, label=f"{init} init, L={L}")  # fmt: skip
    if len(depths) > 1:
        notes.append(
            f"The L={depths[0]} runs share their draws with the L={depths[-1]} runs, so their points (open "
            f"markers) lie on the first {2 * depths[0]} additions of the L={depths[-1]} lines."
        )
    gauss = variance[variance["branch"] == "gaussian"]
    if not len(gauss):
        notes.append("Gaussian branches (the law's exact case): not run, the naive model run's mean s^2 "
                     "not being finite (check.md says so)")  # fmt: skip
    else:
        v0 = float(gauss["stream_var"].iloc[0])
        ax.plot(gauss["k"], gauss["stream_var"] / v0, color="0.45", lw=1.4, marker="D", ms=2.5,
                label="Gaussian branches (the law's exact case)")  # fmt: skip
        ax.plot(gauss["k"], gauss["pred_cumulative"] / v0, color="0.45", lw=1.0, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("residual addition k")
    ax.set_ylabel("stream variance $v_k / v_0$")
    ax.set_title("(a), (b): residual-stream variance, pre-norm")
    handles, _ = ax.get_legend_handles_labels()
    style = [
        Line2D([], [], color="0.3", lw=1.8, label="measured"),
        Line2D([], [], color="0.3", lw=1.1, ls="--", label=r"law $v_0 + \sum_{j\leq k} s_j^2$"),
    ]
    ax.legend(handles=handles + style, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1)
    for L, ls in zip(depths, (":", "--"), strict=False):
        z = z_quantile(alpha, 2 * int(L))
        bx.axhline(z, color="0.3", lw=1.0, ls=ls, label=f"±{z:.2f}: α = {alpha:g}, Bonferroni over {2 * L}")
        bx.axhline(-z, color="0.3", lw=1.0, ls=ls)
    bx.axhline(0, color="0.6", lw=0.8)
    bx.set_xlabel("residual addition k")
    bx.set_ylabel("z = Cov(stream, branch) / its s.e.")
    bx.set_title("(a): independence of stream and branch")
    z_drawn = model["cov_z"].abs()[np.isfinite(model["cov_z"])]
    if not len(z_drawn):
        notes.append("(a) independence: no finite z (the covariances overflowed): nothing to draw")
    zmax = max(4.5, float(z_drawn.max()) * 1.1 if len(z_drawn) else 0.0)
    bx.set_ylim(-zmax, zmax)
    bx.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1)
    suptitle(fig, title)
    footnote(fig, notes)
    return fig


def _md_number(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return fmt(x, 5)


def check_markdown(check: pd.DataFrame, meta: dict, figures: dict[str, str], description: str) -> str:
    """The report: verdict, settings, then per item its explanation, its rows and its figure."""
    lines = [
        "# tinit check",
        "",
        f"**{verdict(check)}**",
        "",
        f"Settings: {description}. Every criterion is a two-sided test at level "
        f"alpha = {meta.get('alpha', 0.01):g} against a standard error the run supplies (Bonferroni "
        "for a maximum over several quantities); see each item.",
        "",
    ]
    for item, (title, text) in ITEMS.items():
        rows = check[check["item"] == item]
        ok = bool(rows["passed"].astype(bool).all()) if len(rows) else False
        lines += [f"## ({item}) {title}: {'pass' if ok else 'FAIL'}", "", text, ""]
        lines += [
            "| claim | measured | theory | err | result | criterion | detail |",
            "|---|---:|---:|---:|---|---|---|",
        ]
        for r in rows.itertuples(index=False):
            detail = str(r.detail).replace("|", "\\|")  # a literal | inside a table cell
            caveat = str(getattr(r, "caveat", "") or "")
            if caveat:
                detail += f". Why this error is expected: {caveat}"
            crit = str(getattr(r, "criterion", "") or "").replace("|", "\\|")
            lines.append(
                f"| {r.claim} | {_md_number(r.measured)} | {_md_number(r.theory)} | {pct(r.rel_err)} | "
                f"{'pass' if r.passed else '**FAIL**'} | {crit} | {detail} |"
            )
        lines.append("")
        for stem, items in FIGURES.items():
            if stem not in figures:
                continue
            if items[0] == item:
                lines += [f"![{stem}]({figures[stem]})", ""]
            elif item in items:
                lines += [f"Figure: [{figures[stem]}]({figures[stem]}), shown under ({items[0]}).", ""]
    seconds = meta.get("seconds", {})
    if seconds:
        lines.append("Timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()) + ".")
    return "\n".join(lines) + "\n"


def write_check_md(
    check: pd.DataFrame, meta: dict, run_dir: Path, formats: Sequence[str], description: str
) -> list[Path]:
    """check.md in the run folder, linking each figure in the first format a markdown
    viewer shows (png, then svg; pdf as a plain link)."""
    fmt_ = next((f for f in ("png", "svg") if f in formats), formats[0])
    figures = {stem: f"{stem}.{fmt_}" for stem in FIGURES if (Path(run_dir) / f"{stem}.{fmt_}").exists()}
    path = Path(run_dir) / "check.md"
    return [atomic_write_text(path, check_markdown(check, meta, figures, description))]
