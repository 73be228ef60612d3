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

from ..model.placements import PLACEMENTS
from . import mathtext_cache
from .palette import config_label, config_style
from .rundir import atomic_write
from .style import (
    FONT,
    FULL_WIDTH,
    MEASURED_UNDER,
    NEUTRAL,
    PREDICTION,
    THEORY,
    THEORY_ALT,
    coincidence_note,
    coincidences,
    finite,
    footnote,
    integer_axis,
    mark_clipped,
    markevery,
    near,
    nested_marker_size,
    styled,
    suptitle,
    value_axis,
    wants_log,
)

__all__ = ["FORMATS", "plot_variance", "save_figure"]


from .formats import FORMATS  # noqa: F401  (re-exported)

#: savefig's arguments by format: PNG at zlib level 3 (Pillow's default is 6): the same
#: pixels, a file ~1% larger, written in two thirds of the time.
SAVE_KW = {"png": {"pil_kwargs": {"compress_level": 3}}}


def save_figure(fig: Figure, run_dir: Path, stem: str, formats: Iterable[str] = ("png",)) -> list[Path]:
    mathtext_cache.install()  # parse each math label once per process, not per renderer
    paths = []
    for fmt in formats:
        path = Path(run_dir) / f"{stem}.{fmt}"
        dpi = 200 if fmt == "png" else None

        def write(tmp: Path, fmt: str = fmt, dpi: int | None = dpi) -> None:
            fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches="tight", **SAVE_KW.get(fmt, {}))

        paths.append(atomic_write(path, write))
    return paths


def _short(init: str, pos: str) -> str:
    return f"{init}/{pos}"


#: A configuration whose measured stream variance is not finite (an overflow: DeepNet's
#: alpha^2L in float32 at depth) or grows past this many times its first plotted value
#: is drawn but does not set its panel's range; it is named in the legend and the notes.
OFF_SCALE = 1e8


def _resets(pos: str) -> bool:
    """A norm follows each sum (post-norm): v_k is the sum before it, nothing accumulates."""
    return pos in PLACEMENTS and PLACEMENTS[pos].resets


def _kmin(pos: str) -> int:
    # post-norm: k = 0, 1 precede the first norm (v ~ v0, a different scale)
    return 2 if _resets(pos) else 0


def _has(df: pd.DataFrame, col: str) -> bool:
    """The frame has the column with at least one value (a prediction's, a measurement's)."""
    return col in df.columns and bool(df[col].notna().any())


def off_scale(df: pd.DataFrame, pos: str) -> str:
    """ "" when the configuration's measured v_k is drawable on a shared axis, else why
    not ("overflow": a non-finite value; "grows past 1e8x": its growth)."""
    col = "stream_var" if _has(df, "stream_var") or not _has(df, "mf_stream_var") else "mf_stream_var"
    v = df[df["k"] >= _kmin(pos)][col].to_numpy(dtype=np.float64)
    if v.size and not np.isfinite(v).all():
        return "overflow"
    fin = v[np.isfinite(v) & (v > 0)]
    if fin.size and fin.max() / fin[0] > OFF_SCALE:
        return f"grows past {OFF_SCALE:.0e}x".replace("e+0", "e")
    return ""


