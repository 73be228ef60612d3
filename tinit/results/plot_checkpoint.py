"""Figures and the table of ``tinit audit --checkpoint`` (the frames of
:mod:`tinit.experiments.audit.trained`).

- :func:`plot_stream_over_steps`: v_k / v0 against addition k, one panel per run
  (scheme and placement), one curve per saved step coloured by step (viridis: dark
  early, yellow late), each with the law dashed in its colour (the cumulative law from
  that step's measured branch variances: at step 0 the init-time law, later whether
  the trained stream is still the sum the law says);
- :func:`plot_drift`: ||W - W0|| / ||W0|| against layer, one panel per run whose init
  is known (:func:`drift_runs`; none for a Hugging Face checkpoint, which does not hold
  its init: then no figure, :func:`no_drift_line` says why), one colour per role, the
  last step solid and earlier steps lighter;
- :func:`plot_spectral`: each matrix's spectral norm against layer, per run and role, at
  the first checkpoint (dashed) and the last (solid); a checkpoint with no training step
  (a Hugging Face model) is titled "as saved";
- :func:`checkpoint_table`: per checkpoint, v_2L / v0 now and at the run's first
  checkpoint, where the stream grows fastest, which roles moved most.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator
from rich.table import Table

from ..model.placements import PLACEMENTS
from .palette import ROLE_STYLES
from .style import (
    CLIP_MARKERS,
    FONT,
    FULL_WIDTH,
    NEUTRAL,
    THEORY,
    footnote,
    key_legend,
    key_rows_height,
    mark_clipped,
    near,
    new_figure_with_key,
    styled,
    suptitle,
    value_axis,
    wants_log,
)
from .tables import fmt, summary_table

#: Matrix roles drawn, in this order (norm gains and biases have no spectral norm).
MATRIX_ROLES = ("embed", "pos", "q", "k", "v", "qkv", "o", "gate", "up", "down", "head")


def _panels(n: int, row_height: float = 2.5) -> tuple[Figure, list]:
    ncol = 1 if n == 1 else 2
    nrow = math.ceil(n / ncol)
    fig = Figure(figsize=(FULL_WIDTH, row_height * nrow + 0.6), layout="constrained")
    axes = list(fig.subplots(nrow, ncol, squeeze=False).ravel())
    for ax in axes[n:]:
        ax.set_visible(False)
    for ax in axes[:n]:
        ax.tick_params(labelsize=FONT)
        ax.grid(True, which="major", alpha=0.3)
    return fig, axes[:n]


def _run_title(run: str, df: pd.DataFrame) -> str:
    first = df.iloc[0]
    if "init" in df and isinstance(first.get("init"), str):
        return f"{first['init']} / {first['norm_position']}, L={int(first['n_layers'])}\n{run}"
    return run


def _steps(df: pd.DataFrame) -> list:
    return sorted(df["step"].dropna().unique().tolist()) or [None]


#: A checkpoint without a training step (a Hugging Face model), in titles and legends.
AS_SAVED = "as saved (no training step)"


def _step_words(step) -> str:
    return AS_SAVED if step is None else f"step {int(step)}"


def _resets(df: pd.DataFrame) -> bool:
    """The run's stream is renormalised after each sum (post-norm): its v_k / v0 from k = 2
    is the normed stream over the embedding's variance."""
    pos = df["norm_position"].iloc[0] if "norm_position" in df else None
    return isinstance(pos, str) and pos in PLACEMENTS and PLACEMENTS[pos].resets


#: A post-norm stream: the additions before its first norm (k = 0, 1) carry the embedding's
#: scale, v_k / v0 ~ 1; from k = 2 the normed stream's, ~1 / v0 (2,561 for a 0.02-std embedding).
POST_KMIN = 2


