"""Depth sweep: does the init recipe transfer from shallow to deep stacks?

The variance law (docs/design.md §1) says that with naive init the final stream
variance grows linearly in depth, v_2L = v0 + 2L s^2, and that with W_O and W_down
scaled by 1/sqrt(2L) it does not, v_2L = v0 + s^2. This experiment measures v_2L at
a list of depths L, with several seeds per depth, by calling
:func:`tinit.experiments.measure.variance.run_variance` for every (L, seed) point (one
implementation of the model and the probe), optionally the first/last-layer W_down
gradient ratio from :func:`tinit.experiments.measure.grad_norms.run_grad_norms`, and fits
v_2L against L per configuration next to the theory's slope.

Seed i of N (i = 0..N-1) is ``init.seed + i`` for the weights and, when
``run.data_seed`` is set, ``run.data_seed + i`` for the tokens (otherwise the tokens
follow the init seed): both weights and tokens are re-drawn per seed. Within one
seed, the depths share their draws (weights are drawn per (seed, layer, role)), so
an L-layer stack's first layers are those of every deeper stack of that seed.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from ... import theory
from ...criteria import LAW_TOL, SPREAD_K, TRANSFER_FROM, TRANSFER_TOL
from ...model.catalogue import get_scheme, known
from ...model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from ...model.init import role_shape_of
from ...model.schemes import environment, evaluate, resolve
from ..configs import check_configs, grid
from ..device import resolve_device
from ..driver import Meter, Run
from ..meta import run_meta
from ..result import ExperimentResult, Partial, Progress
from .grad_norms import require_gradients, run_grad_norms
from .variance import run_variance

#: depth_sweep.csv: one row per (init, norm_position, n_layers, seed).
SWEEP_COLUMNS = [
    "init", "norm_position", "n_layers", "seed", "v0", "v_final", "v_final_rel",
    "branch_var_mean", "sigma2_rel", "pred_closed_final", "rel_err_closed",
    "max_abs_cross_corr", "grad_ratio", "s2_ref_attn", "s2_ref_ffn", "v_growth",
]  # fmt: skip
#: Quantities averaged over seeds in depth_sweep_summary.csv (``<q>_mean``, ``<q>_se``).
SUMMARY_QUANTITIES = (
    "v0", "v_final", "v_final_rel", "branch_var_mean", "sigma2_rel", "pred_closed_final", "grad_ratio",
    "v_growth",
)  # fmt: skip
SUMMARY_COLUMNS = [
    "init", "norm_position", "n_layers", "n_seeds",
    *(f"{q}_{s}" for q in SUMMARY_QUANTITIES for s in ("mean", "se")),
    "theory_v_final", "theory_v_final_rel", "theory_v_growth",
]  # fmt: skip
#: depth_sweep_fit.csv: one row per (init, norm_position).
FIT_COLUMNS = [
    "init", "norm_position", "n_points", "n_seeds", "layers_min", "layers_max",
    "slope", "slope_se", "slope_se_seeds", "intercept", "intercept_se", "r2",
    "theory_slope", "theory_intercept", "slope_z", "depth_scaled", "theory_branch_var",
    "v_final_min_mean", "v_final_min_se", "v_final_max_mean", "v_final_max_se",
    "ratio_max_min", "ratio_max_min_se", "diff_max_min", "diff_se", "within_spread",
    "transfer_from", "transfer_to", "transfer_ratio", "transfer_ratio_se", "transfer_tol",
    "transfer_significant", "transfers", "law_max_rel_err", "law_tol", "law_holds",
    "closed_form", "theory_rel_err_max",
]  # fmt: skip
#: depth_sweep_theory.csv: each configuration's closed form v_2L(L) at every whole L in range.
THEORY_COLUMNS = [
    "init", "norm_position", "n_layers", "theory_v_final", "theory_v_final_rel", "theory_v_growth",
]  # fmt: skip


#: The most depths one sweep takes (a range giving more is refused before it is built).
MAX_DEPTHS = 1000


_INT = r"\s*(\d+)\s*"
_RANGE = re.compile(rf"^{_INT}:{_INT}(?::\s*(x?)\s*(\d+)\s*)?$")
LAYERS_HELP = (
    "give a comma list of whole numbers >= 1 (1,2,4,12,80), a range start:stop:step (12:96:12, "
    "stop included), a geometric range start:stop:xFACTOR (4:128:x2), or a mix (1,2,4:64:x2)"
)


def parse_layers(spec: str | int | Sequence[int]) -> list[int]:
    """The depths of a sweep, ascending, from a spec string (or a list of ints).

    Grammar: comma-separated items, each an integer ``L``, an arithmetic range
    ``start:stop[:step]`` (step 1 by default; ``stop`` included when the steps land on
    it), or a geometric range ``start:stop:xF`` (start, start*F, start*F^2, ... <= stop;
    F a whole number >= 2). Every depth must be >= 1 and appear once. Raises
    :class:`ConfigError` (field ``n_layers``, so the CLI names ``--layers``).
    """
    if isinstance(spec, int) and not isinstance(spec, bool):
        spec = [spec]
    if not isinstance(spec, str):
        values = list(spec)
        if not values:
            raise ConfigError("n_layers", f"no depths given; {LAYERS_HELP}")
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
                raise ConfigError("n_layers", f"{v!r} is not a whole number >= 1; {LAYERS_HELP}")
        spec = ",".join(str(int(v)) for v in values)
    if not spec.strip():
        raise ConfigError("n_layers", f"empty list; {LAYERS_HELP}")
    out: list[int] = []
    for item in spec.split(","):
        if not item.strip():
            raise ConfigError("n_layers", f"{spec!r} has an empty item; {LAYERS_HELP}")
        out.extend(_parse_item(item.strip()))
        if len(out) > MAX_DEPTHS:
            raise ConfigError(
                "n_layers",
                f"{spec!r} gives more than {MAX_DEPTHS} depths (the most a sweep takes)"
            )
    seen: set[int] = set()
    for v in out:
        if v in seen:
            raise ConfigError("n_layers", f"{spec!r} gives {v} more than once; each depth must appear once")
        seen.add(v)
    return sorted(out)


def _parse_item(item: str) -> list[int]:
    if re.fullmatch(r"\s*-?\d+\s*", item):
        v = int(item)
        if v < 1:
            raise ConfigError("n_layers", f"{item!r}: depths must be >= 1; {LAYERS_HELP}")
        return [v]
    m = _RANGE.match(item)
    if not m:
        raise ConfigError("n_layers", f"{item!r} is not a depth or a range; {LAYERS_HELP}")
    start, stop = int(m.group(1)), int(m.group(2))
    geometric, step = m.group(3) == "x", int(m.group(4)) if m.group(4) else 1
    if start < 1:
        raise ConfigError("n_layers", f"{item!r}: depths must be >= 1; {LAYERS_HELP}")
    if stop < start:
        raise ConfigError("n_layers", f"{item!r}: stop {stop} is below start {start}")
    if geometric:
        if step < 2:
            raise ConfigError("n_layers", f"{item!r}: the factor must be a whole number >= 2")
        values, v = [], start
        while v <= stop:
            values.append(v)
            v *= step
        return values
    if step < 1:
        raise ConfigError("n_layers", f"{item!r}: the step must be a whole number >= 1")
    count = (stop - start) // step + 1
    if count > MAX_DEPTHS:  # refused before the list is built
        raise ConfigError("n_layers", f"{item!r} gives {count} depths; a sweep takes at most {MAX_DEPTHS}")
    return list(range(start, stop + 1, step))


def seed_configs(init: InitConfig, run: RunConfig, i: int) -> tuple[InitConfig, RunConfig]:
    """Seed i of a sweep: weights from ``init.seed + i``; tokens from
    ``run.data_seed + i`` when a data seed is set, else from the init seed."""
    ini = dataclasses.replace(init, seed=init.seed + i)
    r = run if run.data_seed is None else dataclasses.replace(run, data_seed=run.data_seed + i)
    return ini, r


def fit_line(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Ordinary least squares y = intercept + slope * x (closed form, numpy):
    slope, intercept, their standard errors (residual variance / (n - 2)) and R^2.
    Standard errors are NaN with fewer than 3 points; everything is NaN with fewer
    than 2 distinct x."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    nan = {"slope": math.nan, "intercept": math.nan, "slope_se": math.nan,
           "intercept_se": math.nan, "r2": math.nan}  # fmt: skip
    n = len(x)
    if n < 2 or np.ptp(x) == 0:
        return nan
    xm, ym = x.mean(), y.mean()
    sxx = float(np.sum((x - xm) ** 2))
    slope = float(np.sum((x - xm) * (y - ym)) / sxx)
    intercept = float(ym - slope * xm)
    resid = y - (intercept + slope * x)
    ssr, sst = float(np.sum(resid**2)), float(np.sum((y - ym) ** 2))
    out = {**nan, "slope": slope, "intercept": intercept, "r2": 1.0 - ssr / sst if sst > 0 else math.nan}
    if n > 2:
        s2 = ssr / (n - 2)
        out["slope_se"] = math.sqrt(s2 / sxx)
        out["intercept_se"] = math.sqrt(s2 * (1.0 / n + xm**2 / sxx))
    return out


def transfer_verdict(ratio: float, ratio_se: float, tol: float = TRANSFER_TOL) -> str:
    """'yes' when v_2L changes by at most ``tol`` (relative) even at the ends of its
    interval of 2 standard errors, 'no' when it changes by more even at the near end,
    'unclear' when the interval straddles the tolerance; with no standard error (one
    seed) the point estimate decides."""
    if not math.isfinite(ratio):
        return "-"
    dev = abs(ratio - 1.0)
    ci = SPREAD_K * ratio_se if ratio_se is not None and math.isfinite(ratio_se) else 0.0
    if dev + ci <= tol:
        return "yes"
    if dev - ci > tol:
        return "no"
    return "unclear"


def transfer_reference(depths: Sequence[int], transfer_from: int | None = None) -> int:
    """The shallow depth of the transfer check: ``transfer_from`` when given (it must be
    swept), else 12 when swept and not the deepest, else the shallowest."""
    depths = sorted(depths)
    if transfer_from is not None:
        if transfer_from not in depths or transfer_from == depths[-1] and len(depths) > 1:
            raise ConfigError(
                "transfer_from", f"{transfer_from} must be a swept depth below the deepest, {depths}"
            )
        return int(transfer_from)
    if TRANSFER_FROM in depths and TRANSFER_FROM < depths[-1]:
        return TRANSFER_FROM
    return int(depths[0])


def round_to_inputs(slope: float, curve: np.ndarray, depths: np.ndarray) -> float:
    """A theory slope computed from a flat curve is float round-off (-3.4e-20): 0 when
    it moves the curve over the depths by less than 1e-9 of its size."""
    if not math.isfinite(slope) or len(depths) < 2:
        return slope
    size = float(np.nanmax(np.abs(curve))) if len(curve) else 0.0
    return 0.0 if abs(slope) * float(np.ptp(depths)) <= 1e-9 * size else slope


def _mean_se(values: pd.Series) -> tuple[float, float]:
    v = values.to_numpy(dtype=np.float64)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return math.nan, math.nan
    se = float(np.std(v, ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan
    return float(v.mean()), se


def is_depth_scaled(recipe: str, model: ModelConfig, init: InitConfig | None = None) -> bool:
    """Whether the scheme makes a branch's variance depend on the depth L (its depth
    factor or its branch multiplier names L). Gaussian branches (``--branch
    gaussian``) ignore the init: their variance is S2 at every depth."""
    s = init.lookup(recipe) if init is not None else get_scheme(recipe)
    names = set(s.branch_mult.names)
    for f in s.depth_factor or ():
        names |= f.names
    return "L" in names and model.branch == "model"


def theory_branch_var(rows: pd.DataFrame, depth_scaled: bool | None = None) -> float:
    """The s^2 the theory lines use, from one configuration's rows (all depths and
    seeds): the mean over rows of the two sublayers' reference branch variances (the
    s^2 of the scheme's closed form: the branch variance itself when it does not depend
    on L, 2L s_k^2 for gpt2's 1/sqrt(2L), ...), which needs no naive run."""
    refs = rows[["s2_ref_attn", "s2_ref_ffn"]].to_numpy(dtype=np.float64)
    return float(np.nanmean(refs)) if np.isfinite(refs).any() else math.nan


