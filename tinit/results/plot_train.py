"""Figures of training runs: loss curves with the entropy floor, variance during
training, final loss against depth, the lr sweep with its optima, and the claims'
final losses (their tables and claims.md: :mod:`tinit.results.report_train`)."""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import ScalarFormatter

from .palette import config_label, config_style, shades
from .report_train import config_name, fixed_settings, varying_columns
from .style import (
    FONT,
    LINESTYLES,
    NEUTRAL,
    coincidence_note,
    coincidences,
    footnote,
    integer_axis,
    key_legend,
    key_rows_height,
    nested_marker_size,
    new_figure_with_key,
    styled,
    suptitle,
    wants_log,
)


def _floor(ax, floor: float | None, vertical: bool = False) -> None:
    if floor is not None and math.isfinite(floor):
        line = ax.axvline if vertical else ax.axhline
        line(floor, color="k", ls="--", lw=1.2, label=f"entropy floor H = {floor:.3f} nats")


def _setting_keys(df: pd.DataFrame) -> list[str]:
    """The varying columns other than scheme and placement: what line styles tell apart."""
    return [c for c in varying_columns(df) if c not in ("init", "norm_position")]


def _styles(df: pd.DataFrame, keys: list[str]) -> dict:
    """(colour, marker) of each (init, norm_position) from the one grammar
    (:func:`config_style`: naive/pre red circles, ...) and a line style per combination
    of the other varying settings, the same in every training figure of a run."""
    configs = list(dict.fromkeys(zip(df["init"].astype(str), df["norm_position"].astype(str), strict=True)))
    combos = list(dict.fromkeys(tuple(r) for r in df[keys].itertuples(index=False))) if keys else [()]
    return {
        "config": {c: config_style(*c) for c in configs},
        "ls": {c: LINESTYLES[j % len(LINESTYLES)] for j, c in enumerate(combos)},
    }


def _style_of(styles: dict, row, keys: list[str]) -> dict:
    st = styles["config"][(str(row["init"]), str(row["norm_position"]))]
    ls = styles["ls"][tuple(row[k] for k in keys)] if keys else "-"
    return {"color": st["color"], "marker": st["marker"], "ls": ls}


def _note_name(row, keys: list[str]) -> str:
    """A configuration in a note's comma list: "naive/post L=24 lr=0.015" (no commas inside)."""
    rest = [k for k in keys if k not in ("init", "norm_position")]
    return f"{row['init']}/{row['norm_position']}" + "".join(f" {config_name(row, [k])}" for k in rest)


def _title(df: pd.DataFrame, title: str) -> str:
    fixed = fixed_settings(df)
    return ", ".join(t for t in (fixed, title) if t)


def _figure(n_handles: int, ncols: int = 1, nrows: int = 1, row_height: float = 3.2, ncol: int = 3):
    """Panels and, under them, the legend's rows for ``n_handles`` entries in ``ncol``
    columns (a legend in a panel covers the curves of deep runs that stall)."""
    return new_figure_with_key(ncols, row_height, key_rows_height(n_handles, ncol), nrows=nrows)


def _legend_rows(key, handles: list, ncol: int = 3) -> None:
    """The one legend, in the key row; handles long enough to tell the settings' line styles apart."""
    key_legend(key, handles, ncol, handlelength=2.6)


def _config_handles(df: pd.DataFrame, styles: dict, keys: list[str]) -> list:
    """Legend entries: each configuration (colour and marker), then each setting (line
    style, grey) when settings vary."""
    out = []
    for (init, pos), st in styles["config"].items():
        out.append(Line2D([], [], color=st["color"], marker=st["marker"], mfc="none", lw=1.6,
                          label=config_label(init, pos)))  # fmt: skip
    if keys:
        for combo, ls in styles["ls"].items():
            row = dict(zip(keys, combo, strict=True))
            out.append(Line2D([], [], color=NEUTRAL, ls=ls, lw=1.6, label=config_name(row, keys)))
    return out


def _stalled_note(groups: list, ax, what: str = "held-out loss") -> list[str]:
    """Seeds of one configuration drawn on top of each other on ``ax`` (e.g. two that
    stall at the same loss): named, with where they end, since only one line shows."""
    notes = []
    for label, seeds in groups:
        series = {f"seed {sd}": np.asarray(v, dtype=np.float64) for sd, v in seeds.items()}
        for same in coincidences(series, ax):
            ends = [series[n][np.isfinite(series[n])] for n in same]
            end = ", ".join(f"{e[-1]:.3g}" for e in ends if e.size)
            notes.append(f"{label}: {', '.join(same[:-1])} and {same[-1]} lie on top of each other "
                         f"({what} ending at {end})")  # fmt: skip
    return notes


