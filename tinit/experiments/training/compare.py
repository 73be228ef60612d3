"""``tinit train`` with two or more schemes: each scheme against the first, paired by
seed. The same seed gives the same data and batch order to every scheme (only the
init differs), so the per-seed difference of final held-out loss removes what the seed
shares; its mean, standard error and Student-t interval over the seeds give the
verdict (:data:`CRITERION`)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...criteria import TRAIN_COMPARE_CRITERION as CRITERION  # noqa: F401  (re-exported)
from ...criteria import TRAIN_COMPARE_LEVEL as LEVEL
from ..measure.verdicts import t_quantile

#: The settings a comparison holds fixed (every configuration column but init and seed).
CONTEXT_COLUMNS = ["norm_position", "norm", "ffn", "tied", "n_layers", "d_model", "d_ff", "peak_lr", "warmup"]
COMPARE_COLUMNS = [
    *CONTEXT_COLUMNS, "init", "baseline", "pairs", "diff_mean", "diff_se", "ci_low", "ci_high", "verdict",
]  # fmt: skip


def compare_schemes(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (setting, scheme other than the first): the paired difference of
    final eval loss, scheme minus the first scheme of the grid (the baseline), over the
    seeds both ran without diverging. Negative: the scheme ends lower. Empty (no rows)
    with one scheme."""
    schemes = list(dict.fromkeys(runs["init"]))
    rows = []
    if len(schemes) < 2:
        return pd.DataFrame(columns=COMPARE_COLUMNS)
    base = schemes[0]
    for key, g in runs.groupby(CONTEXT_COLUMNS, sort=False, dropna=False):
        ok = g[~g["diverged"].astype(bool)]
        ref = ok[ok["init"] == base].set_index("seed")["final_eval_loss"]
        for scheme in schemes[1:]:
            other = ok[ok["init"] == scheme].set_index("seed")["final_eval_loss"]
            seeds = [s for s in ref.index if s in other.index]
            d = np.asarray([other[s] - ref[s] for s in seeds], dtype=np.float64)
            n = d.size
            mean = float(d.mean()) if n else math.nan
            se = float(d.std(ddof=1) / math.sqrt(n)) if n >= 2 else math.nan
            lo = hi = math.nan
            if n >= 2:
                half = t_quantile(1 - LEVEL, n - 1) * se
                lo, hi = mean - half, mean + half
            verdict = ("too few seeds" if n < 2 else "lower" if hi < 0 else "higher" if lo > 0
                       else "no difference resolved")  # fmt: skip
            rows.append({**dict(zip(CONTEXT_COLUMNS, key, strict=True)), "init": scheme, "baseline": base,
                         "pairs": n, "diff_mean": mean, "diff_se": se, "ci_low": lo, "ci_high": hi,
                         "verdict": verdict})  # fmt: skip
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)


def not_applicable() -> dict:
    """compare.csv's empty cells: the SE and interval need two pairs, the mean one."""
    return {
        "diff_mean": lambda df: df["pairs"] < 1,
        **dict.fromkeys(("diff_se", "ci_low", "ci_high"), lambda df: df["pairs"] < 2),
    }