@dataclasses.dataclass(frozen=True)
class TheoryLine:
    """One configuration's closed form v_2L(L): the scheme's recursion with the
    reference branch variances (means over every depth and seed) and v0 at L: the mean
    over rows of v0 / e(L_row), times e(L), where e(L) is the variance the scheme gives
    the embedding output at depth L (std^2 times its multiplier^2; constant for most
    schemes, (9L)^(-1/2) / d for T-Fixup)."""

    recipe: str
    position: str
    v0_unit: float
    refs: tuple[float, float]
    model: ModelConfig
    init: InitConfig

    def v0_at(self, L: int) -> float:
        return self.v0_unit * embed_variance(self.recipe, self.model, self.init, L)

    @property
    def depth_scaled(self) -> bool:
        return is_depth_scaled(self.recipe, self.model, self.init)

    @property
    def branch_var(self) -> float:
        return float(np.nanmean(self.refs)) if np.isfinite(self.refs).any() else math.nan

    def v_final(self, L: int) -> float:
        cfg = dataclasses.replace(self.model, n_layers=int(L))
        ini = dataclasses.replace(self.init, recipe=self.recipe)
        mult = theory.addition_multipliers(ini.scheme, cfg, ini)
        return float(theory.pred_closed_scheme(self.v0_at(L), self.refs, mult, self.position)[-1])

    def curve(self, depths) -> np.ndarray:
        return np.array([self.v_final(L) for L in depths], dtype=np.float64)


