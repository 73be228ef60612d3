"""Figures and tables of training runs: loss curves with the entropy floor, final
loss against depth, the lr sweep with its optima, and the claims' verdicts."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from rich.table import Table

from .plots import new_figure, wants_log
from .style import config_style
from .tables import fmt, summary_table

#: Columns that, with the seed, name a configuration of a training grid.
CONFIG_KEYS = [
    "init",
    "norm_position",
    "norm",
    "ffn",
    "tied",
    "n_layers",
    "d_model",
    "d_ff",
    "peak_lr",
    "warmup",
]


def config_name(row, varying: list[str]) -> str:
    """A short label of a configuration from the columns that vary in the run."""
    parts = []
    for c in varying:
        v = row[c]
        if c == "init":
            parts.append(f"{v}")
        elif c == "norm_position":
            parts.append(f"{v}-norm")
        elif c == "n_layers":
            parts.append(f"L={v}")
        elif c == "peak_lr":
            parts.append(f"lr={v:g}")
        elif c == "warmup":
            parts.append(f"warmup={v}")
        elif c == "tied":
            parts.append("tied" if v else "untied")
        elif c in ("d_ff", "d_model"):
            parts.append(f"{c}={v}")
        else:
            parts.append(f"{v}")
    return ", ".join(parts) or "run"


def varying_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in CONFIG_KEYS if c in df and df[c].nunique(dropna=False) > 1]


def _floor(ax, floor: float | None, vertical: bool = False) -> None:
    if floor is not None and math.isfinite(floor):
        line = ax.axvline if vertical else ax.axhline
        line(floor, color="k", ls="--", lw=1.2, label=f"entropy floor H = {floor:.3f} nats")


def _color(row, keys, i: int):
    """The configuration's colour of every tinit figure (naive/pre red, scaled/pre blue,
    ...) when the groups differ only by scheme and placement; else the i-th of tab10."""
    if keys and set(keys) <= {"init", "norm_position"}:
        return config_style(str(row["init"]), str(row["norm_position"]), i)["color"]
    return f"C{i % 10}"


def plot_loss_curves(train: pd.DataFrame, floor: float | None, title: str = "") -> Figure:
    """Held-out loss (markers, solid) and training loss (thin) against step, one colour
    per configuration, one line per seed; a cross where a run diverged. With an entropy
    floor H, a second panel shows the held-out loss above it, loss - H, on a log scale,
    where configurations that end close together stay apart."""
    gap = floor is not None and math.isfinite(floor)
    fig, axes = new_figure(ncols=2 if gap else 1, row_height=3.6)
    ax = axes[0]
    keys = varying_columns(train)
    groups = list(train.groupby(keys, sort=False)) if keys else [((), train)]
    for i, (_, g) in enumerate(groups):
        c = _color(g.iloc[0], keys, i)
        label = config_name(g.iloc[0], keys)
        for j, (_, s) in enumerate(g.groupby("seed", sort=True)):
            tr = s[s["step"] > 0]
            ax.plot(tr["step"], tr["train_loss"], color=c, lw=0.6, alpha=0.35)
            ev = s[np.isfinite(s["eval_loss"])]
            lab = label if j == 0 else None
            ax.plot(ev["step"], ev["eval_loss"], color=c, lw=1.6, marker="o", ms=3, label=lab)
            if gap:
                above = ev["eval_loss"] - floor
                axes[1].plot(ev["step"][above > 0], above[above > 0], color=c, lw=1.6, marker="o", ms=3)
            bad = s[s["status"] == "diverged"]
            if len(bad):
                y = bad["train_loss"].where(np.isfinite(bad["train_loss"]), ev["eval_loss"].max())
                ax.plot(bad["step"], y, color=c, marker="x", ms=9, mew=2, ls="none")
    _floor(ax, floor)
    finite = train[["train_loss", "eval_loss"]].to_numpy(float)
    finite = finite[np.isfinite(finite)]
    if finite.size and gap:
        ax.set_ylim(bottom=min(floor, finite.min()) * 0.9)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy loss (nats)")
    ax.set_title("Loss curves")
    handles, _ = ax.get_legend_handles_labels()
    handles += [
        Line2D([], [], color="0.4", lw=1.6, marker="o", ms=3, label="held-out loss (per seed)"),
        Line2D([], [], color="0.4", lw=0.6, alpha=0.5, label="training loss (per seed)"),
        Line2D([], [], color="0.4", marker="x", ms=8, mew=2, ls="none", label="diverged (run stopped)"),
    ]
    # below the panels: deep runs that stall sit where an in-panel legend would go
    fig.legend(handles=handles, fontsize=7, loc="outside lower center", ncols=3)
    ax.grid(True, alpha=0.3)
    if gap:
        bx = axes[1]
        bx.set_yscale("log")
        bx.set_xlabel("optimizer step")
        bx.set_ylabel("held-out loss - H (nats)")
        bx.set_title("Distance to the entropy floor (log scale)")
        bx.grid(True, which="both", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def viridis(x: float):
    return colormaps["viridis"](x)


def plot_variance_during_training(variance: pd.DataFrame, title: str = "", max_panels: int = 9) -> Figure:
    """Residual-stream variance v_k against the addition k at each probed step, one panel
    per configuration (first seed; at most ``max_panels``), so v_2L can be followed
    through training."""
    keys = [c for c in varying_columns(variance) if c != "seed"]
    groups = list(variance.groupby(keys, sort=False)) if keys else [((), variance)]
    groups = groups[:max_panels]
    ncols = min(3, len(groups))
    nrows = math.ceil(len(groups) / ncols)
    fig, axes = new_figure(ncols=ncols, nrows=nrows, row_height=2.9)
    steps = sorted(variance["step"].unique())
    for ax, (_, g) in zip(axes, groups, strict=False):
        g = g[g["seed"] == g["seed"].min()]
        for i, step in enumerate(steps):
            d = g[g["step"] == step].sort_values("k")
            color = viridis(0.9 * i / max(len(steps) - 1, 1))
            ax.plot(d["k"], d["stream_var"], color=color, marker="o", ms=2.5,
                    label=f"step {step}")  # fmt: skip
        if wants_log(g["stream_var"]):
            ax.set_yscale("log")
        ax.set_title(textwrap.fill(config_name(g.iloc[0], keys), 48), fontsize=8)
        ax.set_xlabel("residual addition k (0 = embedding)")
        ax.set_ylabel("stream variance $v_k$ (post-norm: before the norm)", fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[len(groups) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_final_vs_depth(summary: pd.DataFrame, floor: float | None, title: str = "") -> Figure:
    """Final held-out loss (mean +- standard error over seeds) against depth, one line
    per configuration; configurations where every seed diverged are listed in the legend."""
    fig, (ax,) = new_figure(row_height=4.2)
    keys = [c for c in varying_columns(summary) if c != "n_layers"]
    groups = list(summary.groupby(keys, sort=False)) if keys else [((), summary)]
    for i, (_, g) in enumerate(groups):
        g = g.sort_values("n_layers")
        label = config_name(g.iloc[0], keys)
        div = int(g["diverged"].sum())
        if div:
            label += f" ({div} diverged)"
        ax.errorbar(
            g["n_layers"],
            g["final_eval_loss_mean"],
            yerr=g["final_eval_loss_se"].fillna(0),
            color=f"C{i % 10}",
            marker="os^vD"[i % 5],
            capsize=3,
            lw=1.5,
            label=label,
        )
    _floor(ax, floor)
    ax.set_xscale("log", base=2)
    depths = sorted(summary["n_layers"].unique())
    # the depths set the x range even when no point has a mean (every seed diverged)
    ax.set_xlim(depths[0] / 1.25, depths[-1] * 1.25)
    ax.set_xticks(depths, [str(v) for v in depths])
    if not np.isfinite(summary["final_eval_loss_mean"].to_numpy(float)).any():
        ax.text(0.5, 0.75, "every run diverged: no final loss to draw", transform=ax.transAxes,
                ha="center", va="center", fontsize=9, bbox={"facecolor": "white", "edgecolor": "0.6"})
    ax.set_xlabel("layers L")
    ax.set_ylabel("final held-out loss (nats), mean ± SE over seeds")
    ax.set_title(title or "Final loss against depth")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    return fig


def plot_lr_sweep(
    summary: pd.DataFrame, optima: pd.DataFrame, drift: pd.DataFrame, floor: float | None, title: str = ""
) -> Figure:
    """Final loss against log2 peak lr, one curve per depth (panels per scheme and norm
    position), the optimum starred; the fitted drift of log2 lr* with log2 L in the panel title."""
    panels = list(summary.groupby(["init", "norm_position", "warmup"], sort=False))
    fig, axes = new_figure(ncols=len(panels), row_height=3.4)
    depths = sorted(summary["n_layers"].unique())
    for ax, ((init, pos, w), g) in zip(axes, panels, strict=True):
        for i, L in enumerate(depths):
            d = g[g["n_layers"] == L].sort_values("peak_lr")
            c = f"C{i % 10}"
            ax.errorbar(
                np.log2(d["peak_lr"]),
                d["final_eval_loss_mean"],
                yerr=d["final_eval_loss_se"].fillna(0),
                color=c,
                marker="o",
                ms=4,
                capsize=2,
                label=f"L={L}",
            )
            for _, r in d[d["diverged"] == d["seeds"]].iterrows():
                ax.axvline(np.log2(r["peak_lr"]), color=c, ls=":", lw=1)
            o = optima[
                (optima["init"] == init)
                & (optima["norm_position"] == pos)
                & (optima["n_layers"] == L)
                & (optima["warmup"] == w)
            ]
            if len(o) and np.isfinite(o["best_loss"].iloc[0]):
                ax.plot(o["log2_lr_opt"], o["best_loss"], marker="*", ms=15, color=c, mec="k", ls="none")
        _floor(ax, floor)
        fit = drift[(drift["init"] == init) & (drift["norm_position"] == pos) & (drift["warmup"] == w)]
        sub = ""
        if len(fit) and np.isfinite(fit["slope"].iloc[0]):
            s, se = fit["slope"].iloc[0], fit["slope_se"].iloc[0]
            s = round(float(s), 2) + 0.0  # never "-0.00"
            sub = f"\nd log2 lr* / d log2 L = {s:+.2f}" + (f" ± {se:.2f}" if np.isfinite(se) else "")
        ax.set_title(f"{init}, {pos}-norm, warmup {w}{sub}", fontsize=9)
        ax.set_xlabel("log2 peak learning rate")
        ax.set_ylabel("final held-out loss (nats)")
        ax.grid(True, alpha=0.3)
        handles, _ = ax.get_legend_handles_labels()
        star = Line2D([], [], color="0.3", marker="*", ms=12, mec="k", ls="none", label="optimum lr*")
        handles.append(star)
        if (g["diverged"] == g["seeds"]).any():
            handles.append(Line2D([], [], color="0.3", ls=":", label="every seed diverged at this lr"))
        ax.legend(handles=handles, fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_claims(runs: pd.DataFrame, floor: float | None, title: str = "") -> Figure:
    """Final held-out loss of every claim configuration: one dot per seed (a diverged
    seed as a cross at its initial loss), the mean as a bar."""
    names = list(dict.fromkeys(runs["configuration"]))
    fig, (ax,) = new_figure(row_height=0.45 * len(names) + 1.6)
    for i, n in enumerate(names):
        g = runs[runs["configuration"] == n]
        div = g["diverged"].astype(bool).to_numpy()
        score = np.where(div, g["initial_eval_loss"], g["final_eval_loss"]).astype(float)
        ax.barh(i, score.mean(), color="C0" if not div.any() else "C3", alpha=0.3)
        ax.plot(score[~div], np.full((~div).sum(), i), "o", color="C0", ms=4)
        ax.plot(score[div], np.full(div.sum(), i), "x", color="C3", ms=8, mew=2)
    _floor(ax, floor, vertical=True)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("final held-out loss (nats); bar: mean over seeds")
    handles, _ = ax.get_legend_handles_labels()
    handles += [
        Line2D([], [], color="C0", marker="o", ls="none", label="seed"),
        Line2D([], [], color="C3", marker="x", mew=2, ls="none", label="diverged seed (initial loss)"),
    ]
    ax.legend(handles=handles, fontsize=7, loc="lower right")
    ax.set_title(title or "Claims: final loss per configuration")
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def train_table(summary: pd.DataFrame, title: str) -> Table:
    t = summary_table(
        title, "final = held-out loss at the last step, mean ± SE over seeds that did not diverge"
    )
    keys = varying_columns(summary)
    for col in ("config", "seeds", "diverged", "final", "±SE", "gap to H", "tok/s"):
        t.add_column(col, justify="left" if col == "config" else "right", no_wrap=col != "config")
    for _, r in summary.iterrows():
        t.add_row(
            config_name(r, keys),
            str(r["seeds"]),
            str(r["diverged"]),
            fmt(r["final_eval_loss_mean"]),
            fmt(r["final_eval_loss_se"], 2),
            fmt(r["gap_to_floor"], 3),
            f"{r['tokens_per_s']:.0f}",
        )
    return t


def claims_table(claims: pd.DataFrame, title: str) -> Table:
    t = summary_table(
        title, "d and SE in nats (pre-norm claim: fraction of the gap closed); criteria in claims.md"
    )
    for col in ("claim", "A", "B", "d", "SE", "verdict"):
        t.add_column(col, justify="right" if col in ("d", "SE") else "left")
    style = {"holds": "green", "fails": "red", "inconclusive": "yellow"}
    for _, r in claims.iterrows():
        a = f"{fmt(r['a_mean'])}" + (f" ({r['a_diverged']} div.)" if r["a_diverged"] else "")
        b = f"{fmt(r['b_mean'])}" + (f" ({r['b_diverged']} div.)" if r["b_diverged"] else "")
        t.add_row(
            r["claim"],
            a,
            b,
            fmt(r["difference"], 3),
            fmt(r["difference_se"], 2),
            f"[{style[r['verdict']]}]{r['verdict']}[/]",
        )
    return t


def write_claims_md(claims: pd.DataFrame, meta: dict, run_dir: Path, formats, description: str) -> list[Path]:
    """claims.md: every claim with its numbers, verdict and criterion; the figures."""
    lines = [f"# Training claims ({description})", ""]
    floor = meta.get("entropy_floor")
    data = meta.get("data", {})
    lines += [f"Data: {data.get('source')}" + (f", entropy floor H = {floor:.4f} nats" if floor else ""), ""]
    lines += ["| claim | A (mean ± SE) | B (mean ± SE) | d ± SE | verdict |", "|---|---|---|---|---|"]
    for _, r in claims.iterrows():
        a = f"{r['a']}: {r['a_mean']:.4f} ± {r['a_se']:.4f}" + (
            f", {r['a_diverged']} diverged" if r["a_diverged"] else ""
        )
        b = (
            f"{r['b']}: {r['b_mean']:.4f} ± {r['b_se']:.4f}" if r["b"] else f"reference {r['b_mean']:.4f}"
        ) + (f", {r['b_diverged']} diverged" if r["b_diverged"] else "")
        lines.append(
            f"| {r['claim']} | {a} | {b} | {r['difference']:+.4f} ± {r['difference_se']:.4f} | "
            f"**{r['verdict']}** |"
        )
    lines += ["", "## Criteria", ""]
    for _, r in claims.iterrows():
        lines.append(f"- **{r['claim']}** ({r['statement']}): {r['test']}; {r['criterion']}.")
    lines += ["", "## Figures", ""]
    ext = "png" if "png" in formats else formats[0]
    for stem, what in (
        ("claims", "final loss per configuration"),
        ("claims_deep_curves", "deep stacks"),
        ("claims_shallow_curves", "shallow comparisons"),
    ):
        if (run_dir / f"{stem}.{ext}").exists():
            lines.append(f"![{what}]({stem}.{ext})")
            lines.append("")
    path = run_dir / "claims.md"
    path.write_text("\n".join(lines) + "\n")
    return [path]
