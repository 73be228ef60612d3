"""Learning-rate sweep across depth and width: does the optimum peak lr move?

The transfer question of muP (Yang et al. 2022, Figure 1: the standard
parametrisation's optimum moves with width, muP's does not) and CompleteP (Dey et al.
2025: the same across depth): with a good parametrisation the loss-optimal lr is the
same at every width and depth. For each (scheme, norm position, depth, width, warmup)
and each seed, the optimum is the grid point of lowest final loss, refined by the
vertex of a parabola through it and its two neighbours in log2 lr when it is interior.

The drift along an axis (width at each depth, depth at each width) is the slope of
log2 lr* against log2 of the axis value, fitted by least squares per seed; the
reported slope is the mean of the per-seed slopes and its standard error their spread
over seeds (sample std / sqrt(seeds)); with one seed, the regression's residual
standard error (three points or more). 0 means the optimum transfers; -1 means it
halves when the axis doubles. The verdict states its criterion
(:data:`tinit.criteria.LR_CRITERION`); an optimum at the lr grid's edge (not
bracketed) makes it "not resolved", since the true optimum may lie beyond the grid.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from ...criteria import LR_CRITERION, LR_DRIFT_TOL, LR_LEVEL, LR_RESOLVE_TOL
from ...model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from ..driver import extended
from ..measure.depth_fits import fit_line
from ..measure.verdicts import t_quantile
from ..points import Frames, Plan, Point, grid_meta
from ..result import ExperimentResult, Partial, Progress
from .data import load_data
from .grid import TrainGrid
from .train import SUMMARY_COLUMNS, not_applicable, run_specs, run_train, summarize_runs
from .trainer import OnCheckpoint, RunSpec, TrainConfig

#: A configuration of the sweep, whose optimum is sought over the lr grid.
OPT_KEYS = ["init", "norm_position", "n_layers", "d_model", "warmup"]
_FOUND = ["best_lr_grid", "best_loss", "lr_opt", "log2_lr_opt", "interior"]
DRIFT_COLUMNS = ["init", "norm_position", "warmup", "axis", "n_layers", "d_model", "points", "seeds", "slope",
                 "slope_se", "se_method", "dof", "ci_low", "ci_high", "at_edge", "intercept", "verdict",
                 "note"]  # fmt: skip
COMPARE_COLUMNS = ["norm_position", "warmup", "axis", "n_layers", "d_model", "init_a", "init_b",
                   "abs_slope_a", "abs_slope_b", "difference", "difference_se", "ci_low", "ci_high",
                   "verdict"]  # fmt: skip
#: axis -> (the column along it, the column held fixed)
AXES = {"width": ("d_model", "n_layers"), "depth": ("n_layers", "d_model")}


def parabola_vertex(x: np.ndarray, y: np.ndarray) -> float:
    """x of the vertex of the parabola through three points; NaN when it opens downward."""
    a, b, _ = np.polyfit(x, y, 2)
    return float(-b / (2 * a)) if a > 0 else math.nan


def optimum(log2_lr: np.ndarray, loss: np.ndarray) -> dict:
    """The optimum of one loss-against-log2-lr curve (sorted by lr; NaN losses, diverged
    runs, never win): the best grid point, refined by the parabola through it and its
    neighbours when it is interior (the vertex kept only inside their span)."""
    x, y = np.asarray(log2_lr, float), np.asarray(loss, float)
    ok = np.isfinite(y)
    if not ok.any():
        return {"best_lr_grid": math.nan, "best_loss": math.nan, "lr_opt": math.nan, "log2_lr_opt": math.nan,
                "interior": False}  # fmt: skip
    i = int(np.nanargmin(np.where(ok, y, np.inf)))
    interior = bool(0 < i < len(y) - 1 and ok[i - 1] and ok[i + 1])
    x_opt = parabola_vertex(x[i - 1 : i + 2], y[i - 1 : i + 2]) if interior else math.nan
    if not (math.isfinite(x_opt) and x[i - 1] <= x_opt <= x[i + 1]):
        x_opt = x[i]
    return {"best_lr_grid": float(2 ** x[i]), "best_loss": float(y[i]), "lr_opt": float(2**x_opt),
            "log2_lr_opt": float(x_opt), "interior": interior}  # fmt: skip


def _keys(frame: pd.DataFrame, extra: Sequence[str] = ()) -> list[str]:
    return [k for k in (*OPT_KEYS, *extra) if k in frame.columns]


def lr_optima(summary: pd.DataFrame, loss: str = "final_eval_loss_mean", seed: bool = False) -> pd.DataFrame:
    """The optimum peak lr of every configuration of ``summary`` (the mean over seeds,
    ``loss`` = final_eval_loss_mean), or with ``seed`` of every run's curve (``runs``,
    ``loss`` = final_eval_loss, empty when the run diverged)."""
    keys = _keys(summary, ("seed",) if seed else ())
    rows = []
    for key, g in summary.groupby(keys, sort=False, dropna=False):
        g = g.sort_values("peak_lr")
        rows.append({**dict(zip(keys, key, strict=True)),
                     **optimum(np.log2(g["peak_lr"].to_numpy(float)), g[loss].to_numpy(float))})  # fmt: skip
    return pd.DataFrame(rows, columns=[*keys, *_FOUND])


def verdict(slope: float, low: float, high: float) -> str:
    """transfers / drifts / not resolved, by :data:`tinit.criteria.LR_CRITERION`."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return "not resolved"
    if abs(slope) < LR_DRIFT_TOL and -LR_RESOLVE_TOL < low and high < LR_RESOLVE_TOL:
        return "transfers"
    if (low > 0 or high < 0) and abs(slope) >= LR_DRIFT_TOL:
        return "drifts"
    return "not resolved"


