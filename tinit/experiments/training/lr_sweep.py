"""Learning-rate sweep across depth: does the optimum peak lr move with L?

The transfer question of muP (Yang et al. 2022) and CompleteP (Dey et al. 2025) asked
across depth: with a good parametrisation the loss-optimal lr is the same at every
depth. For each (scheme, norm position, depth) the optimum is the grid point of
lowest mean final loss, refined by the vertex of a parabola through it and its two
neighbours in log2 lr when it is interior. The drift is the least-squares slope of
log2 lr* against log2 L per (scheme, norm position): 0 means the optimum transfers;
-1 means it halves when the depth doubles.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from ...model.config import InitConfig, ModelConfig, RunConfig
from ..driver import extended
from ..result import ExperimentResult, Partial, Progress
from .data import TrainData
from .train import TrainConfig, run_train

OPTIMUM_COLUMNS = [
    "init",
    "norm_position",
    "n_layers",
    "warmup",
    "best_lr_grid",
    "best_loss",
    "lr_opt",
    "log2_lr_opt",
    "interior",
]
DRIFT_COLUMNS = ["init", "norm_position", "warmup", "depths", "slope", "slope_se", "intercept"]


def parabola_vertex(x: np.ndarray, y: np.ndarray) -> float:
    """x of the vertex of the parabola through three points; NaN when it opens downward."""
    a, b, _ = np.polyfit(x, y, 2)
    return float(-b / (2 * a)) if a > 0 else math.nan


def lr_optima(summary: pd.DataFrame) -> pd.DataFrame:
    """The optimum peak lr per (scheme, norm position, depth, warmup) from ``summary``
    (mean final loss over seeds; all-diverged lrs have no mean and never win)."""
    rows = []
    for (init, pos, L, w), g in summary.groupby(["init", "norm_position", "n_layers", "warmup"], sort=False):
        g = g.sort_values("peak_lr")
        x, y = np.log2(g["peak_lr"].to_numpy(float)), g["final_eval_loss_mean"].to_numpy(float)
        ok = np.isfinite(y)
        if not ok.any():
            rows.append(
                {
                    "init": init,
                    "norm_position": pos,
                    "n_layers": L,
                    "warmup": w,
                    "best_lr_grid": math.nan,
                    "best_loss": math.nan,
                    "lr_opt": math.nan,
                    "log2_lr_opt": math.nan,
                    "interior": False,
                }
            )
            continue
        i = int(np.nanargmin(np.where(ok, y, np.inf)))
        interior = 0 < i < len(y) - 1 and ok[i - 1] and ok[i + 1]
        x_opt = parabola_vertex(x[i - 1 : i + 2], y[i - 1 : i + 2]) if interior else math.nan
        if not (math.isfinite(x_opt) and x[i - 1] <= x_opt <= x[i + 1]):
            x_opt = x[i]
        rows.append(
            {
                "init": init,
                "norm_position": pos,
                "n_layers": L,
                "warmup": w,
                "best_lr_grid": float(2 ** x[i]),
                "best_loss": float(y[i]),
                "lr_opt": float(2**x_opt),
                "log2_lr_opt": float(x_opt),
                "interior": bool(interior),
            }
        )
    return pd.DataFrame(rows, columns=OPTIMUM_COLUMNS)


def lr_drift(optima: pd.DataFrame) -> pd.DataFrame:
    """Least-squares slope of log2 lr* against log2 L per (scheme, norm position, warmup),
    with its standard error (NaN below three depths)."""
    rows = []
    for (init, pos, w), g in optima.groupby(["init", "norm_position", "warmup"], sort=False):
        g = g[np.isfinite(g["log2_lr_opt"])]
        x, y = np.log2(g["n_layers"].to_numpy(float)), g["log2_lr_opt"].to_numpy(float)
        slope = se = intercept = math.nan
        if len(np.unique(x)) >= 2:
            slope, intercept = np.polyfit(x, y, 1)
            if len(x) >= 3:
                resid = y - (slope * x + intercept)
                se = math.sqrt(resid @ resid / (len(x) - 2) / ((x - x.mean()) @ (x - x.mean())))
        rows.append(
            {
                "init": init,
                "norm_position": pos,
                "warmup": w,
                "depths": ",".join(str(int(v)) for v in g["n_layers"]),
                "slope": float(slope),
                "slope_se": se,
                "intercept": float(intercept),
            }
        )
    return pd.DataFrame(rows, columns=DRIFT_COLUMNS)


def run_lr_sweep(
    model: ModelConfig,
    init: InitConfig,
    run: RunConfig,
    train: TrainConfig,
    data: TrainData,
    schemes: Sequence[str],
    norm_positions: Sequence[str],
    depths: Sequence[int],
    seeds: Sequence[int],
    lrs: Sequence[float],
    warmups: Sequence[int] | None = None,
    progress: Progress | None = None,
    on_partial: Partial | None = None,
) -> ExperimentResult:
    """Train the grid over ``lrs`` at every depth, then find each optimum and its drift.
    Adds frames ``lr_optimum`` and ``lr_drift`` to those of :func:`run_train`."""
    n_per = len(lrs) * len(seeds)  # the runs of one (scheme, norm position, depth, warmup)

    def with_optima(result: ExperimentResult) -> ExperimentResult:
        """The optima and drifts of the depths whose every lr and seed finished (a run
        stopped part-way has them for what finished)."""
        summary = result["summary"]
        if not result.complete and len(summary):
            keys = ["init", "norm_position", "n_layers", "warmup"]
            summary = summary.groupby(keys, sort=False).filter(lambda g: int(g["seeds"].sum()) == n_per)
        optima = lr_optima(summary)
        result.frames["lr_optimum"] = optima
        result.frames["lr_drift"] = lr_drift(optima)
        # a line through two depths has no standard error (it needs three points)
        result.not_applicable["lr_drift"] = {
            "slope_se": lambda df: df["depths"].astype(str).str.count(",") < 2
        }
        return result

    return extended(
        lambda partial: run_train(model, init, run, train, data, schemes, norm_positions, depths, seeds, lrs,
                                  warmups, progress, partial),
        with_optima, on_partial,
    )  # fmt: skip
