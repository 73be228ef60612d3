"""What ``tinit train`` prints when it trains two or more schemes: each scheme against
the first, paired by seed (compare.csv), with its verdict and the verdict's criterion."""

from __future__ import annotations

import pandas as pd
from rich.table import Table

from ..criteria import TRAIN_COMPARE_CRITERION
from .report_train import config_name, varying_columns
from .tables import fmt, summary_table

STYLE = {"lower": "green", "higher": "red", "no difference resolved": "yellow", "too few seeds": "yellow"}


def compare_table(compare: pd.DataFrame, title: str = "Schemes against the first, paired by seed") -> Table:
    """One row per (setting, scheme): the mean paired difference of final held-out loss
    (scheme - baseline), its SE, the 95% interval and the verdict; the criterion under
    the table."""
    t = summary_table(title, "d = final loss (scheme) - final loss (baseline), same seed = same data; "
                      + TRAIN_COMPARE_CRITERION)  # fmt: skip
    keys = [c for c in varying_columns(compare) if c != "init"]
    cols = ["scheme", "vs", *(["setting"] if keys else []), "pairs", "d", "SE", "95% interval", "verdict"]
    for col in cols:
        left = col in ("scheme", "vs", "setting", "verdict")
        t.add_column(col, justify="left" if left else "right", no_wrap=col not in ("setting", "verdict"))
    for _, r in compare.iterrows():
        interval = "-" if r["pairs"] < 2 else f"{fmt(r['ci_low'], 3)} .. {fmt(r['ci_high'], 3)}"
        v = str(r["verdict"])
        t.add_row(
            str(r["init"]), str(r["baseline"]), *([config_name(r, keys)] if keys else []), str(r["pairs"]),
            fmt(r["diff_mean"], 3), fmt(r["diff_se"], 2), interval, f"[{STYLE.get(v, 'white')}]{v}[/]",
        )  # fmt: skip
    return t
