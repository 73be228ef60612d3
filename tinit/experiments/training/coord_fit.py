"""The coordinate check's fit and verdict: how the RMS of each quantity scales with
width and with depth, per scheme and step, and whether every slope stays within the
tolerance of :data:`tinit.criteria.COORD_SLOPE_TOL`.

The fit (per scheme, norm position, axis, value of the other axis, step and quantity):
for each seed, the quantity's RMS is aggregated over the layers that carry it as the
mean of log2 RMS (the log of the geometric mean over layers; the embedding and the
logits have one layer), and a least-squares line through (log2 x, that mean) gives the
seed's slope; ``slope`` is the mean over seeds, ``slope_se`` their standard error
(ddof 1; empty with one seed). With the same x for every seed this mean is the slope of
the seed-mean, so the SE is the seeds' spread of the very number reported. Aggregating
over layers is what makes the depth axis possible at all (an L=2 and an L=8 stack share
no layer but the embedding and the logits); mup's plots (one line per layer) are drawn
from coord_check.csv beside it.

The verdict (per scheme, norm position and axis): ``width-stable`` (``depth-stable``)
when every row is within the tolerance (Theta(1) quantities |slope| <= tol, the logits
slope <= tol), else ``-unstable``; it sits on the row that decides it, the one furthest
beyond (or closest to) the tolerance, so that row names the quantity, step and slope.
An axis with one value has no slope and no verdict (empty cells). A quantity that is
exactly zero at every point (a zero-initialised readout's logits at step 0) has no scale
to fit: its slope is empty and it does not count.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...criteria import COORD_O1, COORD_SLOPE_TOL

#: coord_check_fit.csv's columns.
FIT_COLUMNS = [
    "init", "norm_position", "axis", "n_layers", "d_model", "step", "quantity", "x_min", "x_max",
    "points", "seeds", "slope", "slope_se", "tolerance", "criterion", "within", "verdict",
]  # fmt: skip
#: axis -> (the column swept, the column held fixed).
AXES = {"width": ("d_model", "n_layers"), "depth": ("n_layers", "d_model")}


def seed_slopes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares slopes of each row of ``y`` (seeds x points) against ``x``: NaN
    where a row has a non-finite value (an incomplete or diverged seed is not fitted on
    fewer points than the others)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.atleast_2d(np.asarray(y, dtype=np.float64))
    xc = x - x.mean()
    with np.errstate(invalid="ignore", over="ignore"):
        slopes = (y - y.mean(axis=1, keepdims=True)) @ xc / float(xc @ xc)
    slopes[~np.isfinite(y).all(axis=1)] = math.nan
    return slopes


def slope_over_seeds(x, y) -> tuple[float, float]:
    """(mean, standard error) of the seeds' log-log slopes; the SE is NaN with one seed.
    A seed whose slope is not finite makes the mean NaN (a measurement, flagged)."""
    s = seed_slopes(x, y)
    if not s.size:
        return math.nan, math.nan
    mean = float(np.mean(s))
    se = float(np.std(s, ddof=1) / math.sqrt(s.size)) if s.size >= 2 and np.isfinite(s).all() else math.nan
    return mean, se


def within(quantity: str, slope: float, tol: float = COORD_SLOPE_TOL) -> bool:
    """Theta(1): |slope| <= tol; O(1) (the logits): slope <= tol. A NaN is not within."""
    if not math.isfinite(slope):
        return False
    return slope <= tol if quantity in COORD_O1 else abs(slope) <= tol


def excess(quantity: str, slope: float, tol: float = COORD_SLOPE_TOL) -> float:
    """How far beyond the tolerance (negative: inside); inf for a NaN slope."""
    if not math.isfinite(slope):
        return math.inf
    return (slope if quantity in COORD_O1 else abs(slope)) - tol


def _log_rms(group: pd.DataFrame, x_col: str) -> tuple[np.ndarray, np.ndarray]:
    """(x values, seeds x points array of the mean over layers of log2 RMS), over the
    seeds measured at every point: a seed a stopped run did not reach at some point is
    left out (it is not measured there, which is not a non-finite measurement), while a
    measured nan or inf stays and makes that seed's slope NaN (flagged)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = group.assign(log_rms=np.log2(group["rms"].to_numpy(dtype=np.float64)))
    by = logs.groupby(["seed", x_col], sort=True)["log_rms"]
    table, seen = by.mean().unstack(x_col), by.size().unstack(x_col)
    whole = seen.notna().all(axis=1).to_numpy()
    return table.columns.to_numpy(dtype=np.float64), table.to_numpy(dtype=np.float64)[whole]