@styled
def plot_loss_curves(train: pd.DataFrame, floor: float | None, title: str = "") -> Figure:
    """Held-out loss (markers, solid) and training loss (thin) against step: each
    configuration in its colour and marker (the one grammar), the other varying settings
    (depth, lr, warmup, ...) by line style, one line per seed; a cross where a run
    diverged. With an entropy floor H, a second panel shows the held-out loss above it,
    loss - H, on a log scale, where configurations that end close together stay apart.
    Seeds drawn on top of each other are named under the figure."""
    gap = floor is not None and math.isfinite(floor)
    keys = varying_columns(train)
    setting = _setting_keys(train)
    styles = _styles(train, setting)
    n_handles = len(styles["config"]) + (len(styles["ls"]) if setting else 0) + 4
    fig, axes, key = _figure(n_handles, ncols=2 if gap else 1, row_height=3.2)
    ax = axes[0]
    groups = list(train.groupby(keys, sort=False)) if keys else [((), train)]
    seeds_of = []
    for _, g in groups:
        st = _style_of(styles, g.iloc[0], setting)
        seeds = {}
        for sd, s in g.groupby("seed", sort=True):
            tr = s[s["step"] > 0]
            ax.plot(tr["step"], tr["train_loss"], color=st["color"], ls=st["ls"], lw=0.6, alpha=0.35)
            ev = s[np.isfinite(s["eval_loss"])]
            line = {"color": st["color"], "ls": st["ls"], "lw": 1.6, "marker": st["marker"], "mfc": "none",
                    "ms": 4}  # fmt: skip
            ax.plot(ev["step"], ev["eval_loss"], **line)
            if gap:
                above = ev["eval_loss"] - floor
                axes[1].plot(ev["step"][above > 0], above[above > 0], **line)
            bad = s[s["status"] == "diverged"]
            if len(bad):
                y = bad["train_loss"].where(np.isfinite(bad["train_loss"]), ev["eval_loss"].max())
                ax.plot(bad["step"], y, color=st["color"], marker="x", ms=9, mew=2, ls="none")
            seeds[sd] = ev.set_index("step")["eval_loss"]
        aligned = pd.DataFrame(seeds)  # seeds that stopped early are NaN after their last evaluation
        seeds_of.append((_note_name(g.iloc[0], keys), {c: aligned[c] for c in aligned}))
    _floor(ax, floor)
    finite = train[["train_loss", "eval_loss"]].to_numpy(float)
    finite = finite[np.isfinite(finite)]
    if finite.size and gap:
        ax.set_ylim(bottom=min(floor, finite.min()) * 0.9)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy loss (nats)")
    ax.set_title("Loss curves")
    handles = _config_handles(train, styles, setting)
    handles += [h for h in ax.get_legend_handles_labels()[0] if h.get_label().startswith("entropy")]
    handles += [
        Line2D([], [], color=NEUTRAL, lw=1.6, marker="o", mfc="none", ms=4, label="held-out loss (per seed)"),
        Line2D([], [], color=NEUTRAL, lw=0.6, alpha=0.5, label="training loss (per seed)"),
    ]
    if (train["status"] == "diverged").any():  # no legend entry for a mark not drawn
        handles.append(Line2D([], [], color=NEUTRAL, marker="x", ms=8, mew=2, ls="none",
                              label="diverged (run stopped)"))  # fmt: skip
    _legend_rows(key, handles)
    if gap:
        bx = axes[1]
        bx.set_yscale("log")
        bx.set_xlabel("optimizer step")
        bx.set_ylabel("held-out loss - H (nats)")
        bx.set_title("Loss above H (log)")
        bx.grid(True, which="both", alpha=0.3)
    # configurations on top of each other (their first seeds), then seeds of one configuration
    firsts = {label: next(iter(seeds.values())).to_numpy() for label, seeds in seeds_of if seeds}
    notes = [coincidence_note(coincidences(firsts, ax), "held-out loss")] if len(firsts) > 1 else []
    suptitle(fig, _title(train, title))
    footnote(fig, notes + _stalled_note(seeds_of, ax))
    return fig