def _law_panel(ax, groups, pos: str, off: dict, narrow: bool = False, no_closed=frozenset()) -> list[str]:
    """Stream variance v_k of the configurations at one norm placement: measured
    (thick, translucent), the cumulative law (dashed), the scheme's closed form
    (dotted, not post-norm) and the large-width prediction (dash-dot-dot, where the
    frame has it) on top. Configurations in ``off`` are drawn but left out of the
    range; those in ``no_closed`` (an audited model as built: no scheme) get no
    closed-form line. Without a measurement (--theory-only) the prediction sets the
    range. Returns notes."""
    rows = [(init, p, df) for (init, p), df in groups if p == pos]
    placement = PLACEMENTS.get(pos)
    name = placement.tag if placement is not None else f"{pos}-norm"
    kmin = _kmin(pos)
    closed = not _resets(pos)
    measured, notes, errs, mf_errs = {}, [], [], []
    only_mf = not any(_has(df, "stream_var") for _, _, df in rows)
    for i, (init, p, df) in enumerate(rows):
        d = df[df["k"] >= kmin]
        st = config_style(init, p)
        n = len(d)
        marks = {"marker": st["marker"], "mfc": "none", "ms": nested_marker_size(i % 4),
                 "markevery": markevery(n, i, len(rows))}  # fmt: skip
        if only_mf:  # --theory-only: the prediction carries the configuration's marker
            ax.plot(d["k"], d["mf_stream_var"], color=st["color"], gid=f"mf:{init}/{p}", **marks,
                    **PREDICTION)  # fmt: skip
            if (init, p) not in off:
                measured[_short(init, p)] = d["mf_stream_var"].to_numpy()
            continue
        ax.plot(d["k"], d["stream_var"], color=st["color"], label=config_label(init, p),
                gid=f"measured:{init}/{p}", **marks, **MEASURED_UNDER)  # fmt: skip
        ax.plot(d["k"], d["pred_cumulative"], color=st["color"], gid=f"theory:{init}/{p}", **THEORY)
        if closed and init not in no_closed:
            ax.plot(d["k"], d["pred_closed"], color=st["color"], gid=f"closed:{init}/{p}", **THEORY_ALT)
        if _has(d, "mf_stream_var"):
            ax.plot(d["k"], d["mf_stream_var"], color=st["color"], gid=f"mf:{init}/{p}", **PREDICTION)
        if (init, p) in off:
            continue
        measured[_short(init, p)] = d["stream_var"].to_numpy()
        err = (d["stream_var"] / d["pred_cumulative"] - 1).abs().max()
        errs.append(f"{_short(init, p)} {100 * err:.2g}%")
        if _has(d, "mf_stream_var"):
            mf_err = (d["stream_var"] / d["mf_stream_var"] - 1).abs().max()
            mf_errs.append(f"{_short(init, p)} {100 * mf_err:.2g}%")
    values = np.concatenate(list(measured.values())) if measured else np.array([])
    if only_mf:
        cols: tuple[str, ...] = ()
    else:
        cols = ("pred_cumulative", "pred_closed") if closed else ("pred_cumulative",)
        cols += ("mf_stream_var",) if any(_has(df, "mf_stream_var") for _, _, df in rows) else ()

    def drawn(init):
        return [c for c in cols if c != "pred_closed" or init not in no_closed]

    preds = [df[df["k"] >= kmin][c] for init, p, df in rows if (init, p) not in off for c in drawn(init)]
    lim = value_axis(ax, values, log_ratio=30, include=near(values, np.concatenate(preds) if preds else []))
    clipped = []
    for init, p, df in rows:  # leaving the measured range: clipped, marked
        d = df[df["k"] >= kmin]
        first = "mf_stream_var" if only_mf else "stream_var"
        measured_k = np.isfinite(d[first].to_numpy(dtype=np.float64))
        for col in (first, *drawn(init)):
            # past an overflow there is no measurement to set a prediction against: no mark
            y = d[col].where(measured_k)
            n = mark_clipped(ax, d["k"], y, lim, config_style(init, p)["color"])
            if n and (init, p) not in off:
                clipped.append(f"{col} of {_short(init, p)}")
    if clipped:
        notes.append(f"{name}: " + ", ".join(clipped) + " leave the measured range (triangles)")
    if mf_errs:
        notes.insert(0, f"{name}, largest |measured/prediction - 1| over k: " + ", ".join(mf_errs))
    if errs:
        notes.insert(0, f"{name}, largest |measured/law - 1| over k: " + ", ".join(errs))
    gone = [f"{_short(i, p)} ({off[(i, p)]})" for i, p, _ in rows if (i, p) in off]
    if gone:
        notes.append(f"{name}: off scale, drawn but not in the axis range: " + ", ".join(gone))
    notes.append(coincidence_note(coincidences(measured, ax), f"{name} v_k"))
    # (a narrow panel, three a row, has room for ~26 characters under it)
    after = (" (0 = embedding)" if kmin == 0 else f" (>= {kmin}: normed)" if narrow
             else f" (k >= {kmin}: after a norm)")  # fmt: skip
    ax.set_xlabel(("addition k" if narrow else "residual addition k") + after)
    ax.set_ylabel("$v_k$ (the sum before the norm)" if _resets(pos) else "stream variance $v_k$")
    if placement is None:
        ax.set_title(f"{pos}-norm: stream variance")
    else:
        ax.set_title(placement.short_title if narrow else placement.title)
    return notes