def _drift_row(g: pd.DataFrame, along: str) -> dict:
    """The drift of one group's optima (one or more seeds) along the column ``along``."""
    g = g[np.isfinite(g["log2_lr_opt"].to_numpy(float))]
    seeds = list(g.groupby("seed", sort=False)) if "seed" in g.columns else [(None, g)]
    fits = []
    for _, s in seeds:
        x, y = np.log2(s[along].to_numpy(float)), s["log2_lr_opt"].to_numpy(float)
        if len(np.unique(x)) >= 2:
            fits.append(fit_line(x, y))
    nan = math.nan
    out = {"points": ",".join(str(int(v)) for v in sorted(g[along].unique())), "seeds": len(fits),
           "slope": nan, "slope_se": nan, "se_method": "", "dof": nan, "ci_low": nan, "ci_high": nan,
           "at_edge": int((~g["interior"].astype(bool)).sum()), "intercept": nan}  # fmt: skip
    if not fits:
        return out
    slopes = np.array([f["slope"] for f in fits])
    out["slope"], out["intercept"] = float(slopes.mean()), float(np.mean([f["intercept"] for f in fits]))
    if len(fits) >= 2:
        out.update(slope_se=float(slopes.std(ddof=1) / math.sqrt(len(fits))), se_method="seeds",
                   dof=len(fits) - 1)  # fmt: skip
    elif math.isfinite(fits[0]["slope_se"]):
        out.update(slope_se=fits[0]["slope_se"], se_method="regression", dof=len(g) - 2)
    if out["se_method"]:
        half = t_quantile(1 - LR_LEVEL, int(out["dof"])) * out["slope_se"]
        out["ci_low"], out["ci_high"] = out["slope"] - half, out["slope"] + half
    return out


