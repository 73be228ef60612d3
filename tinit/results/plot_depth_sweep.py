"""Figure and terminal tables of ``tinit depth-sweep``: the final stream variance
against depth with the law at each depth, the transfer check from a shallow reference
depth to the deepest, and the slope of v_2L against L."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from rich.table import Table

from ..criteria import SPREAD_K
from ..model.placements import PLACEMENTS
from . import style
from .palette import config_label, config_style
from .tables import fmt, summary_table

#: A configuration whose final variance passes this many times v0 (or overflows) is drawn
#: but does not set its panel's range; it is named under the figure.
OFF_SCALE = 1e8
#: The transfer panel's ratio axis is log when the ratios span this factor or more.
TRANSFER_LOG_SPAN = 2.0


def _log_x(depths: np.ndarray) -> bool:
    """Log depth axis when the depths span a factor of 8 or more."""
    return len(depths) > 1 and depths.min() > 0 and depths.max() / depths.min() >= 8


def _y_log_ratio(logx: bool) -> float:
    """Against a log depth axis a y span of 3x is already drawn in log (a law linear in L
    is then a line of slope 1, not an exponential-looking curve); otherwise 30x."""
    return 3.0 if logx else 30.0


def _errorbars(ax, x, y, se, init: str, pos: str, i: int, label: str | None = None) -> None:
    """Mean over seeds with one-standard-error bars: thick, translucent, the configuration's
    colour and (nested) marker, so a theory line on top and coinciding configurations stay visible."""
    st = config_style(init, pos)
    y = np.asarray(y, dtype=np.float64)
    # a standard error that overflowed (inf - inf) is not drawn; a value that did is not either
    se = np.asarray(se, dtype=np.float64)
    se = np.where(np.isfinite(se) & np.isfinite(y) & (np.abs(se) < 1e300), se, 0.0)
    y = np.where(np.isfinite(y), y, np.nan)
    ax.errorbar(x, y, yerr=se, color=st["color"], marker=st["marker"], mfc="none",
                ms=style.nested_marker_size(i), capsize=3, elinewidth=1.2, mew=1.2,
                label=label or config_label(init, pos), gid=f"measured:{init}/{pos}",
                **{**style.MEASURED_UNDER, "lw": 2.6, "alpha": 0.6})  # fmt: skip


def _panels(fig: Figure, n: int, key_h: float = 1.2) -> tuple[list, object]:
    """n panels in two columns (the last spanning both when n is odd), and a row of its
    own under them for the one legend (legends inside the panels covered data)."""
    rows = (n + 1) // 2
    gs = fig.add_gridspec(rows + 1, 2, height_ratios=[2.9] * rows + [key_h])
    axes = [fig.add_subplot(gs[i // 2, i % 2]) for i in range(n - (n % 2))]
    if n % 2:
        axes.append(fig.add_subplot(gs[rows - 1, :]))
    for a in axes:
        a.tick_params(labelsize=8)
        a.grid(True, which="major", alpha=0.3)
    key = fig.add_subplot(gs[rows, :])
    key.axis("off")
    return axes, key


def _law_depth_panel(ax, pos, groups, order, depths, logx, theory, notes) -> str:
    """One placement's final variance against L: measured (mean ± s.e., thick), the
    scheme's closed form with each depth's own measured s^2 (dashed, x), and with
    ``theory`` the scheme's closed-form curve v_2L(L) at every L (dotted). Pre-norm-style
    placements: v_2L - v0 (what the 2L additions added; depth-init's N(0, 1) embedding
    would hide its ln L growth in v_2L / v0); post-norm: v_2L, the sum before the last
    norm. Returns the law's legend words."""
    placement = PLACEMENTS.get(pos)
    grow = placement is None or not placement.resets  # the stream accumulates: show v_2L - v0
    y = "v_growth" if grow else "v_final"
    measured, preds, off, flat = {}, [], [], []
    for (init, p), d in groups:
        if p != pos:
            continue
        d = d.sort_values("n_layers")
        i = order[(init, p)]
        st = config_style(init, p)
        _errorbars(ax, d["n_layers"], d[f"{y}_mean"], d[f"{y}_se"], init, p, i)
        # the law at each depth: the scheme's closed form with that depth's own s^2
        pred = d["pred_closed_final_mean"] - (d["v0_mean"] if grow else 0.0)
        ax.plot(d["n_layers"], pred, color=st["color"], marker="x", ms=4, gid=f"theory:{init}/{p}",
                **style.THEORY)  # fmt: skip
        mf_col = "mf_v_growth_mean" if grow else "mf_v_final_mean"
        if mf_col in d.columns and d[mf_col].notna().any():  # the large-width prediction
            ax.plot(d["n_layers"], d[mf_col], color=st["color"], gid=f"mf:{init}/{p}", **style.PREDICTION)
            preds.append((init, p, d["n_layers"], d[mf_col], None))
        curve = None
        if theory is not None and len(theory):
            t = theory[(theory["init"] == init) & (theory["norm_position"] == p)].sort_values("n_layers")
            if len(t):
                curve = (t["n_layers"], t["theory_v_growth" if grow else "theory_v_final"])
                ax.plot(*curve, color=st["color"], gid=f"closed:{init}/{p}", **style.THEORY_ALT)
        m = d[f"{y}_mean"].to_numpy(dtype=np.float64)
        if not np.isfinite(m).all() or (m.size and np.nanmax(np.abs(m)) > OFF_SCALE * max(
                float(np.nanmin(np.abs(d["v0_mean"]))), 1e-300)):  # fmt: skip
            off.append(f"{init}/{p}")
            continue
        if grow and (m <= 0).any():  # a zero growth (zero-out, rezero), or one lost in the noise
            flat.append(f"{init}/{p}")
        measured[f"{init}/{p}"] = m
        preds.append((init, p, d["n_layers"], pred, curve))
    vals = np.concatenate(list(measured.values())) if measured else np.array([])
    pos_vals = vals[np.isfinite(vals) & (vals > 0)]
    # growth spanning decades (depth-init's ln L beside naive's 2L): log, with a growth <= 0
    # (zero-out, rezero; a tiny growth under the noise) drawn at the bottom edge and named
    log_pos = grow and flat and pos_vals.size and style.wants_log(pos_vals, _y_log_ratio(logx))
    use = pos_vals if log_pos else vals
    allp = [np.asarray(q, dtype=np.float64) for *_, q, _ in preds]
    allp += [np.asarray(c[1], dtype=np.float64) for *_, c in preds if c is not None]
    allp = np.concatenate(allp) if allp else np.array([])
    if use.size and style.wants_log(use, _y_log_ratio(logx)):  # a prediction <= 0 cannot widen a log axis
        allp = allp[allp > 0]
    pv = style.near(use, allp) if allp.size else []
    lim = style.value_axis(ax, use, log_ratio=_y_log_ratio(logx), min_rel_span=0.01, include=pv)
    for (init, p), d in groups:
        if p != pos:
            continue
        d = d.sort_values("n_layers")
        c = config_style(init, p)["color"]
        n = style.mark_clipped(ax, d["n_layers"], d[f"{y}_mean"], lim, c)
        if not n and f"{init}/{p}" in flat:  # drawn inside the (linear) axis: nothing to say
            flat.remove(f"{init}/{p}")
    clipped = []
    for init, p, x, pred, curve in preds:
        c = config_style(init, p)["color"]
        n = style.mark_clipped(ax, x, pred, lim, c)
        if curve is not None:
            n += style.mark_clipped(ax, curve[0], curve[1], lim, c)
        if n and f"{init}/{p}" not in flat:
            clipped.append(f"{init}/{p}")
    name = placement.tag if placement is not None else f"{pos}-norm"
    if clipped:
        notes.append(f"{name}: the theory of " + ", ".join(clipped)
                     + " leaves the measured range (triangles)")  # fmt: skip
    if flat:
        notes.append(f"{name}: v_2L - v0 <= 0 (no growth measured) at some depths for " + ", ".join(flat)
                     + ": at the bottom edge (triangles)")  # fmt: skip
    if off:
        notes.append(f"{name}: off scale (overflow or > {OFF_SCALE:.0e} v0), not in the range: "
                     + ", ".join(off))  # fmt: skip
    notes.append(style.coincidence_note(style.coincidences(measured, ax), name))
    style.integer_axis(ax, depths, "x", log=logx)
    ax.set_xlabel("layers L (2L residual additions)")
    label = placement.heading if placement is not None else name
    # short titles: two panels a row, long ones ran into each other
    if grow:
        ax.set_ylabel(r"$v_{2L} - v_0$ (added by the 2L branches)")
        ax.set_title(f"{label}: $v_{{2L}} - v_0$")
    else:
        ax.set_ylabel(r"$v_{2L}$ (the sum before the last norm)")
        ax.set_title(f"{label}: $v_{{2L}}$")  # (the y label says: the last sum)
    return name