def _branch_panel(ax, groups, sub: str, wide: bool = True) -> list[str]:
    """Branch variance s^2 per layer of one sublayer, every configuration; layer-0
    points far outside the others (their input is the unnormalised embedding) are
    clipped and marked. Returns notes."""
    series, predicted, notes = {}, {}, []
    n_all = len(groups)
    groups = [(key, _before_overflow(df)) for key, df in groups]
    past = [_short(*key) for key, df in groups if df.attrs.get("overflow_k") is not None]
    only_mf = not any(_has(df, "branch_var") for _, df in groups) and any(
        _has(df, "mf_branch_var") for _, df in groups
    )  # --theory-only: the prediction alone, with the configuration's marker
    col = "mf_branch_var" if only_mf else "branch_var"
    for i, ((init, pos), df) in enumerate(groups):
        d = df[df["sublayer"] == sub].sort_values("layer")
        st = config_style(init, pos)
        line = PREDICTION if only_mf else {"lw": 1.4 if n_all <= 6 else 1.0}
        ax.plot(d["layer"], d[col], color=st["color"], marker=st["marker"], mfc="none",
                ms=nested_marker_size(i % 4), markevery=markevery(len(d), i, n_all),
                label=config_label(init, pos), gid=f"{'mf' if only_mf else 'measured'}:{init}/{pos}",
                **line)  # fmt: skip
        series[_short(init, pos)] = d[col].to_numpy()
        if not only_mf and _has(d, "mf_branch_var"):
            ax.plot(d["layer"], d["mf_branch_var"], color=st["color"], gid=f"mf:{init}/{pos}", **PREDICTION)
            predicted[_short(init, pos)] = d["mf_branch_var"].to_numpy()
    rest = np.concatenate([v[1:] for v in series.values()]) if series else np.array([])
    first = np.array([v[0] for v in series.values() if len(v)])
    fin = rest[np.isfinite(rest) & (rest > 0)]
    zeros = [name for name, v in series.items() if len(v) and (np.asarray(v) == 0).any()]
    if fin.size and zeros and wants_log(fin):  # a zero branch (zero-initialised output) on a log axis:
        rest = fin  # drawn as triangles at the bottom edge, named
    pred = np.concatenate([v[1:] for v in predicted.values()]) if predicted else np.array([])
    if fin.size:
        lo, hi = fin.min(), fin.max()
        keep = first[(first >= lo / 10) & (first <= hi * 10)]
        lim = value_axis(ax, np.concatenate([rest, keep]), log_ratio=30, min_rel_span=0.2,
                         include=near(fin, pred[pred > 0]))  # fmt: skip
    else:
        lim = value_axis(ax, first)
    if ax.get_yscale() == "log" and zeros:
        notes.append(f"{sub}: s^2 = 0 (a zero-initialised output) of " + ", ".join(zeros)
                     + ": triangles at the bottom edge")  # fmt: skip
    if past and sub == "attn":
        notes.append("branch variances after the stream overflowed are not drawn (no measurement): "
                     + ", ".join(f"{_short(*key)} from k = {df.attrs['overflow_k']}" for key, df in groups
                                 if df.attrs.get("overflow_k") is not None))  # fmt: skip
    off0, offk = [], []
    for (init, pos), df in groups:
        d = df[df["sublayer"] == sub].sort_values("layer")
        if _short(init, pos) in predicted:  # the prediction past the axis: marked, not named
            mf = d["mf_branch_var"].to_numpy(dtype=np.float64)
            mark_clipped(ax, d["layer"][1:], mf[1:], lim, config_style(init, pos)["color"])
        b = d[col].to_numpy(dtype=np.float64)
        n = mark_clipped(ax, d["layer"], b, lim, config_style(init, pos)["color"])
        if n and not (b == 0).all():
            if n == 1 and not (lim[0] <= b[0] <= lim[1]):
                off0.append(f"{_short(init, pos)} ({b[0]:.2g})")
            else:
                offk.append(_short(init, pos))
    name = "attention" if sub == "attn" else "FFN"
    if off0:
        notes.append(f"{sub}: layer-0 s^2 of " + ", ".join(off0)
                     + " (its input is the embedding) off the axis (triangle)")  # fmt: skip
    if offk:
        notes.append(f"{sub}: s^2 of " + ", ".join(offk) + " leaves the axis range (triangles)")
    notes.append(coincidence_note(coincidences(series, ax), f"{name} s^2"))
    ax.set_xlabel("layer")
    ax.set_ylabel(f"{name} branch variance $s^2$")
    cap = name[0].upper() + name[1:]
    ax.set_title(f"{cap} branch variance per layer" if wide else f"{cap} $s^2$ per layer")
    integer_axis(ax, variance_layers(series), "x", nbins="auto" if wide else 5)
    return notes