def lr_drift(optima: pd.DataFrame) -> pd.DataFrame:
    """The drift of log2 lr* per axis that varies (width at each depth, depth at each
    width) and (scheme, norm position, warmup), from per-seed optima (a ``seed`` column:
    mean and SE of the per-seed slopes) or from one optimum per configuration (the
    regression's SE), with a verdict (:func:`verdict`; "not resolved" when an optimum
    lies at the lr grid's edge)."""
    optima = optima.copy()
    for col in ("d_model", "n_layers"):
        if col not in optima.columns:
            optima[col] = math.nan
    rows = []
    for axis, (along, fixed) in AXES.items():
        if optima[along].nunique() < 2:
            continue
        for key, g in optima.groupby(["init", "norm_position", "warmup", fixed], sort=False, dropna=False):
            init, pos, w, at = key
            row = {"init": init, "norm_position": pos, "warmup": w, "axis": axis, fixed: at, along: math.nan,
                   **_drift_row(g, along)}  # fmt: skip
            row["verdict"] = verdict(row["slope"], row["ci_low"], row["ci_high"])
            row["note"] = ""
            if row["at_edge"]:
                row["verdict"] = "not resolved"
                row["note"] = f"{row['at_edge']} optima not bracketed (grid edge or a diverged neighbour)"
            elif not row["se_method"]:
                row["note"] = "no standard error: give 2 seeds or 3 points"
            elif row["verdict"] == "not resolved" and row["se_method"] == "regression":
                # one seed: the interval rests on the fit's few residual degrees of freedom
                dof = int(row["dof"])
                row["note"] = (f"one seed: {dof} degree{'s' if dof != 1 else ''} of freedom, t = "
                               f"{t_quantile(1 - LR_LEVEL, dof):.3g}; give --seeds 3 or more")  # fmt: skip
            rows.append(row)
    return pd.DataFrame(rows, columns=DRIFT_COLUMNS)


def drift_compare(drift: pd.DataFrame) -> pd.DataFrame:
    """Which scheme's optimum moves less, per axis and held value: the difference of the
    drifts' magnitudes |s_b| - |s_a| with SE sqrt(se_a^2 + se_b^2) and a Student-t
    interval (the smaller of the two degrees of freedom); "<a> moves less" when the
    interval is above 0, "<b> moves less" below 0, else "not resolved" (also when either
    drift is not resolved for want of an SE or a bracketed optimum)."""
    rows, where = [], ["norm_position", "warmup", "axis", "n_layers", "d_model"]
    for key, g in drift.groupby(where, sort=False, dropna=False):
        for (_, a), (_, b) in itertools.combinations(list(g.iterrows()), 2):
            diff = abs(b["slope"]) - abs(a["slope"])
            se = math.hypot(a["slope_se"], b["slope_se"])
            low = high = math.nan
            word = "not resolved"
            if math.isfinite(se) and not (a["at_edge"] or b["at_edge"]):
                half = t_quantile(1 - LR_LEVEL, int(min(a["dof"], b["dof"]))) * se
                low, high = diff - half, diff + half
                word = (f"{a['init']} moves less" if low > 0 else f"{b['init']} moves less" if high < 0
                        else "not resolved")  # fmt: skip
            rows.append({**dict(zip(where, key, strict=True)),
                         "init_a": a["init"], "init_b": b["init"], "abs_slope_a": abs(a["slope"]),
                         "abs_slope_b": abs(b["slope"]), "difference": diff, "difference_se": se,
                         "ci_low": low, "ci_high": high, "verdict": word})  # fmt: skip
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)