@styled
def plot_variance_during_training(variance: pd.DataFrame, title: str = "", max_panels: int = 9) -> Figure:
    """Residual-stream variance v_k against the addition k at each probed step, one panel
    per configuration (first seed; at most ``max_panels``), so v_2L can be followed
    through training. Each panel in its configuration's colour and marker, the steps as
    its shades (light: early, dark: late); the panel titles name what varies, the
    figure title what does not; one legend under the panels."""
    keys = [c for c in varying_columns(variance) if c != "seed"]
    groups = list(variance.groupby(keys, sort=False)) if keys else [((), variance)]
    shown = groups[:max_panels]
    ncols = min(3, len(shown))
    nrows = math.ceil(len(shown) / ncols)
    steps = sorted(variance["step"].unique())
    drawn = pd.concat([g for _, g in shown])  # the legend names only what the panels show
    styles = _styles(drawn, [])
    fig, axes, key = _figure(len(steps) + len(styles["config"]), ncols, nrows, row_height=2.3, ncol=4)
    for j, (ax, (_, g)) in enumerate(zip(axes, shown, strict=False)):
        g = g[g["seed"] == g["seed"].min()]
        st = _style_of(styles, g.iloc[0], [])
        shades_ = shades(st["color"], len(steps))
        for i, step in enumerate(steps):
            d = g[g["step"] == step].sort_values("k")
            ax.plot(d["k"], d["stream_var"], color=shades_[i], marker=st["marker"], mfc="none", ms=3, lw=1.3)
        if wants_log(g["stream_var"]):
            ax.set_yscale("log")
        else:  # 4.1e-4 as 4.1 x10^-4: narrow panels keep narrow tick labels
            fmt = ScalarFormatter(useMathText=True)
            fmt.set_powerlimits((-2, 3))
            ax.yaxis.set_major_formatter(fmt)
        ax.set_title(textwrap.fill(config_name(g.iloc[0], keys), 30) if keys else "", fontsize=FONT)
        ax.set_xlabel("addition k (0: embedding)")  # every panel: its depth sets its own k
        if j % ncols == 0:
            ax.set_ylabel("$v_k$ (post-norm: before the norm)")
        integer_axis(ax, g["k"].unique(), "x", nbins=4)
    for ax in axes[len(shown) :]:
        ax.set_visible(False)
    handles = [Line2D([], [], color=NEUTRAL, marker="o", mfc="none", lw=1.3, alpha=a, label=f"step {step}")
               for a, step in zip(np.linspace(0.35, 1.0, len(steps)), steps, strict=True)]  # fmt: skip
    handles += _config_handles(drawn, styles, [])
    _legend_rows(key, handles, ncol=4)
    notes = [f"steps as shades of each configuration's colour, light (step {steps[0]}) to dark "
             f"(step {steps[-1]}); first seed"]  # fmt: skip
    if len(groups) > max_panels:
        notes.append(f"{len(groups) - max_panels} more configurations in variance_during_training.csv")
    suptitle(fig, _title(variance, title))
    footnote(fig, notes)
    return fig


@styled
def plot_final_vs_depth(summary: pd.DataFrame, floor: float | None, title: str = "") -> Figure:
    """Final held-out loss (mean +- standard error over seeds) against depth: each
    configuration in its colour and marker (the one grammar, as in loss_curves.png), the
    other varying settings by line style; configurations where every seed diverged are
    listed in the legend."""
    keys = [c for c in varying_columns(summary) if c != "n_layers"]
    setting = [c for c in _setting_keys(summary) if c != "n_layers"]
    styles = _styles(summary, setting)
    n_handles = len(styles["config"]) + (len(styles["ls"]) if setting else 0) + 1
    fig, (ax,), key = _figure(n_handles, row_height=3.4)
    groups = list(summary.groupby(keys, sort=False)) if keys else [((), summary)]
    notes, series = [], {}
    for _, g in groups:
        g = g.sort_values("n_layers")
        st = _style_of(styles, g.iloc[0], setting)
        name = _note_name(g.iloc[0], keys)
        div = int(g["diverged"].sum())
        if div:
            notes.append(f"{name}: {div} diverged seed(s), left out of the mean")
        ax.errorbar(g["n_layers"], g["final_eval_loss_mean"], yerr=g["final_eval_loss_se"].fillna(0),
                    color=st["color"], marker=st["marker"], mfc="none", ls=st["ls"], capsize=3, lw=1.5,
                    ms=nested_marker_size(len(series) % 4))  # fmt: skip
        series[name] = g["final_eval_loss_mean"].to_numpy()
    _floor(ax, floor)
    depths = sorted(summary["n_layers"].unique())
    if len(depths) > 1:
        ax.set_xscale("log", base=2)
        # the depths set the x range even when no point has a mean (every seed diverged)
        ax.set_xlim(depths[0] / 1.25, depths[-1] * 1.25)
    integer_axis(ax, depths, "x")
    if not np.isfinite(summary["final_eval_loss_mean"].to_numpy(float)).any():
        ax.text(
            0.5,
            0.75,
            "every run diverged: no final loss to draw",
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=9,
            bbox={"facecolor": "white", "edgecolor": "0.6"},
        )
    ax.set_xlabel("layers L")
    ax.set_ylabel("final held-out loss (nats),\nmean ± SE over seeds")
    ax.set_title("Final loss against depth")
    handles = _config_handles(summary, styles, setting)
    handles += [h for h in ax.get_legend_handles_labels()[0] if h.get_label().startswith("entropy")]
    _legend_rows(key, handles)
    notes.append(coincidence_note(coincidences(series, ax), "final loss"))
    suptitle(fig, _title(summary, title))
    footnote(fig, notes)
    return fig