def _before_overflow(df: pd.DataFrame) -> pd.DataFrame:
    """The configuration's rows with the branch variance blanked where the stream entering
    the addition is no longer finite (past an overflow the branch reads Norm(inf): its 0 or
    NaN measures nothing); ``attrs["overflow_k"]``: the first such addition, or None."""
    d = df.sort_values("k")
    col = "stream_var" if _has(d, "stream_var") or not _has(d, "mf_stream_var") else "mf_stream_var"
    v = d[col].to_numpy(dtype=np.float64)
    entering = np.concatenate([[True], np.isfinite(v[:-1])])
    out = d.assign(branch_var=d["branch_var"].where(entering))
    out.attrs["overflow_k"] = int(d["k"].to_numpy()[~entering][0]) if (~entering).any() else None
    return out


def _rank_panel(ax, groups, notes: list[str]) -> list:
    """Rank collapse against k: the tokens' mean pairwise cosine similarity (solid, 1:
    collapsed) and Dong et al.'s residual ratio (dash-dot, 0: collapsed), measured only,
    each configuration with its marker (offset, so coinciding curves stay told apart;
    they are named in ``notes``). Returns the panel's style handles."""
    vals, cos, res = [], {}, {}
    n = len(groups)
    measured = any(_has(df, "cos_sim") for _, df in groups)
    for i, ((init, pos), df) in enumerate(groups):
        st = config_style(init, pos)
        marks = {"marker": st["marker"], "mfc": "none", "ms": nested_marker_size(i),
                 "markevery": markevery(len(df), i, n)}  # fmt: skip
        if measured:
            ax.plot(df["k"], df["cos_sim"], color=st["color"], lw=1.3, gid=f"cos_sim:{init}/{pos}", **marks)
            ax.plot(df["k"], df["res_ratio"], color=st["color"], lw=1.1, ls="-.",
                    gid=f"res_ratio:{init}/{pos}", **marks)  # fmt: skip
            vals += [df["cos_sim"], df["res_ratio"]]
            cos[f"{init}/{pos}"], res[f"{init}/{pos}"] = df["cos_sim"].to_numpy(), df["res_ratio"].to_numpy()
        if _has(df, "mf_cos_sim"):
            ax.plot(df["k"], df["mf_cos_sim"], color=st["color"], gid=f"mf_cos_sim:{init}/{pos}",
                    **({} if measured else marks), **PREDICTION)  # fmt: skip
            vals.append(df["mf_cos_sim"])
            if not measured:
                cos[f"{init}/{pos}"] = df["mf_cos_sim"].to_numpy()
    v = finite(pd.concat(vals)) if vals else np.array([])
    lo, hi = (min(0.0, float(v.min())), max(1.0, float(v.max()))) if v.size else (0.0, 1.0)
    ax.set_ylim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    notes.append(coincidence_note(coincidences(cos, ax), "cosine"))
    notes.append(coincidence_note(coincidences(res, ax), "residual ratio"))
    ax.set_xlabel("residual addition k (0 = embedding)")
    # which line is which: the legend says where each means collapse (cosine 1, ratio 0)
    ax.set_ylabel("cosine (solid) /\nresidual ratio (dash-dot)" if measured else "mean pairwise cosine")
    ax.set_title("Rank collapse of the tokens")
    integer_axis(ax, df["k"], "x", nbins=5)
    if not measured:
        return []
    return [
        Line2D([], [], color=NEUTRAL, lw=1.3, label="mean pairwise cosine (1: collapsed)"),
        Line2D([], [], color=NEUTRAL, lw=1.1, ls="-.", label="residual ratio (0: collapsed)"),
    ]


