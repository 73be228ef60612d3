"""Rich tables for the terminal: measured next to theory."""

from __future__ import annotations

import math

import pandas as pd
from rich import box
from rich.table import Table


def fmt(x: float, digits: int = 4) -> str:
    """``digits`` significant digits; "-" for a missing one (None or NaN), "inf" / "-inf"
    for an infinite one; exponents always short (6.554e4, 2.62e8, 1.9e-11), never
    Python's 6.554e+04, so a column of numbers has one format."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0 or 1e-2 <= abs(x) < 1e5:
        out = f"{x:.{digits}g}"
        if "e" not in out:
            return out
        mantissa, exp = out.split("e")
        return f"{mantissa}e{int(exp)}"
    mantissa, exp = f"{x:.{max(digits - 1, 0)}e}".split("e")  # the same significant digits as above
    return f"{mantissa}e{int(exp)}"


def pct(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * x:+.2f}%"


def error_style(rel: float, ok: float = 0.05, warn: float = 0.2) -> str:
    a = abs(rel) if rel == rel else math.inf
    return "green" if a <= ok else "yellow" if a <= warn else "red"


def summary_table(title: str | None, caption: str | None = None) -> Table:
    """The look of every terminal summary: bold header, one rule under it, one space
    between columns and none at the edges (a table fits 80 columns where it can)."""
    return Table(
        title=title or None,
        caption=caption,
        header_style="bold",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        pad_edge=False,
        collapse_padding=True,
        show_edge=False,
    )


def variance_table(summary: pd.DataFrame, title: str = "") -> Table:
    """One row per configuration: v0, v_2L measured, the law's two predictions and
    their relative errors, and the largest stream/branch correlation."""
    t = summary_table(title, "err = measured / law - 1; ρ = corr(stream, branch)")
    for col in ("config", "v0", "mean s²", "v_2L", "closed", "err", "cumul.", "err", "max|ρ|"):
        t.add_column(col, justify="left" if col == "config" else "right", no_wrap=True)
    for r in summary.itertuples(index=False):
        t.add_row(
            f"{r.init}/{r.norm_position}",
            fmt(r.v0, 3),
            fmt(r.branch_var_mean, 3),
            fmt(r.v_final),
            fmt(r.pred_closed_final),
            f"[{error_style(r.rel_err_closed)}]{pct(r.rel_err_closed)}[/]",
            fmt(r.pred_cumulative_final),
            f"[{error_style(r.rel_err_cumulative)}]{pct(r.rel_err_cumulative)}[/]",
            fmt(r.max_abs_cross_corr, 2),
        )
    return t


def cost_line(meta: dict) -> str | None:
    """One line on what the measurement cost: where it ran, its time, its peak memory.
    None when the experiment recorded no timings."""
    seconds = meta.get("seconds") or {}
    if not seconds:
        return None
    where = meta.get("device", "?")
    if meta.get("device_name"):
        where += f" ({meta['device_name']})"
    run = meta.get("run") or {}
    if run.get("dtype"):
        where += f", {run['dtype']}" + (" + TF32" if meta.get("tf32_matmul") else "")
    streamed = meta.get("streamed")
    if streamed is True or (isinstance(streamed, dict) and any(streamed.values())):
        where += ", streamed"
    name, longest = max(seconds.items(), key=lambda kv: kv[1])
    n = len(seconds)
    parts = [
        f"{sum(seconds.values()):.1f} s"
        + (f" in {n} parts (longest: {name} {longest:.2f} s)" if n > 1 else "")
    ]
    gpu = meta.get("peak_gpu_memory_gib") or {}
    if gpu:
        parts.append(f"peak GPU memory {max(gpu.values()):.2f} GiB")
    if meta.get("peak_rss_mib") is not None:
        parts.append(f"peak process memory {meta['peak_rss_mib']:.0f} MiB")
    return f"Measured on {where}: " + "; ".join(parts)