def theory_line(
    rows: pd.DataFrame, recipe: str, pos: str, model: ModelConfig, init: InitConfig
) -> TheoryLine:
    refs = tuple(float(np.nanmean(rows[c])) if rows[c].notna().any() else math.nan
                 for c in ("s2_ref_attn", "s2_ref_ffn"))  # fmt: skip
    e = np.array([embed_variance(recipe, model, init, int(L)) for L in rows["n_layers"]])
    return TheoryLine(recipe, pos, float(np.mean(rows["v0"].to_numpy() / e)), refs, model, init)


def embed_variance(recipe: str, model: ModelConfig, init: InitConfig, L: int) -> float:
    """The embedding output's variance under the scheme at depth L, up to the draws:
    (embed std x embedding multiplier)^2; 1 for an RMS-normalised embedding (nanochat)."""
    cfg = dataclasses.replace(model, n_layers=int(L))
    ini = dataclasses.replace(init, recipe=recipe)
    s = ini.scheme
    if s.embed_norm:
        return 1.0
    env = environment(cfg, ini, -1, role_shape_of(cfg, "embed", ini))
    std = resolve(s, "embed", env).std_drawn
    mult = evaluate(s.embed_mult, env, s.name)
    return (std * mult) ** 2 if std > 0 else 1.0