def variance_layers(series: dict) -> list[int]:
    n = max((len(v) for v in series.values()), default=0)
    return list(range(n))


def _rows_of(n: int, per_row: int = 3) -> list[int]:
    """n panels in rows of at most ``per_row``, as even as possible (5 -> 3, 2)."""
    rows = -(-n // per_row)
    return [n // rows + (1 if r < n % rows else 0) for r in range(rows)]


@styled
def plot_variance(variance: pd.DataFrame, title: str = "", no_closed_form: Iterable[str] = ()) -> Figure:
    """Stream variance v_k against addition k, one panel per norm placement present (pre,
    post, sandwich, reordered, none; rows of up to 3): measured (thick, translucent)
    with the cumulative law (dashed) and, except post-norm, the scheme's closed form
    (dotted) on top. Below: branch variance s^2 per layer, attention and FFN apart, and,
    when variance.csv has them, the rank-collapse measures against k. One colour and
    marker per configuration (:func:`config_style`), in one legend under the figure.
    Coinciding curves, clipped points, off-scale configurations (an overflow, or growth
    past :data:`OFF_SCALE`: drawn, but not in the range) and the law's largest error are
    named in the notes under the figure. Configurations in ``no_closed_form`` (an
    audited model: as built it follows no scheme) get no closed-form line, and the
    figure says so (the audit computes none). The law's a (stream multiplier) and g (branch multiplier) are
    defined under the figure."""
    no_closed = frozenset(no_closed_form)
    groups = list(variance.groupby(["init", "norm_position"], sort=False))
    present = set(variance["norm_position"])
    positions = [p for p in PLACEMENTS if p in present] + sorted(present - set(PLACEMENTS))
    rank = ({"cos_sim", "res_ratio"} <= set(variance.columns) and bool(variance["cos_sim"].notna().any())
            or _has(variance, "mf_cos_sim"))  # fmt: skip
    only_mf = not _has(variance, "stream_var") and _has(variance, "mf_stream_var")
    off = {}
    for (init, pos), df in groups:
        why = off_scale(df, pos)
        if why:
            off[(init, pos)] = why
    law_rows = _rows_of(len(positions))
    bottom = 2 + rank
    many = len(groups) > 6
    one = len(positions) == 1  # the placement is in the panel's title: the legend names schemes
    labels = {(i, p): (i if one and many else _short(i, p) if many else config_label(i, p))
              + (" (off scale)" if (i, p) in off else "") for (i, p), _ in groups}  # fmt: skip
    width = max(len(t) for t in labels.values())
    # as many columns as fit in the figure's width (inches a character, 0.6 in a handle)
    if many:
        ncol = max(2, min(6, int(6.8 / (0.07 * width + 0.6))))
    else:
        ncol = max(1, min(4, int(6.9 / (0.05 * width + 0.6))))
    key_h = 0.12 + 0.17 * -(-len(groups) // ncol)
    # the line-style legend: measured, law, closed form, prediction, the rank measures
    closed_any = any(not _resets(p) and i not in no_closed for (i, p), _ in groups)
    measured_rank = rank and _has(variance, "cos_sim")
    n_style = (0 if only_mf else 2 + closed_any) + _has(variance, "mf_stream_var") + 2 * measured_rank
    style_cols = n_style if n_style <= 3 else 3 if n_style == 5 else 2
    style_h = 0.12 + 0.17 * -(-max(n_style, 1) // style_cols)
    row_h = 2.6 if max(law_rows + [bottom]) == 3 else 2.9
    n_rows = len(law_rows) + 1
    fig = Figure(figsize=(FULL_WIDTH, row_h * n_rows + style_h + key_h), layout="constrained")
    gs = fig.add_gridspec(n_rows + 2, 6, height_ratios=[row_h] * n_rows + [style_h, key_h])
    tops, j = [], 0
    for r, n in enumerate(law_rows):
        w = 6 // n
        tops += [fig.add_subplot(gs[r, c * w : (c + 1) * w]) for c in range(n)]
        j += n
    w = 6 // bottom
    bots = [fig.add_subplot(gs[n_rows - 1, c * w : (c + 1) * w]) for c in range(bottom)]
    for a in tops + bots:
        a.tick_params(labelsize=FONT)
        a.grid(True, which="major", alpha=0.3)
    notes: list[str] = []
    for ax, pos in zip(tops, positions, strict=True):
        # two or more panels a row: the short titles (long ones ran into each other)
        notes += _law_panel(ax, groups, pos, off, narrow=max(law_rows) > 1, no_closed=no_closed)
    style = []
    if not only_mf:
        style.append(Line2D([], [], color=NEUTRAL, **{**MEASURED_UNDER, "zorder": None}, label="measured"))
        law = r"law $a^2 v_{k-1} + g^2 s_k^2$"
        law += "".join(rf" ({PLACEMENTS[p].label}: $v_{{k-1}} + s_k^2$)" for p in positions if _resets(p))
        style.append(Line2D([], [], color=NEUTRAL, **{**THEORY, "zorder": None}, label=law))
        with_closed = [(i, p) for (i, p), _ in groups if not _resets(p) and i not in no_closed]
        if with_closed:
            style.append(Line2D([], [], color=NEUTRAL, **{**THEORY_ALT, "zorder": None},
                                label="the scheme's closed form"))  # fmt: skip
    if _has(variance, "mf_stream_var"):
        style.append(Line2D([], [], color=NEUTRAL, **{**PREDICTION, "zorder": None},
                            label="large-width prediction (init only)"))  # fmt: skip
    for ax, sub in zip(bots, ("attn", "ffn"), strict=False):
        notes += _branch_panel(ax, groups, sub, wide=not rank)
    if rank:
        style += _rank_panel(bots[2], groups, notes)
    handles = []
    for (init, pos), _ in groups:
        st = config_style(init, pos)
        handles.append(Line2D([], [], color=st["color"], marker=st["marker"], mfc="none", lw=2.0,
                              label=labels[(init, pos)]))  # fmt: skip
    # rows of their own for the legends (in a panel they cover data): line styles, configurations
    skey = fig.add_subplot(gs[n_rows, :])
    skey.axis("off")
    skey.legend(handles=style, loc="center", ncol=max(1, style_cols), handlelength=2.6,
                columnspacing=1.0, frameon=False)  # fmt: skip
    key = fig.add_subplot(gs[n_rows + 1, :])
    key.axis("off")
    key.legend(handles=handles, loc="center", ncol=min(len(handles), ncol), handlelength=2.0,
               columnspacing=1.0, frameon=False)  # fmt: skip
    shown = list(dict.fromkeys(i for (i, _p), _df in groups if i in no_closed))
    if shown:
        notes.append(", ".join(shown) + ": no closed form drawn (the audit computes no scheme's closed"
                     " form; dashed: the law from the measured s_k^2)")  # fmt: skip
    if not only_mf:
        notes.append("law: a = stream multiplier, g = branch multiplier (both 1 unless the scheme sets them,"
                     " e.g. DeepNet's a, ReZero's g)")  # fmt: skip
    if _has(variance, "mf_stream_var"):
        notes.append("prediction: the large-width Gaussian recursion of the tokens' Gram matrix from the "
                     "init and the tokens alone (no forward; tinit.mf)"
                     + ("; nothing measured (--theory-only)" if only_mf else ""))  # fmt: skip
    suptitle(fig, title)
    footnote(fig, notes)
    return fig
