"""Rich tables for the terminal: measured next to theory."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from rich import box
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from .text import wrap_settings

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


#: The width of the tables and notes when stdout is not a terminal (a file, a pipe) and
#: $COLUMNS is unset: rich's default there, 80, wrapped rows between the words of a label
#: (a configuration, a claim), which nothing reflows in a file; at this width every
#: command's rows stay on one line.
PIPE_WIDTH = 200


def output_console():
    """The console a command prints its summary to: the terminal's width on a terminal
    (or $COLUMNS when set), else :data:`PIPE_WIDTH`."""
    import os

    from rich.console import Console

    console = Console()
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        return Console(width=PIPE_WIDTH)
    return console


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


def _needs(console, table: Table, i: int) -> tuple[int, int]:
    """Column ``i``'s (least, natural) content width with no text cut: the longest line
    of a no-wrap column, else its longest word (lines may wrap between words)."""
    col = table.columns[i]
    least = natural = 0
    for cell in [col.header, *col._cells]:
        text = cell if isinstance(cell, Text) else console.render_str(cell) if isinstance(cell, str) else None
        if text is None:  # another renderable: trust its own measurement
            from rich.measure import Measurement

            m = Measurement.get(console, console.options, cell)
            least, natural = max(least, m.minimum), max(natural, m.maximum)
            continue
        for line in text.plain.split("\n"):
            words = [cell_len(w) for w in line.split()] or [0]
            natural = max(natural, cell_len(line))
            least = max(least, cell_len(line) if col.no_wrap else max(words))
    return least, natural


def _with_columns(table: Table, idx: list[int], title: bool, caption: bool) -> Table:
    part = copy.copy(table)
    part.columns = []
    for j, i in enumerate(idx):
        col = copy.copy(table.columns[i])
        col._index = j
        part.columns.append(col)
    part.title = table.title if title else None
    part.caption = table.caption if caption else None
    return part


def fit_table(table: Table, width: int, console=None) -> list[Table]:
    """``table`` as one or more tables no wider than ``width`` in which no cell text is
    cut: if every column at its least width (no-wrap: whole lines; others: whole words)
    fits, the wrapping columns share the room left; else the columns are split over
    several tables, each repeating the first (key) column. Rich alone would shorten
    numbers to "4.0e…" and verdicts to "hol…" at 80 columns."""
    if not isinstance(table, Table) or not table.columns:
        return [table]
    if console is None:
        from rich.console import Console

        console = Console(width=width)
    needs = [_needs(console, table, i) for i in range(len(table.columns))]

    def total(idx: list[int], key: str) -> int:
        part = _with_columns(table, idx, False, False)
        return sum(needs[i][0 if key == "least" else 1] + part._get_padding_width(j)
                   for j, i in enumerate(idx)) + part._extra_width  # fmt: skip

    all_idx = list(range(len(table.columns)))
    if total(all_idx, "natural") <= width:
        return [table]

    def split(limit: int) -> list[list[int]]:
        groups, group = [], [0]
        for i in all_idx[1:]:
            if len(group) > 1 and total([*group, i], "least") > limit:
                groups.append(group)
                group = [0, i]
            else:
                group.append(i)
        return [*groups, group]

    groups = split(width)
    # as few tables as that, of similar widths (not a full one and a last column alone)
    for limit in range(total(all_idx, "least") // len(groups), width):
        if len(balanced := split(limit)) == len(groups):
            groups = balanced
            break
    parts = []
    for g, idx in enumerate(groups):
        part = _with_columns(table, idx, g == 0, g == len(groups) - 1)
        if total(idx, "natural") > width:  # fix the widths: least, plus the room left for wrapping text
            spare = max(width - total(idx, "least"), 0)
            extra = [needs[i][1] - needs[i][0] for i in idx]
            room = sum(extra) or 1
            for col, i, e in zip(part.columns, idx, extra, strict=True):
                col.width = needs[i][0] + (spare * e) // room
        parts.append(part)
    return parts


def _table_width(console, table: Table) -> int:
    from rich.measure import Measurement

    return Measurement.get(console, console.options, table).maximum


def print_tables(console, renderables: Iterable) -> None:
    """Print a command's tables (and notes) at the console's width, no cell text cut;
    a title wider than its table is printed over it, broken between settings (rich
    would break it inside one: "seed" / "0,")."""
    for r in renderables:
        for part in fit_table(r, console.width, console) if isinstance(r, Table) else [r]:
            title = part.title if isinstance(part, Table) else None
            caption = part.caption if isinstance(part, Table) else None
            if isinstance(title, str) and cell_len(title) > _table_width(console, part):
                part = copy.copy(part)
                part.title = None
                width = max(_table_width(console, part), min(console.width, 60))
                lines = wrap_settings(title, width)
                console.print(Text("\n".join(ln.center(width).rstrip() for ln in lines),
                                   style="table.title"), highlight=False)  # fmt: skip
            # a caption much longer than its (narrow) table: under it at the console's width,
            # not as a column of 40-character lines
            long_caption = isinstance(caption, str) and cell_len(caption) > 2 * _table_width(console, part)
            if long_caption:
                part = copy.copy(part)
                part.caption = None
            console.print(part)
            if long_caption:
                console.print(Text(caption, style="table.caption"), highlight=False)


def variance_table(summary: pd.DataFrame, title: str = "") -> Table:
    """One row per configuration: v0, v_2L measured, the closed form and the law's two
    relative errors (closed form; cumulative law from the measured branch variances),
    and the largest stream/branch correlation. Nine columns with the cumulative law's
    value would not fit 80 columns; its error says it (law = v_2L / (1 + err)). Where the
    two errors are the same (pre-norm: both laws are v0 + 2L mean s² at k = 2L) the
    second prints "=" and the caption says why."""
    same = [pct(a) == pct(b) for a, b in zip(summary["rel_err_closed"], summary["rel_err_cumulative"],
                                              strict=True)]  # fmt: skip
    note = (
        (
            "; =: as err (at k = 2L the closed form with the measured mean s², v0 + 2L mean s², is the "
            "cumulative law)"
        )
        if any(same)
        else ""
    )
    t = summary_table(title, "closed: the scheme's closed form; err = v_2L / law - 1 for the closed form "
                      f"and the cumulative law v0 + sum s_k²{note}; ρ = corr(stream, branch)")  # fmt: skip
    for col in ("config", "v0", "mean s²", "v_2L", "closed", "err", "cumul.\nerr", "max|ρ|"):
        t.add_column(col, justify="left" if col == "config" else "right", no_wrap=True)
    num = {
        col: fmt_column(summary[col], digits)
        for col, digits in (
            ("v0", 3), ("branch_var_mean", 3), ("v_final", 4), ("pred_closed_final", 4),
            ("max_abs_cross_corr", 2),
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
            "=" if same[i] else f"[{error_style(r.rel_err_cumulative)}]{pct(r.rel_err_cumulative)}[/]",
            num["max_abs_cross_corr"][i],
        )
    return t


def prediction_table(summary: pd.DataFrame, variance: pd.DataFrame, title: str = "") -> Table | None:
    """The large-width prediction (tinit.mf) beside the measurement, one row per
    configuration: v_2L measured and predicted with the error, the tokens' mean pairwise
    cosine at the last addition measured and predicted; without a measurement
    (--theory-only) the prediction alone: v0, mean s², v_2L, cosine. None when the run
    predicted nothing (--mf-draws 0)."""
    if "mf_v_final" not in summary or not summary["mf_v_final"].notna().any():
        return None
    measured = bool(summary["v_final"].notna().any())
    last = variance.sort_values("k").groupby(["init", "norm_position"], sort=False).tail(1)
    cos = {(r.init, r.norm_position): (r.cos_sim, r.mf_cos_sim) for r in last.itertuples(index=False)}
    first = variance[variance["k"] == 0]
    v0 = {(r.init, r.norm_position): r.mf_stream_var for r in first.itertuples(index=False)}
    if measured:
        caption = (
            "prediction: the large-width Gaussian recursion from the init and the tokens alone; err = "
            "measured / predicted - 1; cos: the tokens' mean pairwise cosine at k = 2L"
        )
        cols = ("config", "v_2L", "predicted", "err", "cos_2L", "predicted")
    else:
        caption = "nothing measured (--theory-only); cos: the tokens' mean pairwise cosine at k = 2L"
        cols = ("config", "v0", "mean s²", "v_2L", "cos_2L")
    t = summary_table(title, caption)
    for col in cols:
        t.add_column(col, justify="left" if col == "config" else "right", no_wrap=True)
    keys = list(zip(summary["init"], summary["norm_position"], strict=True))
    c_meas = fmt_column([cos.get(k, (math.nan, math.nan))[0] for k in keys], 3)
    c_mf = fmt_column([cos.get(k, (math.nan, math.nan))[1] for k in keys], 3)
    v_mf = fmt_column(summary["mf_v_final"], 4)
    for i, r in enumerate(summary.itertuples(index=False)):
        name = f"{r.init}/{r.norm_position}"
        if measured:
            err = f"[{error_style(r.rel_err_mf)}]{pct(r.rel_err_mf)}[/]"
            t.add_row(name, fmt(r.v_final, 4), v_mf[i], err, c_meas[i], c_mf[i])
        else:
            t.add_row(name, fmt(v0.get(keys[i], math.nan), 3), fmt(r.mf_branch_var_mean, 3), v_mf[i], c_mf[i])
    return t


def overflow_notes(summary: pd.DataFrame, dtype: str | None = None) -> list[Text]:
    """One warning per configuration whose stream variance stopped being a finite
    number: from which addition on (``first_nonfinite_k``), and where that is."""
    notes = []
    if "first_nonfinite_k" not in summary:
        return notes
    for r in summary.itertuples(index=False):
        k = r.first_nonfinite_k
        if k is None or k != k:
            continue
        k = int(k)
        where = "the embedding" if k == 0 else f"layer {(k - 1) // 2}, {'attention' if k % 2 else 'FFN'}"
        notes.append(Text(
            f"Warning: {r.init}/{r.norm_position}: the stream variance overflows (is not a finite "
            f"number{f' in {dtype}' if dtype else ''}) from addition k = {k} on ({where}); "
            f"v_k there is written inf/nan and v_2L is not measured", style="yellow"))  # fmt: skip
    return notes


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
        width = output_console().width
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