@styled
def plot_lr_sweep(
    summary: pd.DataFrame, optima: pd.DataFrame, drift: pd.DataFrame, floor: float | None, title: str = ""
) -> Figure:
    """Final loss against log2 peak lr, one curve per depth and width (panels per scheme,
    norm position and warmup, each in its configuration's colour and marker; depths and
    widths by line style), the optimum starred; the fitted drifts of log2 lr* with log2 L
    and log2 d in the panel title (lr_transfer.png draws them)."""
    panels = list(summary.groupby(["init", "norm_position", "warmup"], sort=False))
    widths = "d_model" in summary.columns and summary["d_model"].nunique() > 1
    shapes = sorted(set(zip(summary["n_layers"], summary["d_model"], strict=True)))

    def name(L, d) -> str:
        return f"L={L}, d={d}" if widths else f"L={L}"

    fig, axes, key = _figure(len(shapes) + 3, ncols=len(panels), row_height=3.0, ncol=4)
    ls_of = {s: LINESTYLES[i % len(LINESTYLES)] for i, s in enumerate(shapes)}
    notes = []
    for ax, ((init, pos, w), g) in zip(axes, panels, strict=True):
        st = config_style(str(init), str(pos))
        series = {}
        for i, (L, dm) in enumerate(shapes):
            d = g[(g["n_layers"] == L) & (g["d_model"] == dm)].sort_values("peak_lr")
            if not len(d):
                continue
            series[name(L, dm)] = d["final_eval_loss_mean"].to_numpy()
            se = d["final_eval_loss_se"].fillna(0)
            ax.errorbar(np.log2(d["peak_lr"]), d["final_eval_loss_mean"], yerr=se, color=st["color"],
                        marker=st["marker"], mfc="none", ls=ls_of[(L, dm)], ms=nested_marker_size(i % 4),
                        capsize=2, label=name(L, dm))  # fmt: skip
            for _, r in d[d["diverged"] == d["seeds"]].iterrows():
                ax.axvline(np.log2(r["peak_lr"]), color=st["color"], ls=":", lw=1)
            o = optima[(optima["init"] == init) & (optima["norm_position"] == pos) & (optima["n_layers"] == L)
                       & (optima["warmup"] == w)]  # fmt: skip
            if "d_model" in optima.columns:
                o = o[o["d_model"] == dm]
            if len(o) and np.isfinite(o["best_loss"].iloc[0]):
                ax.plot(o["log2_lr_opt"], o["best_loss"], marker="*", ms=13, color=st["color"], mec="k",
                        ls="none")  # fmt: skip
        _floor(ax, floor)
        fit = drift[(drift["init"] == init) & (drift["norm_position"] == pos) & (drift["warmup"] == w)]
        sub = ""
        for _, r in fit.head(2).iterrows():
            if not np.isfinite(r["slope"]):
                continue
            axis = "axis" in r.index and r["axis"] == "width"
            held = f" (L={int(r['n_layers'])})" if axis else (f" (d={int(r['d_model'])})" if widths else "")
            s = round(float(r["slope"]), 2) + 0.0  # never "-0.00"
            sub += (f"\nd log2 lr* / d log2 {'d' if axis else 'L'}{held} = {s:+.2f}"
                    + (f" ± {r['slope_se']:.2f}" if np.isfinite(r["slope_se"]) else ""))  # fmt: skip
        if len(fit) > 2:
            sub += "\n(more in lr_drift.csv, lr_transfer.png)"
        ax.set_title(f"{config_label(str(init), str(pos))}, warmup {w}{sub}", fontsize=FONT)
        ax.set_xlabel("log2 peak learning rate")
        ax.set_ylabel("final held-out loss (nats)")
        notes.append(coincidence_note(coincidences(series, ax), f"{config_label(str(init), str(pos))}, "
                                      f"warmup {w}"))  # fmt: skip
    handles = [Line2D([], [], color=NEUTRAL, ls=ls_of[s], marker="o", mfc="none", label=name(*s))
               for s in shapes]  # fmt: skip
    handles.append(Line2D([], [], color=NEUTRAL, marker="*", ms=11, mec="k", ls="none", label="optimum lr*"))
    if (summary["diverged"] == summary["seeds"]).any():
        handles.append(Line2D([], [], color=NEUTRAL, ls=":", label="every seed diverged at this lr"))
    handles += [h for h in axes[0].get_legend_handles_labels()[0] if h.get_label().startswith("entropy")]
    _legend_rows(key, handles, ncol=4)
    shown = ["n_layers", "peak_lr", *(["d_model", "d_ff"] if widths else [])]
    suptitle(fig, _title(summary.drop(columns=shown), title))
    footnote(fig, notes)
    return fig