@styled
def plot_stream_over_steps(variance: pd.DataFrame, title: str = "") -> Figure:
    """One panel per run: v_k / v0 against k at each saved step, measured (thick) and
    the law at that step (dashed, in the step's colour). A post-norm run's axis is its
    normed stream's (k >= 2): the points before the first norm (k = 0, 1, v_k / v0 ~ 1,
    thousands of times below) are marked by triangles at the bottom edge, as
    variance.png marks its clipped points, and a note under the figure says why."""
    runs = list(dict.fromkeys(variance["run"]))
    all_steps = sorted(variance["step"].dropna().unique().tolist())
    norm = Normalize(min(all_steps, default=0), max(max(all_steps, default=1), 1))
    cmap = colormaps["viridis"]

    def colour(step):
        return cmap(0.0) if step is None else cmap(0.9 * norm(step))

    # one key under the panels (the steps' colours are the same in every panel): a legend
    # inside a panel covered a post-norm panel's curves
    n_keys = (len(all_steps) or 1) + 2
    ncol = 1 if len(runs) == 1 else 2
    nrow = math.ceil(len(runs) / ncol)
    fig, axes, key = new_figure_with_key(ncol, 2.5, key_rows_height(n_keys, 5), nrows=nrow)
    for ax in axes[len(runs) :]:
        ax.set_visible(False)
    lifted = {}
    for ax, run in zip(axes, runs, strict=True):
        df = variance[variance["run"] == run]
        resets = _resets(df)
        series = []  # (k, measured, law, colour) per step
        for step in _steps(df):
            d = df if step is None else df[df["step"] == step]
            d = d.sort_values("k")
            v0 = float(d["stream_var"].iloc[0])
            k = d["k"].to_numpy()
            y = d["stream_var"].to_numpy(float) / v0
            law = d["pred_cumulative"].to_numpy(float) / v0
            color = colour(step)
            ax.plot(k, y, color=color, lw=2.6, alpha=0.55, zorder=2, label=_step_words(step))
            ax.plot(k, law, color=color, gid=f"theory:{run}@{step}", **THEORY)
            series.append((k, y, law, color))
            if resets and (k == POST_KMIN).any():
                lifted.setdefault(run, float(y[k == POST_KMIN][0]))
        if resets:  # the normed stream's axis; before the first norm: triangles at the edge
            measured = np.concatenate([y[k >= POST_KMIN] for k, y, _, _ in series])
            laws = np.concatenate([law[k >= POST_KMIN] for k, _, law, _ in series])
            lim = value_axis(ax, measured, include=near(measured, laws))
            for k, y, law, color in series:
                mark_clipped(ax, k, y, lim, color)
                mark_clipped(ax, k, law, lim, color)
        elif wants_log(np.concatenate([v for _, y, law, _ in series for v in (y, law)])):
            ax.set_yscale("log")
        ax.set_title(_run_title(run, df), fontsize=FONT)
        ax.set_xlabel("addition k" + (" (from k = 2: after the first norm)" if resets else ""), fontsize=FONT)
        ax.set_ylabel(r"$v_k / v_0$", fontsize=FONT)
    handles = [Line2D([], [], color=colour(st), lw=2.6, alpha=0.55, label=_step_words(st))
               for st in (all_steps or [None])]  # fmt: skip
    law_label = "law at that step" if all_steps else "law (from its branch variances)"
    handles.append(Line2D([], [], color=NEUTRAL, **THEORY, label=law_label))
    if lifted:
        handles.append(Line2D([], [], ls="none", marker=CLIP_MARKERS["low"], ms=6, color=NEUTRAL, mec="k",
                              mew=0.5, label="post-norm k = 0, 1: below the axis"))  # fmt: skip
    key_legend(key, handles, ncol=5)
    suptitle(fig, title)
    note = (
        "Solid (thick): the measured stream at each saved step; dashed, in the step's colour: the variance "
        "law at that step (the scheme's recursion from that step's measured branch variances)."
        if all_steps
        else "Solid (thick): the measured stream of the checkpoint as saved (it has no training step); "
        "dashed: the variance law from its measured branch variances."
    )
    notes = [note]
    if lifted:
        jumps = ", ".join(f"{run} x{v:,.0f}" for run, v in lifted.items())
        notes.append(
            "Post-norm: the first norm (k = 2) lifts the embedding's small variance to the normed stream's "
            f"(v_2 / v0 at the first step: {jumps}); the axis is the normed stream's, and k = 0, 1, where "
            "v_k / v0 is about 1, are triangles at its bottom edge."
        )
    footnote(fig, notes)
    return fig


def _roles(df: pd.DataFrame) -> list[str]:
    present = set(df["role"])
    return [r for r in MATRIX_ROLES if r in present]


def _per_layer(df: pd.DataFrame, col: str) -> pd.Series:
    """A role's value per layer (the mean where a layer has several tensors of it)."""
    return df.groupby("layer")[col].mean().sort_index()


def drift_runs(drift: pd.DataFrame) -> list[str]:
    """The runs whose init is known (some ``rel_change`` measured): the panels of
    :func:`plot_drift`."""
    known = drift.loc[drift["rel_change"].notna(), "run"]
    return [r for r in dict.fromkeys(drift["run"]) if r in set(known)]


def no_drift_line(drift: pd.DataFrame) -> str | None:
    """The terminal's line when :func:`plot_drift` has runs it cannot draw (no init
    known: ``rel_change`` empty), else None."""
    missing = [str(r) for r in dict.fromkeys(drift["run"]) if r not in drift_runs(drift)]
    if not missing:
        return None
    what = "no drift.png" if len(missing) == len(set(drift["run"])) else "drift.png leaves out"
    return (
        f"Drift: {what} for {', '.join(missing)}: its init is not known (a Hugging Face checkpoint "
        "does not hold it), so ||W - W0|| / ||W0|| cannot be measured (drift.csv's rel_change is empty)"
    )