def analyse(summary: pd.DataFrame, runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The sweep's own frames from ``summary`` and ``runs``: ``lr_optimum`` (of the
    seed-mean curve), ``lr_optimum_seeds``, ``lr_drift`` and ``lr_drift_compare`` (the
    last two only when they have rows: no empty CSV)."""
    seeds = lr_optima(runs, "final_eval_loss", seed=True)
    drift = lr_drift(seeds)
    out = {"lr_optimum": lr_optima(summary), "lr_optimum_seeds": seeds, "lr_drift": drift,
           "lr_drift_compare": drift_compare(drift)}  # fmt: skip
    # no empty CSV: no drift with one width and one depth, no comparison with one scheme
    return {k: v for k, v in out.items() if len(v) or k not in ("lr_drift", "lr_drift_compare")}


def drift_not_applicable() -> dict:
    """Empty cells by design: the held axis's value only (the other is the axis swept);
    an SE and interval only where one exists; a comparison's interval likewise."""

    def depth(df):
        return df["axis"] == "depth"

    def width(df):
        return df["axis"] == "width"

    def no_se(df):
        return df["se_method"] == ""

    def no_fit(df):
        return df["seeds"] == 0

    def unresolved(df):
        return ~np.isfinite(df["ci_low"].astype(float))

    return {
        "lr_drift": {"n_layers": depth, "d_model": width, "intercept": no_fit, "slope": no_fit,
                     **dict.fromkeys(("slope_se", "dof", "ci_low", "ci_high"), no_se)},
        "lr_drift_compare": {"n_layers": depth, "d_model": width, "ci_low": unresolved, "ci_high": unresolved,
                             # an SE needs both drifts' SEs
                             "difference_se": lambda df: ~np.isfinite(df["difference_se"].astype(float))},
        "lr_optimum_seeds": {"best_loss": lambda df: ~np.isfinite(df["best_lr_grid"].astype(float))},
    }  # fmt: skip


def complete_groups(result: ExperimentResult, per_config: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary, runs) restricted to the configurations whose every lr and seed finished
    (a run stopped part-way has optima for what finished)."""
    summary, runs = result["summary"], result["runs"]
    if result.complete or not len(summary):
        return summary, runs
    keys = _keys(summary)
    summary = summary.groupby(keys, sort=False).filter(lambda g: int(g["seeds"].sum()) == per_config)
    runs = runs.merge(summary[keys].drop_duplicates(), on=keys, how="inner")
    return summary, runs


def with_optima(result: ExperimentResult, per_config: int) -> ExperimentResult:
    """``result`` with the sweep's frames added (:func:`analyse`)."""
    summary, runs = complete_groups(result, per_config)
    result.frames.update(analyse(summary, runs))
    result.not_applicable.update(drift_not_applicable())
    return result


def run_lr_sweep(
    grid: TrainGrid,
    progress: Progress | None = None,
    on_partial: Partial | None = None,
    on_checkpoint: OnCheckpoint | None = None,
    save_steps: str | Sequence[int | str] | None = None,
) -> ExperimentResult:
    """Train the grid (a :class:`~tinit.experiments.training.grid.TrainGrid` with its
    ``lrs``) at every lr, depth and width, then find each optimum and its drift. Adds
    frames ``lr_optimum``, ``lr_optimum_seeds``, ``lr_drift`` and ``lr_drift_compare`` to
    those of :func:`run_train`. ``on_checkpoint``, ``save_steps``: each run's checkpoints,
    as :func:`run_train` saves them."""
    if grid.lrs is None:
        raise ConfigError("lr", "an lr sweep needs its learning rates (TrainGrid.lrs)")
    n_per = len(grid.lrs) * len(grid.seeds)  # the runs of one (scheme, norm position, depth, width, warmup)

    def add(result: ExperimentResult) -> ExperimentResult:
        result.meta["lr_criterion"] = LR_CRITERION
        return with_optima(result, n_per)

    return extended(lambda part: run_train(grid, progress, part, on_checkpoint, save_steps), add, on_partial)


# --- tinit sweep lr-sweep: one point per training run -------------------------------

#: The frames a point writes, in the single run's order (variance only when probed).
RUN_STEMS = ("train", "update_ratios", "variance_during_training", "runs")