@styled
def plot_claims(runs: pd.DataFrame, floor: float | None, title: str = "") -> Figure:
    """Final held-out loss of every claim configuration: one open marker per seed in the
    configuration's colour and marker (a diverged seed as a black cross at its initial
    loss), the mean as a vertical tick; seeds on top of each other are named. A dot plot,
    not bars: bars would have to start at 0 nats, where differences of a few hundredths
    between losses near the entropy floor cannot be seen; the axis spans the data."""
    names = list(dict.fromkeys(runs["configuration"]))
    n_configs = len(set(zip(runs["init"], runs["norm_position"], strict=True)))
    fig, (ax,), key = _figure(n_configs + 3, row_height=0.4 * len(names) + 1.0, ncol=2)
    notes = []
    for i, n in enumerate(names):
        g = runs[runs["configuration"] == n]
        st = config_style(str(g["init"].iloc[0]), str(g["norm_position"].iloc[0]))
        div = g["diverged"].astype(bool).to_numpy()
        score = np.where(div, g["initial_eval_loss"], g["final_eval_loss"]).astype(float)
        ax.plot([score.mean()], [i], ls="none", marker="|", color=st["color"], ms=16, mew=2.5, alpha=0.6)
        ax.plot(score[~div], np.full((~div).sum(), i), ls="none", marker=st["marker"], mfc="none",
                color=st["color"], ms=6, mew=1.3)  # fmt: skip
        ax.plot(score[div], np.full(div.sum(), i), "x", color="k", ms=8, mew=2)
    _floor(ax, floor, vertical=True)
    lo, hi = ax.get_xlim()
    for n in names:  # seeds closer than about a marker's width: one marker shows, so say so
        g = runs[runs["configuration"] == n]
        ok = g[~g["diverged"].astype(bool)].sort_values("final_eval_loss")
        x = ok["final_eval_loss"].to_numpy(dtype=float)
        close = np.flatnonzero(np.diff(x) < 0.012 * (hi - lo))
        if close.size:
            seeds = sorted({int(ok["seed"].iloc[j]) for c in close for j in (c, c + 1)})
            notes.append(f"{n}: seeds {', '.join(map(str, seeds))} overlap near {x[close[0]]:.3g} nats")
    ax.set_yticks(range(len(names)), names, fontsize=FONT)
    ax.set_xlabel("final held-out loss (nats); tick: mean over seeds")
    pairs = zip(runs["init"].astype(str), runs["norm_position"].astype(str), strict=True)
    handles = []
    for i, p in dict.fromkeys(pairs):
        st = config_style(i, p)
        handles.append(Line2D([], [], color=st["color"], marker=st["marker"], mfc="none", ls="none",
                              label=f"{config_label(i, p)}: a seed"))  # fmt: skip
    if runs["diverged"].astype(bool).any():  # no legend entry for a mark not drawn
        handles.append(Line2D([], [], color="k", marker="x", mew=2, ls="none",
                              label="diverged seed (initial loss)"))  # fmt: skip
    handles.append(Line2D([], [], color="0.35", marker="|", ms=12, mew=2.5, ls="none",
                          label="mean over seeds"))  # fmt: skip
    handles += [h for h in ax.get_legend_handles_labels()[0] if h.get_label().startswith("entropy")]
    _legend_rows(key, handles, ncol=2)
    ax.set_ylim(len(names) - 0.5, -0.5)  # the configurations top to bottom, as listed
    ax.set_title("Final loss per claim configuration")
    ax.grid(True, axis="x", alpha=0.3)
    suptitle(fig, title)
    footnote(fig, notes)
    return fig