def fit_axis(rows: pd.DataFrame, axis: str, tol: float = COORD_SLOPE_TOL) -> list[dict]:
    """One fit row per (init, norm position, fixed value, step, quantity) along ``axis``."""
    x_col, fixed = AXES[axis]
    out = []
    keys = ["init", "norm_position", fixed, "step", "quantity"]
    for key, g in rows.groupby(keys, sort=False):
        init, pos, fixed_value, step, quantity = key
        xs = sorted(g[x_col].unique())
        rms = g["rms"].to_numpy(dtype=np.float64)
        slope = se = math.nan
        seeds = 0
        ok = len(xs) >= 2 and not (rms == 0).all()
        if ok:
            x, y = _log_rms(g, x_col)
            seeds, ok = len(y), len(y) > 0
            slope, se = slope_over_seeds(np.log2(x), y)
        row = {
            "init": init, "norm_position": pos, "axis": axis, "n_layers": math.nan, "d_model": math.nan,
            "step": int(step), "quantity": quantity, "x_min": int(xs[0]), "x_max": int(xs[-1]),
            "points": len(xs), "seeds": seeds if ok else int(g["seed"].nunique()),
            "slope": slope, "slope_se": se,
            "tolerance": tol, "criterion": "slope <= tol" if quantity in COORD_O1 else "|slope| <= tol",
            "within": within(quantity, slope, tol) if ok else None, "verdict": None,
            "_fitted": ok,
        }  # fmt: skip
        row[fixed] = int(fixed_value)
        out.append(row)
    return out


def verdicts(fit: list[dict], tol: float = COORD_SLOPE_TOL) -> None:
    """Put each (init, norm position, axis)'s verdict on its deciding row, in place."""
    groups: dict[tuple, list[dict]] = {}
    for r in fit:
        if r["_fitted"]:
            groups.setdefault((r["init"], r["norm_position"], r["axis"]), []).append(r)
    for (_, _, axis), rs in groups.items():
        worst = max(rs, key=lambda r: excess(r["quantity"], r["slope"], tol))
        stable = all(r["within"] for r in rs)
        worst["verdict"] = f"{axis}-{'stable' if stable else 'unstable'}"


def fit_coord_check(rows: pd.DataFrame, tol: float = COORD_SLOPE_TOL) -> pd.DataFrame:
    """coord_check_fit: the width fits, then the depth fits, each with its verdict."""
    if not len(rows):
        return pd.DataFrame(columns=FIT_COLUMNS)
    fit = fit_axis(rows, "width", tol) + fit_axis(rows, "depth", tol)
    verdicts(fit, tol)
    df = pd.DataFrame(fit)
    df["within"] = df["within"].astype(object)
    return df[FIT_COLUMNS]


def fit_not_applicable() -> dict:
    """coord_check_fit's empty cells: the fixed axis's column of the other axis; slope,
    SE, within and verdict where the axis has one value (or the quantity is exactly
    zero everywhere); the SE with one seed; the verdict except on its deciding row."""

    def no_fit(df):
        return df["within"].isna()

    return {
        "n_layers": lambda df: df["axis"] == "depth",
        "d_model": lambda df: df["axis"] == "width",
        "slope": no_fit,
        "slope_se": lambda df: no_fit(df) | (df["seeds"] < 2),
        "within": no_fit,
        "verdict": lambda df: df["verdict"].isna(),
    }


def summary(fit: pd.DataFrame) -> list[dict]:
    """Per (init, norm position, axis): the verdict, the deciding row's quantity, step,
    fixed value, slope and SE, and how many rows are outside the tolerance; or no
    verdict (one value on the axis)."""
    out = []
    for (init, pos, axis), g in fit.groupby(["init", "norm_position", "axis"], sort=False):
        decided = g[g["verdict"].notna()]
        fixed = AXES[axis][1]
        if not len(decided):
            out.append({"init": init, "norm_position": pos, "axis": axis, "verdict": None})
            continue
        r = decided.iloc[0]
        out.append({
            "init": init, "norm_position": pos, "axis": axis, "verdict": r["verdict"],
            "quantity": r["quantity"], "step": int(r["step"]), fixed: r[fixed], "slope": r["slope"],
            "slope_se": r["slope_se"], "outside": int((g["within"] == False).sum()),  # noqa: E712
            "rows": int(g["within"].notna().sum()), "tolerance": r["tolerance"],
        })  # fmt: skip
    return out