@styled
def plot_drift(drift: pd.DataFrame, title: str = "") -> Figure:
    """One panel per run of :func:`drift_runs` (at least one: the caller draws no
    figure when no run's init is known)."""
    runs = drift_runs(drift)
    if not runs:
        raise ValueError("no run with a known init: nothing to draw (see no_drift_line)")
    fig, axes = _panels(len(runs))
    handles = {}
    for ax, run in zip(axes, runs, strict=True):
        df = drift[(drift["run"] == run) & drift["shape"].astype(str).str.contains("x")]
        steps = [s for s in _steps(df) if s is not None and s != 0] or _steps(df)
        for role in _roles(df):
            color, marker = ROLE_STYLES.get(role, ROLE_STYLES["unknown"])
            for i, step in enumerate(steps):
                d = df[(df["role"] == role) & ((df["step"] == step) if step is not None else True)]
                s = _per_layer(d, "rel_change").dropna()
                last = i == len(steps) - 1
                alpha = 1.0 if last else 0.25 + 0.5 * i / max(len(steps) - 1, 1)
                ax.plot(s.index, s.values, color=color, alpha=alpha, lw=1.5 if last else 0.9,
                        marker=marker if last else None, ms=3)  # fmt: skip
            handles[role] = Line2D([], [], color=color, marker=marker, ms=3, label=role)
        where = (f"steps {', '.join(str(int(s)) for s in steps)} (the last solid, earlier lighter)"
                 if len(steps) > 1 else _step_words(steps[0]))  # fmt: skip
        ax.set_title(f"{run}\n{where}", fontsize=FONT)
        ax.set_xlabel("layer (-1: embedding side, L: head)", fontsize=FONT)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(r"$\|W - W_0\| / \|W_0\|$", fontsize=FONT)
    fig.legend(handles=list(handles.values()), loc="outside lower center", ncol=min(len(handles), 8),
               fontsize=FONT, frameon=False)  # fmt: skip
    suptitle(fig, title)
    return fig


@styled
def plot_spectral(drift: pd.DataFrame, title: str = "") -> Figure:
    runs = list(dict.fromkeys(drift["run"]))
    fig, axes = _panels(len(runs))
    handles = {}
    for ax, run in zip(axes, runs, strict=True):
        df = drift[(drift["run"] == run) & drift["spectral_norm"].notna()]
        steps = _steps(df)
        ends = [steps[0], steps[-1]] if len(steps) > 1 else steps
        for role in _roles(df):
            color, marker = ROLE_STYLES.get(role, ROLE_STYLES["unknown"])
            for step in ends:
                d = df[(df["role"] == role) & ((df["step"] == step) if step is not None else True)]
                s = _per_layer(d, "spectral_norm")
                last = step == ends[-1]
                ls, lw = ("-", 1.4) if last else ((0, (4, 2)), 1.0)
                mark = marker if last or len(s) == 1 else None  # a lone point (embed) needs one
                ax.plot(s.index, s.values, color=color, ls=ls, lw=lw, marker=mark, ms=3,
                        mfc=color if last else "none")  # fmt: skip
            handles[role] = Line2D([], [], color=color, marker=marker, ms=3, label=role)
        where = (f"step {int(ends[0])} dashed, {int(ends[-1])} solid" if len(ends) > 1
                 else _step_words(ends[0]))  # fmt: skip
        ax.set_title(f"{run}\n{where}", fontsize=FONT)
        ax.set_xlabel("layer (-1: embedding side, L: head)", fontsize=FONT)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("spectral norm", fontsize=FONT)
        if wants_log(df["spectral_norm"].to_numpy(float)):
            ax.set_yscale("log")
    fig.legend(handles=list(handles.values()), loc="outside lower center", ncol=min(len(handles), 8),
               fontsize=FONT, frameon=False)  # fmt: skip
    suptitle(fig, title)
    return fig


def checkpoint_table(table: pd.DataFrame, title: str = "Checkpoints") -> Table:
    """One row per checkpoint: v_2L / v0 now and at the run's first checkpoint, the
    addition where v_k / v_(k-1) is largest, the roles whose mean rel_change is largest."""
    caption = (
        "v_2L/v0 at this step and at the run's first checkpoint; fastest: the addition k with the "
        "largest v_k/v_(k-1); moved most: largest mean ||W-W0||/||W0|| by role"
    )
    t = summary_table(title, caption)
    for col in ("run", "step", "v_2L/v0", "at first", "fastest k", "x", "moved most", "rel"):
        t.add_column(col, justify="left" if col in ("run", "moved most") else "right")
    for _, r in table.iterrows():
        step = "" if pd.isna(r["step"]) else str(int(r["step"]))
        first = "" if pd.isna(r["first_step"]) else f" (@{int(r['first_step'])})"
        k = "" if pd.isna(r["fastest_k"]) else str(int(r["fastest_k"]))
        # (no init known, an HF model: not "none", which says nothing moved)
        known = r.get("init_source") != "none" and isinstance(r["moved_most"], str)
        moved = str(r["moved_most"]) if known else "-"
        t.add_row(str(r["run"]), step, fmt(r["v_final_rel"]), fmt(r["v_final_rel_first"]) + first, k,
                  fmt(r["fastest_growth"], 3), moved, fmt(r["moved_most_rel_change"], 3))  # fmt: skip
    return t