def lr_sweep_point(
    model: ModelConfig, init: InitConfig, run: RunConfig, train: TrainConfig, data_args: dict, spec: RunSpec,
    progress: Progress | None = None,
) -> ExperimentResult:  # fmt: skip
    """One training run of the grid (``tinit sweep lr-sweep``'s point): the data is
    loaded where the point runs from ``data_args`` (:func:`load_data`'s arguments: the
    same seed gives the same tokens, and no token file travels inside the point)."""
    data = load_data(**data_args)
    return run_specs([spec], train, data, run, progress)


def gather_points(frames: Sequence[dict[str, pd.DataFrame]], train: TrainConfig, floor: float | None,
                  per_config: int) -> dict[str, pd.DataFrame]:  # fmt: skip
    """The single run's frames from its points' frames (in grid order): the runs'
    frames one after the other, the summary over seeds and the sweep's own frames,
    over the configurations whose every lr and seed finished."""
    out = {}
    for stem in RUN_STEMS:
        parts = [f[stem] for f in frames if stem in f]
        if parts or stem != "variance_during_training":
            out[stem] = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if train.probe_points == 0:
        out.pop("variance_during_training", None)
    runs = out["runs"]
    out["summary"] = summarize_runs(runs, floor) if len(runs) else pd.DataFrame(columns=SUMMARY_COLUMNS)
    summary = out["summary"]
    if len(summary):  # a configuration is analysed once every lr and seed of it is in
        keys = _keys(summary)
        summary = summary.groupby(keys, sort=False).filter(lambda g: int(g["seeds"].sum()) == per_config)
        runs = runs.merge(summary[keys].drop_duplicates(), on=keys, how="inner")
    return {**out, **analyse(summary, runs)}


def sweep_not_applicable(train: TrainConfig, floor: float | None, custom: Sequence = ()):
    """The empty cells of the gathered frames, as the single run declares them (MFU:
    empty where the points measured none, on a CPU; ``custom``: the user's schemes)."""

    def rules(frames: dict[str, pd.DataFrame]) -> dict:
        out = not_applicable(train, torch.device("cpu"), floor, custom)
        for stem in ("runs", "summary"):
            out[stem]["mfu"] = lambda df: ~np.isfinite(df["mfu"].astype(float))
        return {**out, **drift_not_applicable()}

    return rules


def lr_sweep_plan(grid: TrainGrid, data_args: dict) -> Plan:
    """``lr-sweep`` as one point per training run (scheme, norm position, depth, width,
    lr, warmup, seed: :func:`lr_sweep_point`), in the single run's order, each loading
    the data from ``data_args`` (:func:`load_data`'s arguments) where it runs; gathering
    concatenates the runs' frames and derives the summary, optima and drifts as the
    single run does (:func:`gather_points`)."""
    from .grid import check_schemes

    grid = grid.checked()
    model, init, run, train, floor = grid.model, grid.init, grid.run, grid.train, grid.data.floor
    specs = grid.specs()
    check_schemes(specs, data_args["seq_len"], train.param_rules)  # before any point starts
    points = [
        Point(lr_sweep_point,
              {"n_layers": s.model.n_layers, "d": s.model.d_model, "lr": f"{s.lr:g}", "warmup": s.warmup,
               "seed": s.init.seed, "init": s.init.scheme, "norm_position": s.model.norm_position},
              {"model": model, "init": init, "run": run, "train": train, "data_args": data_args, "spec": s})
        for s in specs
    ]  # fmt: skip
    per_config = len(grid.lrs) * len(grid.seeds)

    def gather(frames: dict[str, Frames]) -> Frames:
        done = [frames[p.name] for p in points if p.name in frames]
        return gather_points(done, train, floor, per_config)

    big = dataclasses.replace(model, n_layers=max(grid.depths))
    meta = grid_meta(big, init, run, train=dataclasses.asdict(train), data=data_args, grid=grid.record(),
                     lr_criterion=LR_CRITERION)  # fmt: skip
    return Plan("lr-sweep", points, gather, meta, sweep_not_applicable(train, floor, init.schemes))
