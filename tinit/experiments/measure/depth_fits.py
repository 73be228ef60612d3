"""The depth sweep's statistics: per-depth means and standard errors over seeds, the
least-squares fit of v_2L against L next to the scheme's closed form (its slope and
intercept over the same depths), the transfer check from a shallow depth to the deepest
(:func:`transfer_verdict`), and each configuration's theory line (:class:`TheoryLine`,
the recursion of :func:`tinit.theory.pred_closed_scheme` with the measured reference
branch variances). Pure functions of the sweep's rows: no model is built here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from ... import theory
from ...criteria import LAW_TOL, SPREAD_K, TRANSFER_FROM, TRANSFER_TOL
from ...model.catalogue import get_scheme
from ...model.config import ConfigError, InitConfig, ModelConfig
from ...model.draws import environment, evaluate, resolve
from ...model.init import role_shape_of

#: Quantities averaged over seeds in depth_sweep_summary.csv (``<q>_mean``, ``<q>_se``).
SUMMARY_QUANTITIES = (
    "v0", "v_final", "v_final_rel", "branch_var_mean", "sigma2_rel", "pred_closed_final", "grad_ratio",
    "v_growth", "mf_v_final", "mf_v_growth",
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
    "closed_form", "theory_rel_err_max", "mf_ratio_max_min", "mf_transfer_ratio", "mf_transfer_z",
]  # fmt: skip
#: depth_sweep_theory.csv: each configuration's closed form v_2L(L) at every whole L in range.
THEORY_COLUMNS = [
    "init", "norm_position", "n_layers", "theory_v_final", "theory_v_final_rel", "theory_v_growth",
]  # fmt: skip


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


def is_depth_scaled(scheme: str, model: ModelConfig, init: InitConfig | None = None) -> bool:
    """Whether the scheme makes a branch's variance depend on the depth L (its depth
    factor or its branch multiplier names L). Gaussian branches (``--branch
    gaussian``) ignore the init: their variance is S2 at every depth."""
    s = init.lookup(scheme) if init is not None else get_scheme(scheme)
    names = set(s.branch_mult.names)
    for f in s.depth_factor or ():
        names |= f.names
    return "L" in names and model.branch == "model"


@dataclasses.dataclass(frozen=True)
class TheoryLine:
    """One configuration's closed form v_2L(L): the scheme's recursion with the
    reference branch variances (means over every depth and seed) and v0 at L: the mean
    over rows of v0 / e(L_row), times e(L), where e(L) is the variance the scheme gives
    the embedding output at depth L (std^2 times its multiplier^2; constant for most
    schemes, (9L)^(-1/2) / d for T-Fixup)."""

    scheme: str
    position: str
    v0_unit: float
    refs: tuple[float, float]
    model: ModelConfig
    init: InitConfig

    def v0_at(self, L: int) -> float:
        return self.v0_unit * embed_variance(self.scheme, self.model, self.init, L)

    @property
    def depth_scaled(self) -> bool:
        return is_depth_scaled(self.scheme, self.model, self.init)

    @property
    def branch_var(self) -> float:
        return float(np.nanmean(self.refs)) if np.isfinite(self.refs).any() else math.nan

    def v_final(self, L: int) -> float:
        cfg = dataclasses.replace(self.model, n_layers=int(L))
        ini = dataclasses.replace(self.init, scheme=self.scheme)
        mult = theory.addition_multipliers(ini.definition, cfg, ini)
        return float(theory.pred_closed_scheme(self.v0_at(L), self.refs, mult, self.position)[-1])

    def curve(self, depths) -> np.ndarray:
        return np.array([self.v_final(L) for L in depths], dtype=np.float64)


def theory_line(
    rows: pd.DataFrame, scheme: str, pos: str, model: ModelConfig, init: InitConfig
) -> TheoryLine:
    refs = tuple(float(np.nanmean(rows[c])) if rows[c].notna().any() else math.nan
                 for c in ("s2_ref_attn", "s2_ref_ffn"))  # fmt: skip
    e = np.array([embed_variance(scheme, model, init, int(L)) for L in rows["n_layers"]])
    return TheoryLine(scheme, pos, float(np.mean(rows["v0"].to_numpy() / e)), refs, model, init)


def embed_variance(scheme: str, model: ModelConfig, init: InitConfig, L: int) -> float:
    """The embedding output's variance under the scheme at depth L, up to the draws:
    (embed std x embedding multiplier)^2; 1 for an RMS-normalised embedding (nanochat)."""
    cfg = dataclasses.replace(model, n_layers=int(L))
    ini = dataclasses.replace(init, scheme=scheme)
    s = ini.definition
    if s.embed_norm:
        return 1.0
    env = environment(cfg, ini, -1, role_shape_of(cfg, "embed", ini))
    std = resolve(s, "embed", env).std_drawn
    mult = evaluate(s.embed_mult, env, s.name)
    return (std * mult) ** 2 if std > 0 else 1.0


def summarize_points(sweep: pd.DataFrame, theory_lines: dict) -> pd.DataFrame:
    """Mean and standard error over seeds per (init, norm_position, n_layers)."""
    rows = []
    for (scheme, pos, L), d in sweep.groupby(["init", "norm_position", "n_layers"], sort=False):
        row = {"init": scheme, "norm_position": pos, "n_layers": L, "n_seeds": len(d)}
        for q in SUMMARY_QUANTITIES:
            row[f"{q}_mean"], row[f"{q}_se"] = _mean_se(d[q])
        line = theory_lines[(scheme, pos)]
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
    transfer check from ``transfer_from`` (:func:`transfer_reference`; a configuration
    whose points do not reach past it takes the default rule) to the deepest, and the
    per-depth law's largest error."""
    rows = []
    for (scheme, pos), d in sweep.groupby(["init", "norm_position"], sort=False):
        line = theory_lines[(scheme, pos)]
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
        s = summary[(summary["init"] == scheme) & (summary["norm_position"] == pos)].set_index("n_layers")
        lo, hi = s.loc[depths[0]], s.loc[depths[-1]]
        a, a_se, b, b_se = lo["v_final_mean"], lo["v_final_se"], hi["v_final_mean"], hi["v_final_se"]
        ratio = b / a
        ratio_se = abs(ratio) * math.sqrt((a_se / a) ** 2 + (b_se / b) ** 2)
        diff, diff_se = b - a, math.sqrt(a_se**2 + b_se**2)
        # a reference this configuration has not reached below its deepest (a run stopped,
        # or written so far, part-way through its depths): the default rule on its depths
        reached = transfer_from in depths and transfer_from < depths[-1]
        ref = transfer_reference(depths, transfer_from if reached else None)
        t_a, t_a_se = s.loc[ref, "v_final_mean"], s.loc[ref, "v_final_se"]
        t_ratio = b / t_a
        t_ratio_se = abs(t_ratio) * math.sqrt((t_a_se / t_a) ** 2 + (b_se / b) ** 2)
        t_diff_se = math.sqrt(t_a_se**2 + b_se**2)
        law_err = (s["v_final_mean"] / s["pred_closed_final_mean"] - 1.0).abs().max()
        # the large-width prediction's ratios, from its seed means (each seed's prediction is
        # made for that seed's tokens), and how many s.e. the measured transfer is from it
        mf_a, mf_t, mf_b = (np.float64(s.loc[L, "mf_v_final_mean"]) for L in (depths[0], ref, depths[-1]))
        mf_ratio, mf_t_ratio = mf_b / mf_a, mf_b / mf_t
        one = len(depths) == 1  # nothing to compare: no ratio, change or transfer verdict
        # the seeds' spread is the honest standard error; one seed has only the OLS one
        se_used = slope_se_seeds if len(seeds) > 1 else fit["slope_se"]
        rows.append({
            "init": scheme, "norm_position": pos, "n_points": len(d), "n_seeds": len(seeds),
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
            "closed_form": theory.closed_form_text(line.init.lookup(scheme), pos),
            "theory_rel_err_max": _max_abs(s["v_final_mean"] / s["theory_v_final"] - 1.0),
            **dict.fromkeys(("mf_ratio_max_min", "mf_transfer_ratio", "mf_transfer_z"), math.nan),
            **({} if one else {"mf_ratio_max_min": float(mf_ratio), "mf_transfer_ratio": float(mf_t_ratio),
                               "mf_transfer_z": float((t_ratio - mf_t_ratio) / t_ratio_se)
                               if t_ratio_se > 0 else math.nan}),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=FIT_COLUMNS)


def theory_frame(sweep: pd.DataFrame, theory_lines: dict) -> pd.DataFrame:
    """Each configuration's closed form at every whole depth from the shallowest to the
    deepest swept (at most 200 depths, geometrically spaced), for the plot's lines."""
    lo, hi = int(sweep["n_layers"].min()), int(sweep["n_layers"].max())
    depths = np.unique(np.round(np.geomspace(lo, hi, min(200, hi - lo + 1))).astype(int))
    rows = []
    for (scheme, pos), line in theory_lines.items():
        for L, v in zip(depths, line.curve(depths), strict=True):
            rows.append({"init": scheme, "norm_position": pos, "n_layers": int(L), "theory_v_final": v,
                         "theory_v_final_rel": np.float64(v) / np.float64(line.v0_at(L)),
                         "theory_v_growth": v - line.v0_at(L)})  # fmt: skip
    return pd.DataFrame(rows, columns=THEORY_COLUMNS)
