"""Rich tables for the terminal: measured next to theory."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from rich import box
from rich.table import Table

if TYPE_CHECKING:
    import pandas as pd


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _plain(x: float, digits: int) -> bool:
    """Whether ``x`` prints without an exponent in ``digits`` significant digits."""
    return x == 0 or not math.isfinite(x) or 1e-2 <= abs(x) < 10**digits


def _sci(x: float, digits: int) -> str:
    """``digits`` significant digits with a short exponent (6.554e4, never 6.554e+04)."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    mantissa, exp = f"{x:.{max(digits - 1, 0)}e}".split("e")
    return f"{mantissa}e{int(exp)}"


def fmt(x: float, digits: int = 4) -> str:
    """``digits`` significant digits without an exponent from 0.01 up to 10^digits,
    else a short exponent (2.6e8, 4.3e-4). '-' for a missing value; inf as inf."""
    if _missing(x):
        return "-"
    return f"{x:.{digits}g}" if _plain(x, digits) else _sci(x, digits)


def fmt_column(values: Iterable[float], digits: int = 4) -> list[str]:
    """One format for a whole table column: every value as :func:`fmt` would print it
    without an exponent when all of them fit that, else every one with an exponent and
    one significant digit less (so a column never mixes 0.9944 and 5.94e-4, and an
    exponent column stays as narrow as a plain one: a summary table fits 80 columns)."""
    values = list(values)
    present = [float(x) for x in values if not _missing(x)]
    if all(_plain(x, digits) for x in present):
        return [fmt(x, digits) for x in values]
    return ["-" if _missing(x) else _sci(float(x), digits - 1) for x in values]


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
    num = {
        col: fmt_column(summary[col], digits)
        for col, digits in (
            ("v0", 3), ("branch_var_mean", 3), ("v_final", 4), ("pred_closed_final", 4),
            ("pred_cumulative_final", 4), ("max_abs_cross_corr", 2),
        )
    }  # fmt: skip
    for i, r in enumerate(summary.itertuples(index=False)):
        t.add_row(
            f"{r.init}/{r.norm_position}",
            num["v0"][i],
            num["branch_var_mean"][i],
            num["v_final"][i],
            num["pred_closed_final"][i],
            f"[{error_style(r.rel_err_closed)}]{pct(r.rel_err_closed)}[/]",
            num["pred_cumulative_final"][i],
            f"[{error_style(r.rel_err_cumulative)}]{pct(r.rel_err_cumulative)}[/]",
            num["max_abs_cross_corr"][i],
        )
    return t


def cost_line(meta: dict, width: int | None = None) -> str | None:
    """One line on what the measurement cost: where it ran, its time, its peak memory.
    None when the experiment recorded no timings. Longer than ``width`` (default: the
    terminal's, as rich sees it), it breaks between its parts, never inside a value."""
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
    # (text, separator before it): a line may break only at these separators
    pieces = [(f"Measured on {where}:", ""), (f"{sum(seconds.values()):.1f} s", " ")]
    if n > 1:
        pieces += [(f"in {n} parts", " "), (f"(longest: {name} {longest:.2f} s)", " ")]
    gpu = meta.get("peak_gpu_memory_gib") or {}
    if gpu:
        pieces.append((f"peak GPU memory {max(gpu.values()):.2f} GiB", "; "))
    if meta.get("peak_rss_mib") is not None:
        pieces.append((f"peak process memory {meta['peak_rss_mib']:.0f} MiB", "; "))
    if width is None:
        from rich.console import Console

        width = Console().width
    lines, line = [], pieces[0][0]
    for i, (text, sep) in enumerate(pieces[1:], start=1):
        # a line that breaks after this piece ends with the next separator (";"): count it
        tail = len(pieces[i + 1][1].rstrip()) if i + 1 < len(pieces) else 0
        if len(line) + len(sep) + len(text) + tail <= width:
            line += sep + text
        else:
            lines.append(line + sep.rstrip())
            line = "  " + text
    return "\n".join([*lines, line])
