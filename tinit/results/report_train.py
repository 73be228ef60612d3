"""What training runs report besides figures: the names of their configurations (as the
figures, tables and notes print them), the terminal tables of ``train``, ``lr-sweep``
and ``claims``, and claims.md."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.table import Table

from ..criteria import TRAIN_CONFIG_COLUMNS
from .tables import fmt, summary_table

#: Columns that, with the seed, name a configuration of a training grid.
CONFIG_KEYS = [c for c in TRAIN_CONFIG_COLUMNS if c != "seed"]


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


def fixed_settings(df: pd.DataFrame) -> str:
    """The configuration columns that do not vary in ``df``, as words ("L=24, naive init,
    post-norm, lr=0.015, warmup 0"): what a figure's title must say when its legend does
    not (a single configuration's depth, init, placement and learning rate)."""
    keys = ("n_layers", "init", "norm_position", "peak_lr", "warmup")
    words = []
    for c in keys:
        if c not in df or df[c].nunique(dropna=False) != 1:
            continue
        v = df[c].iloc[0]
        if c == "peak_lr":
            words.append(f"lr={float(v):g}")
        else:
            words.append({"n_layers": "L={}", "init": "{} init", "norm_position": "{}-norm",
                          "warmup": "warmup {}"}[c].format(v))  # fmt: skip
    return ", ".join(words)


def train_table(summary: pd.DataFrame, title: str) -> Table:
    t = summary_table(
        title, "final = held-out loss at the last step, mean ± SE over seeds that did not diverge"
    )
    # one configuration: nothing varies, so it is named by what it is (it was "run")
    keys = varying_columns(summary) or [c for c in ("init", "norm_position", "n_layers") if c in summary]
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