def summarize_points(sweep: pd.DataFrame, theory_lines: dict) -> pd.DataFrame:
    """Mean and standard error over seeds per (init, norm_position, n_layers)."""
    rows = []
    for (recipe, pos, L), d in sweep.groupby(["init", "norm_position", "n_layers"], sort=False):
        row = {"init": recipe, "norm_position": pos, "n_layers": L, "n_seeds": len(d)}
        for q in SUMMARY_QUANTITIES:
            row[f"{q}_mean"], row[f"{q}_se"] = _mean_se(d[q])
        line = theory_lines[(recipe, pos)]
        row["theory_v_final"] = np.float64(line.v_final(L))
        v0 = np.float64(line.v0_at(L))  # float64: a vanished v0 gives inf / nan (flagged)
        row["theory_v_final_rel"] = row["theory_v_final"] / v0
        row["theory_v_growth"] = row["theory_v_final"] - v0
        rows.append(row)
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def _max_abs(values) -> float:
    """The largest |value| ignoring NaNs; NaN when every value is NaN (no warning)."""
    v = np.abs(np.asarray(values, dtype=np.float64))
    v = v[~np.isnan(v)]
    return float(v.max()) if v.size else math.nan


def fit_configs(
    sweep: pd.DataFrame, summary: pd.DataFrame, theory_lines: dict, transfer_from: int | None = None
) -> pd.DataFrame:
    """Per configuration: the least-squares fit of v_final against L over every
    (L, seed) row, the theory's slope and intercept over the same depths, the
    statistical comparison of the shallowest and the deepest depth, the practical
    transfer check from ``transfer_from`` (:func:`transfer_reference`) to the deepest,
    and the per-depth law's largest error."""
    rows = []
    for (recipe, pos), d in sweep.groupby(["init", "norm_position"], sort=False):
        line = theory_lines[(recipe, pos)]
        fit = fit_line(d["n_layers"], d["v_final"])
        # per-seed slopes: independent draws, so their spread is a standard error that
        # does not assume independent residuals (depths of one seed share their layers)
        seeds = sorted(d["seed"].unique())
        per_seed = [fit_line(s["n_layers"], s["v_final"])["slope"] for _, s in d.groupby("seed")]
        slope_se_seeds = (
            float(np.std(per_seed, ddof=1) / math.sqrt(len(per_seed))) if len(seeds) > 1 else math.nan
        )
        depths = np.sort(d["n_layers"].unique())
        curve = line.curve(depths)
        th = fit_line(depths, curve) if len(depths) > 1 else {"slope": math.nan, "intercept": math.nan}
        th["slope"] = round_to_inputs(th["slope"], curve, depths)
        s = summary[(summary["init"] == recipe) & (summary["norm_position"] == pos)].set_index("n_layers")
        lo, hi = s.loc[depths[0]], s.loc[depths[-1]]
        a, a_se, b, b_se = lo["v_final_mean"], lo["v_final_se"], hi["v_final_mean"], hi["v_final_se"]
        ratio = b / a
        ratio_se = abs(ratio) * math.sqrt((a_se / a) ** 2 + (b_se / b) ** 2)
        diff, diff_se = b - a, math.sqrt(a_se**2 + b_se**2)
        ref = transfer_reference(depths, transfer_from)
        t_a, t_a_se = s.loc[ref, "v_final_mean"], s.loc[ref, "v_final_se"]
        t_ratio = b / t_a
        t_ratio_se = abs(t_ratio) * math.sqrt((t_a_se / t_a) ** 2 + (b_se / b) ** 2)
        t_diff_se = math.sqrt(t_a_se**2 + b_se**2)
        law_err = (s["v_final_mean"] / s["pred_closed_final_mean"] - 1.0).abs().max()
        one = len(depths) == 1  # nothing to compare: no ratio, change or transfer verdict
        # the seeds' spread is the honest standard error; one seed has only the OLS one
        se_used = slope_se_seeds if len(seeds) > 1 else fit["slope_se"]
        rows.append({
            "init": recipe, "norm_position": pos, "n_points": len(d), "n_seeds": len(seeds),
            "layers_min": int(depths[0]), "layers_max": int(depths[-1]),
            **fit,
            "theory_slope": th["slope"], "theory_intercept": th["intercept"],
            "slope_z": (fit["slope"] - th["slope"]) / se_used if se_used > 0 else math.nan,
            "depth_scaled": line.depth_scaled, "theory_branch_var": line.branch_var,
            "v_final_min_mean": a, "v_final_min_se": a_se, "v_final_max_mean": b, "v_final_max_se": b_se,
            **dict.fromkeys(("ratio_max_min", "ratio_max_min_se", "diff_max_min", "diff_se", "transfer_ratio",
                             "transfer_ratio_se", "slope_se_seeds"), math.nan),
            **({} if one else {"ratio_max_min": ratio, "ratio_max_min_se": ratio_se, "diff_max_min": diff,
                               "diff_se": diff_se, "transfer_ratio": t_ratio, "transfer_ratio_se": t_ratio_se,
                               "slope_se_seeds": slope_se_seeds}),
            "within_spread": (
                None if one or not math.isfinite(diff_se) else bool(abs(diff) <= SPREAD_K * diff_se)
            ),
            "transfer_from": ref, "transfer_to": int(depths[-1]), "transfer_tol": TRANSFER_TOL,
            "transfer_significant": (
                None if one or not math.isfinite(t_diff_se) else bool(abs(b - t_a) > SPREAD_K * t_diff_se)
            ),
            "transfers": None if one else transfer_verdict(t_ratio, t_ratio_se),
            "law_max_rel_err": float(law_err), "law_tol": LAW_TOL,
            "law_holds": bool(law_err <= LAW_TOL) if math.isfinite(law_err) else None,
            "closed_form": line.init.lookup(recipe).closed_form,
            "theory_rel_err_max": _max_abs(s["v_final_mean"] / s["theory_v_final"] - 1.0),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=FIT_COLUMNS)


def run_depth_sweep(
    model: ModelConfig | None = None,
    init: InitConfig | None = None,
    run: RunConfig | None = None,
    layers: str | Sequence[int] = (1, 2, 4, 8, 12, 24, 48, 80),
    seeds: int = 3,
    inits: Sequence[str] = ("naive", "scaled"),
    norm_positions: Sequence[str] | None = None,
    grads: bool = True,
    progress: Progress | None = None,
    on_partial: Partial | None = None,
    transfer_from: int | None = None,
) -> ExperimentResult:
    """Final stream variance (and W_down gradient ratio) against depth.

    For every depth L in ``layers`` (a list, or a spec string: see
    :func:`parse_layers`) and seed i < ``seeds``, runs :func:`run_variance` (and,
    with ``grads``, :func:`run_grad_norms`) on ``model`` with ``n_layers = L`` for
    each (init recipe, norm position). ``model.n_layers`` itself is ignored.

    Returns frames ``depth_sweep`` (one row per configuration, L and seed),
    ``depth_sweep_summary`` (mean and standard error over seeds per configuration
    and L, with the theory line) and ``depth_sweep_fit`` (per configuration: the
    fit of v_final against L, the theory slope and the transfer check). Raises
    :class:`IncompleteRun`, holding the finished points, if a point fails.
    ``on_partial`` is called with the result so far after each (L, seed) point.

    >>> res = run_depth_sweep(ModelConfig(d_model=64, n_heads=2), layers="1:8:x2", seeds=2,
    ...                       run=RunConfig(batch=2, seq_len=16), grads=False)
    >>> res["depth_sweep_fit"][["init", "norm_position", "slope", "theory_slope"]]  # doctest: +SKIP
    """
    model, init, run = model or ModelConfig(), init or InitConfig(), run or RunConfig()
    depths = parse_layers(layers)
    ref = transfer_reference(depths, transfer_from)
    if grads:
        require_gradients(model, run)
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ConfigError("seeds", f"must be a whole number >= 1, got {seeds!r}")
    configs = list(grid(inits, norm_positions, init.schemes))
    check_configs(model, init, run, configs, depths)
    device = resolve_device(run.device)
    base = dataclasses.replace(model, n_layers=depths[-1])
    # progress in block passes: a forward per layer and configuration, and for the
    # gradients a forward and a backward (grad_norms counts 2 per layer)
    per_layer = len(configs) * (3 if grads else 1)
    records: list[dict] = []
    streamed: dict[int, bool] = {}
    criterion = f"|v(L_max) - v(L_min)| <= {SPREAD_K:g} * sqrt(se_max^2 + se_min^2)"
    meta = run_meta(base, init, run, device, configurations=configs, layers=depths, seeds=seeds,
                    seed_values=[init.seed + i for i in range(seeds)], grads=grads,
                    spread_criterion=criterion, transfer_from=ref, transfer_tol=TRANSFER_TOL,
                    law_tol=LAW_TOL)  # fmt: skip

    def frames() -> dict[str, pd.DataFrame]:
        meta["streamed"] = streamed
        return assemble(records, configs, model, init, ref)

    na = not_applicable(grads and model.branch == "model", init.schemes)
    driver = Run(meta, frames, na, meter=Meter(device), on_partial=on_partial,
                 progress=progress, total=per_layer * seeds * sum(depths))  # fmt: skip

    def measure(point: tuple[int, int]) -> tuple[list[dict], list[dict]]:
        L, i = point
        span = _span(progress, driver.tick.done, per_layer * L, driver.tick.total)
        return depth_sweep_point(model, init, run, L, i, inits, norm_positions, grads, progress=span)

    def collect(point: tuple[int, int], measured: tuple[list[dict], list[dict]]) -> None:
        (L, _), (rows, metas) = point, measured
        streamed[L] = bool(metas[0].get("streamed"))
        records.extend(rows)
        driver.tick(per_layer * L)

    def name(point: tuple[int, int]) -> str:
        return f"L={point[0]}/seed={init.seed + point[1]}"

    driver.each([(L, i) for L in depths for i in range(seeds)], measure, collect,
                label=lambda p: f"L={p[0]}, seed {init.seed + p[1]}", span=name,
                inner=lambda measured: measured[1])  # fmt: skip
    return driver.result()


def not_applicable(grad_ratio: bool, custom=()) -> dict:
    """The cells of the three frames that have no value by design (written empty):
    the gradient ratio without gradients (--no-grads, Gaussian branches), standard
    errors over one seed, OLS errors below three points, a fit over one depth."""

    def one_seed(df):
        return df["n_seeds"] < 2

    def one_depth(df):
        return df["layers_min"] == df["layers_max"]

    def under_three(df):
        return df["n_points"] < 3

    def flat(df):
        return df["diff_max_min"] == 0

    def zero_branches(df):  # W_O and W_down exactly 0 (zero-out, nanochat): no branch to measure
        return df["init"].map(lambda name: _zero_outputs(name, custom)).astype(bool)

    def no_grad_ratio(df):  # a branch gain of 0 (ReZero): W_down receives no gradient at init
        return df["init"].map(lambda name: _zero_gain(name, custom)).astype(bool) | (not grad_ratio)

    def no_closed_form(df):  # a user's scheme (--init-file) that declares no depth factor
        return df["init"].map(lambda name: _no_closed_form(name, custom)).astype(bool)

    summary = {f"{q}_se": one_seed for q in SUMMARY_QUANTITIES}
    fit = {
        "slope_se": under_three, "intercept_se": under_three,
        # z and r2 of a line through identical values (zero-out's v_2L = v0 at every depth,
        # the same in every seed) are 0/0
        "slope_z": lambda df: one_depth(df) | (one_seed(df) & under_three(df)) | flat(df),
        "v_final_min_se": one_seed, "v_final_max_se": one_seed,
        # one depth: nothing to compare (no ratio, change or transfer); one seed: no s.e.
        **dict.fromkeys(("ratio_max_min", "diff_max_min", "transfer_ratio"), one_depth),
        **dict.fromkeys(("ratio_max_min_se", "diff_se", "transfer_ratio_se", "slope_se_seeds"),
                        lambda df: one_depth(df) | one_seed(df)),
        **dict.fromkeys(("slope", "intercept", "theory_slope", "theory_intercept"), one_depth),
        "r2": lambda df: one_depth(df) | flat(df),
        "theory_branch_var": zero_branches,
    }  # fmt: skip
    summary["grad_ratio_mean"] = no_grad_ratio
    summary["grad_ratio_se"] = lambda df: no_grad_ratio(df) | one_seed(df)
    def no_reference(df):
        return zero_branches(df) | no_closed_form(df)

    sweep = {"grad_ratio": no_grad_ratio, "max_abs_cross_corr": zero_branches,
             **dict.fromkeys(("s2_ref_attn", "s2_ref_ffn"), no_reference),
             **dict.fromkeys(("pred_closed_final", "rel_err_closed"), no_closed_form)}
    # without a closed form there is no theory line, law or comparison with them
    theory_columns = ("theory_v_final", "theory_v_final_rel", "theory_v_growth")
    summary.update(dict.fromkeys(("pred_closed_final_mean", *theory_columns), no_closed_form))
    summary["pred_closed_final_se"] = lambda df: no_closed_form(df) | one_seed(df)
    for col in ("theory_slope", "theory_intercept", "theory_branch_var", "law_max_rel_err",
                "theory_rel_err_max", "slope_z"):
        rule = fit.get(col)
        fit[col] = (lambda df, r=rule: no_closed_form(df) | (r(df) if r else False))
    theory = dict.fromkeys(theory_columns, no_closed_form)
    return {"depth_sweep": sweep, "depth_sweep_summary": summary, "depth_sweep_fit": fit,
            "depth_sweep_theory": theory}


def _no_closed_form(recipe: str, custom=()) -> bool:
    return not known(recipe, custom) or get_scheme(recipe, custom).depth_factor is None


def _zero_outputs(recipe: str, custom=()) -> bool:
    if not known(recipe, custom):
        return False
    s = get_scheme(recipe, custom)
    return s.rule("o").dist == "zero" and s.rule("down").dist == "zero"


def _zero_gain(recipe: str, custom=()) -> bool:
    if not known(recipe, custom):
        return False
    f = get_scheme(recipe, custom).branch_mult
    return not f.names and f() == 0


def depth_sweep_point(
    model: ModelConfig,
    init: InitConfig,
    run: RunConfig,
    n_layers: int,
    seed_index: int,
    inits: Sequence[str] = ("naive", "scaled"),
    norm_positions: Sequence[str] | None = None,
    grads: bool = True,
    progress: Progress | None = None,
) -> tuple[list[dict], list[dict]]:
    """One point of the sweep: depth ``n_layers``, seed index ``seed_index`` (see
    :func:`seed_configs`), for each (init recipe, norm position) given. Determined by
    its arguments alone, so a point gives the same rows in any process or on any host
    and a configuration's rows do not depend on which other configurations run beside
    it (tokens follow the seed, weights the seed, layer and role).

    Returns the rows of ``depth_sweep`` (columns :data:`SWEEP_COLUMNS`) and the metas
    of the runs inside (variance, then gradients). :func:`assemble` turns the rows of
    every point into the sweep's frames."""
    cfg = dataclasses.replace(model, n_layers=n_layers)
    ini, r = seed_configs(init, run, seed_index)
    per = len(list(grid(inits, norm_positions, init.schemes))) * n_layers
    total = per * (3 if grads else 1)
    var = run_variance(cfg, ini, r, inits, norm_positions, progress=_span(progress, 0, per, total))
    metas, ratios = [var.meta], {}
    if grads:
        span = _span(progress, per, 2 * per, total)
        grad = run_grad_norms(cfg, ini, r, inits, norm_positions, batches=1, progress=span)
        metas.append(grad.meta)
        for g in grad["summary"].itertuples(index=False):
            ratios[(g.init, g.norm_position)] = float(g.down_ratio_first_last)
    rows = []
    for row in var["summary"].to_dict("records"):
        row["grad_ratio"] = ratios.get((row["init"], row["norm_position"]), math.nan)
        rows.append({c: row[c] for c in SWEEP_COLUMNS})
    return rows, metas


def _span(progress: Progress | None, start: int, width: int, total: int) -> Progress | None:
    """A sub-run's progress (done, its total) mapped onto [start, start + width] of ours."""
    if progress is None:
        return None

    def update(done: int, sub_total: int) -> None:
        progress(start + (done * width) // max(sub_total, 1), total)

    return update


def assemble(
    records: list[dict], configs: list[tuple[str, str]], model: ModelConfig, init: InitConfig | None = None,
    transfer_from: int | None = None,
) -> dict[str, pd.DataFrame]:
    """The four frames from the per-point rows (empty frames when there are none)."""
    init = init or InitConfig()
    if not records:
        return {
            "depth_sweep": pd.DataFrame(columns=SWEEP_COLUMNS),
            "depth_sweep_summary": pd.DataFrame(columns=SUMMARY_COLUMNS),
            "depth_sweep_fit": pd.DataFrame(columns=FIT_COLUMNS),
            "depth_sweep_theory": pd.DataFrame(columns=THEORY_COLUMNS),
        }
    order = {c: i for i, c in enumerate(configs)}
    sweep = pd.DataFrame(records)
    sweep["_order"] = [order[(a, b)] for a, b in zip(sweep["init"], sweep["norm_position"], strict=True)]
    sweep = sweep.sort_values(["_order", "n_layers", "seed"], kind="stable")[SWEEP_COLUMNS].reset_index(
        drop=True
    )
    theory_lines = {}
    for (recipe, pos), d in sweep.groupby(["init", "norm_position"], sort=False):
        theory_lines[(recipe, pos)] = theory_line(d, recipe, pos, model, init)
    with np.errstate(all="ignore"):  # a vanished v0 gives inf / nan (flagged), not a warning
        summary = summarize_points(sweep, theory_lines)
        fit = fit_configs(sweep, summary, theory_lines, _swept_reference(sweep, transfer_from))
        theory_curves = theory_frame(sweep, theory_lines)
    return {
        "depth_sweep": sweep,
        "depth_sweep_summary": summary,
        "depth_sweep_fit": fit,
        "depth_sweep_theory": theory_curves,
    }


def _swept_reference(sweep: pd.DataFrame, transfer_from: int | None) -> int | None:
    """The reference depth when it is among the finished points (an interrupted sweep
    may not have reached it): else the default rule on what was measured."""
    done = sorted(sweep["n_layers"].unique())
    return transfer_from if transfer_from in done and transfer_from < done[-1] else None


def theory_frame(sweep: pd.DataFrame, theory_lines: dict) -> pd.DataFrame:
    """Each configuration's closed form at every whole depth from the shallowest to the
    deepest swept (at most 200 depths, geometrically spaced), for the plot's lines."""
    lo, hi = int(sweep["n_layers"].min()), int(sweep["n_layers"].max())
    depths = np.unique(np.round(np.geomspace(lo, hi, min(200, hi - lo + 1))).astype(int))
    rows = []
    for (recipe, pos), line in theory_lines.items():
        for L, v in zip(depths, line.curve(depths), strict=True):
            rows.append({"init": recipe, "norm_position": pos, "n_layers": int(L), "theory_v_final": v,
                         "theory_v_final_rel": np.float64(v) / np.float64(line.v0_at(L)),
                         "theory_v_growth": v - line.v0_at(L)})  # fmt: skip
    return pd.DataFrame(rows, columns=THEORY_COLUMNS)