@style.styled
def plot_depth_sweep(
    summary: pd.DataFrame, fit: pd.DataFrame, title: str = "", theory: pd.DataFrame | None = None
) -> Figure:
    """Against depth L, each configuration in its colour and marker, mean ± 1 standard
    error over seeds (thick), with the law *at each depth* on top (dashed, x) and, with
    ``theory`` (depth_sweep_theory.csv), each scheme's closed-form curve v_2L(L) (dotted):

    - one panel per placement: v_2L - v0 for placements that do not reset the stream
      (pre, sandwich, reordered, none), v_2L (the sum before the last norm) post-norm;
      the law at each depth is the scheme's closed form with that depth's measured s^2;
    - transfer: v_2L(L) / v_2L(L_from) with the band 1 ± TRANSFER_TOL that the verdict
      uses; each configuration's ratio and verdict in the legend (a row of its own);
    - gradient: the first/last-layer W_down gradient-norm ratio (omitted when every
      ratio is missing, e.g. a run without gradients).

    The y ranges are the measurements'; a prediction outside is clipped and marked.
    Coinciding configurations, and configurations off scale, are named under the figure.
    """
    present = set(summary["norm_position"])
    positions = [p for p in PLACEMENTS if p in present] + sorted(present - set(PLACEMENTS))
    has_grads = bool(summary["grad_ratio_mean"].notna().any())
    n = len(positions) + 1 + has_grads
    groups = list(summary.groupby(["init", "norm_position"], sort=False))
    key_rows = -(-len(groups) // 2) + 2
    fig = Figure(figsize=(7.0, 2.9 * ((n + 1) // 2) + 0.25 + 0.17 * key_rows), layout="constrained")
    axes, key = _panels(fig, n, key_h=0.25 + 0.17 * key_rows)
    depths = np.sort(summary["n_layers"].unique()).astype(float)
    logx = _log_x(depths)
    n_seeds = int(summary["n_seeds"].max())
    order = {k: i for i, (k, _) in enumerate(groups)}
    spread = f"mean ± 1 s.e. over {n_seeds} seeds" if n_seeds > 1 else "measured (1 seed: no error bars)"
    notes: list[str] = []
    for ax, pos in zip(axes, positions, strict=False):
        _law_depth_panel(ax, pos, groups, order, depths, logx, theory, notes)
    handles = _transfer_panel(axes[len(positions)], summary, fit, groups, order, depths, logx, notes)
    handles += [
        Line2D([], [], color=style.NEUTRAL, lw=2.6, alpha=0.6, marker="o", mfc="none", label=spread),
        Line2D(
            [],
            [],
            color=style.NEUTRAL,
            marker="x",
            ms=4,
            **{**style.THEORY, "zorder": None},
            label="law at each L: the scheme's closed form with that L's measured $s^2$",
        ),  # fmt: skip
    ]
    if theory is not None and len(theory):
        handles.append(Line2D([], [], color=style.NEUTRAL, **{**style.THEORY_ALT, "zorder": None},
                              label="closed form $v_{2L}(L)$, $s^2$ averaged over the depths"))  # fmt: skip
    if "mf_v_final_mean" in summary.columns and summary["mf_v_final_mean"].notna().any():
        handles.append(Line2D([], [], color=style.NEUTRAL, **{**style.PREDICTION, "zorder": None},
                              label="large-width prediction (init only; mean over seeds)"))  # fmt: skip
    if has_grads:
        bx = axes[-1]
        series = {}
        for (init, pos), d in groups:
            d = d.sort_values("n_layers")
            i = order[(init, pos)]
            _errorbars(bx, d["n_layers"], d["grad_ratio_mean"], d["grad_ratio_se"], init, pos, i)
            series[f"{init}/{pos}"] = d["grad_ratio_mean"].to_numpy()
        bx.axhline(1.0, color="0.4", ls=":", lw=1.2, label="equal first and last layer")
        style.integer_axis(bx, depths, "x", log=logx)
        style.value_axis(bx, summary["grad_ratio_mean"], log_ratio=min(10, _y_log_ratio(logx)),
                         min_rel_span=0.1, include=(1.0,))  # fmt: skip
        notes.append(style.coincidence_note(style.coincidences(series, bx), "gradient ratio"))
        bx.set_xlabel("layers L")
        bx.set_ylabel(r"$\|\nabla W_{down}\|$ first / last layer")
        bx.set_title(r"$W_{down}$ gradient ratio, first/last layer")
        handles.append(Line2D([], [], color="0.4", ls=":", lw=1.2, label="gradient ratio 1 (equal layers)"))
    key.legend(handles=handles, loc="center", ncol=2, handlelength=2.2, columnspacing=1.2, frameon=False)
    style.suptitle(fig, title)
    style.footnote(fig, notes)
    return fig


def _transfer_panel(ax, summary, fit, groups, order, depths, logx, notes) -> list:
    """v_2L(L) / v_2L(L_from) per configuration with the tolerance band; returns the
    legend handles: each configuration with its ratio and verdict, and the band."""
    ref = int(fit["transfer_from"].iloc[0]) if len(fit) else int(depths[0])
    tol = float(fit["transfer_tol"].iloc[0]) if len(fit) else 0.10
    series, vals, labels, predicted = {}, [], [], []
    one_depth = False
    for (init, pos), d in groups:
        d = d.sort_values("n_layers").set_index("n_layers")
        if ref not in d.index:
            continue
        a, a_se = d.loc[ref, "v_final_mean"], d.loc[ref, "v_final_se"]
        r = d["v_final_mean"] / a
        r_se = r.abs() * np.sqrt((d["v_final_se"] / d["v_final_mean"]) ** 2 + (a_se / a) ** 2)
        r_se[d.index == ref] = 0.0
        # an overflowed run (inf / inf) is not drawn: an infinite point breaks the axes
        r, r_se = r.where(np.isfinite(r)), r_se.where(np.isfinite(r_se), 0.0)
        f = fit[(fit["init"] == init) & (fit["norm_position"] == pos)]
        word = f["transfers"].iloc[0] if len(f) else None
        label = (f"{init}/{pos}: ×{ratio_text(float(r.iloc[-1]))}, transfers: {word}" if isinstance(word, str)
                 else f"{init}/{pos}")  # fmt: skip
        one_depth = one_depth or not isinstance(word, str)
        _errorbars(ax, d.index.to_numpy(), r, r_se, init, pos, order[(init, pos)], label=label)
        if "mf_v_final_mean" in d.columns and d["mf_v_final_mean"].notna().any():
            mf = d["mf_v_final_mean"] / d.loc[ref, "mf_v_final_mean"]
            ax.plot(d.index.to_numpy(), mf, color=config_style(init, pos)["color"], gid=f"mf:{init}/{pos}",
                    **style.PREDICTION)  # fmt: skip
            predicted.append(mf.to_numpy())
        series[f"{init}/{pos}"] = r.to_numpy()
        vals.append(r.to_numpy())
        if isinstance(word, str) and word != "yes" and np.isfinite(r.iloc[-1]) and abs(r.iloc[-1] - 1) > tol:
            color = config_style(init, pos)["color"]
            labels.append((float(r.iloc[-1]), d.index[-1], color))
    ax.axhspan(1 - tol, 1 + tol, color="0.85", zorder=0, lw=0)
    ax.axvline(ref, color="0.4", ls=":", lw=1.0)
    style.integer_axis(ax, depths, "x", log=logx)
    # log from a 2x span: on a linear 1..8 axis a x1.155 change (beyond the 10% band)
    # looks the same as 1; on a log axis it is as far from 1 as 0.87 is
    measured = np.concatenate(vals) if vals else np.array([1.0])
    near = style.near(measured, np.concatenate(predicted)) if predicted else []
    lim = style.value_axis(ax, measured, log_ratio=TRANSFER_LOG_SPAN, min_rel_span=0.05,
                           include=(1 - tol, 1 + tol, *near))  # fmt: skip
    for (init, pos), d in groups:  # a prediction past the axis: marked at the edge
        if "mf_v_final_mean" in d.columns and ref in set(d["n_layers"]):
            d = d.sort_values("n_layers").set_index("n_layers")
            mf = d["mf_v_final_mean"] / d.loc[ref, "mf_v_final_mean"]
            style.mark_clipped(ax, d.index.to_numpy(), mf.to_numpy(), lim, config_style(init, pos)["color"])
    if ax.get_yscale() == "log":
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_locator(LogLocator(subs=np.arange(1.0, 10.0, 0.5)))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    _ratio_labels(ax, labels)
    if one_depth:
        notes.append("transfer: one depth, so no transfer to check (no ratio, no verdict)")
    notes.append(style.coincidence_note(style.coincidences(series, ax), "transfer"))
    ax.set_xlabel("layers L")
    ax.set_ylabel(f"$v_{{2L}}(L)\\,/\\,v_{{2L}}({ref})$")
    ax.set_title(f"Transfer from L = {ref}: $v_{{2L}}$ relative to L = {ref}")
    handles, _ = ax.get_legend_handles_labels()
    handles.append(Patch(color="0.85", label=f"transfers: within ±{tol:.0%} (with 2 s.e.)"))
    return handles


def _ratio_labels(ax, labels: list, gap: float = 0.045) -> None:
    """Each ratio outside the band beside its last point, so that x1.155 is read as such
    next to a x8 one on the same axis; a label that would sit on another is left out
    (the legend holds every ratio)."""
    lo, hi = ax.get_ylim()
    log = ax.get_yscale() == "log"
    placed: list[float] = []
    for r, x, color in sorted(labels, key=lambda t: -abs(np.log(t[0]))):
        f = (np.log(r) - np.log(lo)) / (np.log(hi) - np.log(lo)) if log else (r - lo) / (hi - lo)
        if any(abs(f - g) < gap for g in placed):
            continue
        placed.append(f)
        ax.annotate(f"×{ratio_text(r)}", (x, r), xytext=(-9, 0), textcoords="offset points", ha="right",
                    va="center", fontsize=8, color=color, gid="ratio", zorder=6,
                    bbox={"fc": "white", "ec": "none", "alpha": 0.8, "pad": 0.5})  # fmt: skip


def _pm(x: float, se: float, digits: int = 3) -> str:
    """x ± se, with at least enough digits in x to resolve se."""
    if x is None or not math.isfinite(x):
        return "-"
    if se is not None and math.isfinite(se) and se > 0 and x != 0:
        digits = min(max(digits, math.ceil(math.log10(abs(x) / se)) + 1), 8)
    return fmt(x, digits) + (f" ± {fmt(se, 2)}" if se is not None and math.isfinite(se) else "")


def ratio_text(r: float) -> str:
    """A ratio near 1 with enough digits to show how far from 1 (×0.999974, not ×1)."""
    if not math.isfinite(r):
        return "-"
    dev = abs(r - 1.0)
    digits = 4 if dev == 0 else min(max(4, math.ceil(-math.log10(dev)) + 2), 7)
    return fmt(r, digits)


def change_text(r: float) -> str:
    """r - 1 in percent: two decimals, or two significant digits below 1%."""
    if not math.isfinite(r):
        return "-"
    c = 100 * (r - 1.0)
    return f"{c:+.2f}%" if abs(c) >= 1 or c == 0 else f"{c:+.2g}%"


def z_text(z: float) -> str:
    return f"{z:.0f}" if abs(z) >= 10 else fmt(z, 2)


_VERDICT_STYLE = {"yes": "green", "no": "red", "unclear": "yellow", "holds": "green", "fails": "red"}


def _word(w: str) -> str:
    return f"[{_VERDICT_STYLE[w]}]{w}[/]" if w in _VERDICT_STYLE else w


def depth_sweep_table(fit: pd.DataFrame, summary: pd.DataFrame, title: str = "") -> Table:
    """One row per configuration: the transfer ratio v_2L(L_to) / v_2L(L_from), its
    change, whether the seeds resolve that change, the practical verdict (within the
    tolerance), and the per-depth law's largest error with its verdict."""
    ref = int(fit["transfer_from"].iloc[0]) if len(fit) else 0
    hi = int(fit["transfer_to"].iloc[0]) if len(fit) else 0
    tol = float(fit["transfer_tol"].iloc[0]) if len(fit) else 0.10
    law_tol = float(fit["law_tol"].iloc[0]) if len(fit) else 0.10
    t = summary_table(
        title,
        f"ratio = v_2L(L={hi}) / v_2L(L={ref}) ± 1 s.e. over seeds. resolved: the change exceeds "
        f"{SPREAD_K:g} s.e. (statistically different; a change can be resolved and still too small to "
        f"matter). transfers: |change| ≤ {tol:.0%}: yes even at ±{SPREAD_K:g} s.e., no beyond it even "
        f"then, unclear in between (1 seed: the change alone). law: the largest |v_2L / (v0 + 2L·s²) − 1| "
        f"over the depths, each depth with its own s² (post-norm: 1 + s²); holds: ≤ {law_tol:.0%}.",
    )
    if hi == ref:
        t.caption = (f"one depth (L={hi}): no ratio, change or transfer verdict (sweep two depths or more). "
                     f"law: the largest |v_2L / (v0 + 2L·s²) − 1| over the depths (post-norm: 1 + s²); "
                     f"holds: ≤ {law_tol:.0%}.")  # fmt: skip
    for col in ("config", f"v({hi})/v({ref})", "change", "resolved", f"transfers\n≤{tol:.0%}",
                "law err", f"law\n≤{law_tol:.0%}"):  # fmt: skip
        t.add_column(col, justify="left" if col == "config" else "right", no_wrap=True)
    for r in fit.itertuples(index=False):
        sig = r.transfer_significant
        resolved = "-" if sig is None or (isinstance(sig, float) and math.isnan(sig)) else (
            "yes" if bool(sig) else "no")  # fmt: skip
        law = r.law_holds
        law_word = "-" if law is None or (isinstance(law, float) and math.isnan(law)) else (
            "holds" if bool(law) else "fails")  # fmt: skip
        t.add_row(
            f"{r.init}/{r.norm_position}",
            "×" + _pm(r.transfer_ratio, r.transfer_ratio_se, 4),
            change_text(r.transfer_ratio),
            resolved,
            _word(r.transfers if isinstance(r.transfers, str) else "-"),
            f"{100 * r.law_max_rel_err:.1f}%" if math.isfinite(r.law_max_rel_err) else "-",
            _word(law_word),
        )
    return t


def depth_sweep_slope_table(fit: pd.DataFrame, summary: pd.DataFrame, title: str = "") -> Table:
    """One row per configuration: the fitted slope of v_2L against L beside the
    constant-s² theory's, their z, and the W_down gradient ratio at the deepest L."""
    hi = int(fit["layers_max"].max()) if len(fit) else 0
    t = summary_table(
        title,
        "slope: least squares of v_2L on L over every (L, seed) ± s.e. over seeds; theory: the same fit "
        "through v0 + 2L·s̄² with one s̄² for all depths: 2·s̄² naive pre-norm (and Gaussian branches), 0 "
        "depth-scaled or post-norm "
        "(rounded to the inputs' precision); z = (slope − theory) / s.e.: |z| > 2: the slope differs from "
        "the constant-s² line beyond noise (s², or post-norm the normalised stream's variance, changes "
        "with L). "
        f"grad: |∇W_down| first / last layer at L={hi}.",
    )
    for col in ("config", "slope", "theory", "z", "grad"):
        t.add_column(col, justify="left" if col == "config" else "right", no_wrap=True)
    for r in fit.itertuples(index=False):
        s = summary[(summary["init"] == r.init) & (summary["norm_position"] == r.norm_position)]
        grad = s[s["n_layers"] == r.layers_max]["grad_ratio_mean"]
        slope_se = r.slope_se_seeds if r.n_seeds > 1 else r.slope_se
        z = r.slope_z
        ok = math.isfinite(z)
        z_style = "green" if ok and abs(z) <= 2 else "yellow" if ok and abs(z) <= 3 else "red"
        t.add_row(
            f"{r.init}/{r.norm_position}",
            _pm(r.slope, slope_se),
            fmt(r.theory_slope, 3),
            f"[{z_style}]{z_text(z)}[/]" if ok else "-",
            fmt(float(grad.iloc[0]), 3) if len(grad) else "-",
        )
    return t


def depth_sweep_prediction_table(fit: pd.DataFrame, title: str = "") -> Table | None:
    """One row per configuration: the measured transfer ratio v_2L(L_to) / v_2L(L_from)
    beside the large-width prediction's (its seeds' means) and how many standard errors
    apart they are. None when nothing was predicted (--mf-draws 0) or one depth ran."""
    if "mf_transfer_ratio" not in fit or not fit["mf_transfer_ratio"].notna().any():
        return None
    ref, hi = int(fit["transfer_from"].iloc[0]), int(fit["transfer_to"].iloc[0])
    t = summary_table(
        title,
        f"predicted: the large-width Gaussian recursion from the init and each seed's tokens alone (no "
        f"forward), v_2L(L={hi}) / v_2L(L={ref}) of its seed means; z = (measured − predicted) / s.e. of "
        f"the measured ratio.",
    )
    for col in ("config", f"v({hi})/v({ref})", "predicted", "z"):
        t.add_column(col, justify="left" if col == "config" else "right", no_wrap=True)
    for r in fit.itertuples(index=False):
        z = r.mf_transfer_z
        t.add_row(f"{r.init}/{r.norm_position}", "×" + _pm(r.transfer_ratio, r.transfer_ratio_se, 4),
                  "×" + ratio_text(r.mf_transfer_ratio), z_text(z) if math.isfinite(z) else "-")  # fmt: skip
    return t
