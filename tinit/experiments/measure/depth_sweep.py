"""Depth sweep: does the init scheme transfer from shallow to deep stacks?

The variance law (docs/design.md §1) says that with naive init the final stream
variance grows linearly in depth, v_2L = v0 + 2L s^2, and that with W_O and W_down
scaled by 1/sqrt(2L) it does not, v_2L = v0 + s^2. This experiment measures v_2L at
a list of depths L, with several seeds per depth, by calling
:func:`tinit.experiments.measure.variance.run_variance` for every (L, seed) point (one
implementation of the model and the probe), optionally the first/last-layer W_down
gradient ratio from :func:`tinit.experiments.measure.grad_norms.run_grad_norms`, and fits
v_2L against L per configuration next to the theory's slope (the statistics are in
:mod:`tinit.experiments.measure.depth_fits`).

Seed i of N (i = 0..N-1) is ``init.seed + i`` for the weights and, when
``run.data_seed`` is set, ``run.data_seed + i`` for the tokens (otherwise the tokens
follow the init seed): both weights and tokens are re-drawn per seed. Within one
seed, the depths share their draws (weights are drawn per (seed, layer, role)), so
an L-layer stack's first layers are those of every deeper stack of that seed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from ...criteria import LAW_TOL, SPREAD_K, TRANSFER_TOL
from ...model.catalogue import get_scheme, known
from ...model.checks import MAX_SEEDS, check_count
from ...model.config import InitConfig, ModelConfig, RunConfig
from ..configs import check_configs, grid, parse_layers
from ..device import resolve_device
from ..driver import Meter, run_plan, sub_progress
from ..memory import check_memory
from ..meta import run_meta
from ..points import Frames, Plan, Point, grid_meta
from ..result import ExperimentResult, Partial, Progress
from .depth_fits import (
    FIT_COLUMNS,
    SUMMARY_COLUMNS,
    SUMMARY_QUANTITIES,
    THEORY_COLUMNS,
    fit_configs,
    summarize_points,
    theory_frame,
    theory_line,
    transfer_reference,
)
from .grad_norms import require_gradients, run_grad_norms
from .variance import run_variance

#: depth_sweep.csv: one row per (init, norm_position, n_layers, seed).
SWEEP_COLUMNS = [
    "init", "norm_position", "n_layers", "seed", "v0", "v_final", "v_final_rel",
    "branch_var_mean", "sigma2_rel", "pred_closed_final", "rel_err_closed",
    "max_abs_cross_corr", "grad_ratio", "s2_ref_attn", "s2_ref_ffn", "v_growth",
    "mf_v_final", "mf_v_growth", "rel_err_mf",
]  # fmt: skip


def seed_configs(init: InitConfig, run: RunConfig, i: int) -> tuple[InitConfig, RunConfig]:
    """Seed i of a sweep: weights from ``init.seed + i``; tokens from
    ``run.data_seed + i`` when a data seed is set, else from the init seed."""
    ini = dataclasses.replace(init, seed=init.seed + i)
    r = run if run.data_seed is None else dataclasses.replace(run, data_seed=run.data_seed + i)
    return ini, r


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
    each (init scheme, norm position). ``model.n_layers`` itself is ignored.

    Returns frames ``depth_sweep`` (one row per configuration, L and seed),
    ``depth_sweep_summary`` (mean and standard error over seeds per configuration
    and L, with the theory line) and ``depth_sweep_fit`` (per configuration: the
    fit of v_final against L, the theory slope and the transfer check). Raises
    :class:`IncompleteRun`, holding the finished points, if a point fails.
    ``on_partial`` gets a function building the result so far after each (L, seed) point.

    >>> res = run_depth_sweep(ModelConfig(d_model=64, n_heads=2), layers="1:8:x2", seeds=2,
    ...                       run=RunConfig(batch=2, seq_len=16), grads=False)
    >>> res["depth_sweep_fit"][["init", "norm_position", "slope", "theory_slope"]]  # doctest: +SKIP
    """
    model, init, run = model or ModelConfig(), init or InitConfig(), run or RunConfig()
    depths = parse_layers(layers)
    plan = depth_sweep_plan(model, init, run, depths, seeds, inits, norm_positions, grads, transfer_from,
                            here=True)  # fmt: skip
    device = resolve_device(run.device)
    base = dataclasses.replace(model, n_layers=depths[-1])
    streamed: dict[int, bool] = {}
    criterion = f"|v(L_max) - v(L_min)| <= {SPREAD_K:g} * sqrt(se_max^2 + se_min^2)"
    meta = run_meta(base, init, run, device, configurations=plan.meta["configurations"], layers=depths,
                    seeds=seeds, seed_values=[init.seed + i for i in range(seeds)], grads=grads,
                    spread_criterion=criterion, transfer_from=plan.meta["transfer_from"],
                    transfer_tol=TRANSFER_TOL, law_tol=LAW_TOL, streamed=streamed)  # fmt: skip

    def seen(point, result: ExperimentResult) -> None:
        streamed[point.labels["n_layers"]] = bool(result.meta.get("streamed"))

    # progress in block passes: a forward per layer, and for the gradients a forward and a
    # backward (grad_norms counts 2 per layer)
    return run_plan(plan, meta, meter=Meter(device), progress=progress, on_partial=on_partial,
                    weight=lambda p: (3 if grads else 1) * p.labels["n_layers"], label=_point_label,
                    on_point=seen)  # fmt: skip


def _point_label(point) -> str:
    lab = point.labels
    return f"L={lab['n_layers']}, seed {lab['seed']}, {lab['init']}/{lab['norm_position']}"


def depth_sweep_plan(
    model: ModelConfig, init: InitConfig, run: RunConfig, depths: Sequence[int], seeds: int,
    inits: Sequence[str], norm_positions: Sequence[str] | None, grads: bool, transfer_from: int | None = None,
    here: bool = False,
) -> Plan:  # fmt: skip
    """``depth-sweep`` as one point per (L, seed, init, norm position)
    (:func:`depth_sweep_result`), in (L, seed, configuration) order; gathering is
    :func:`assemble` over every point's rows. ``here``: the memory check is against this
    machine (a run here), else against 1 PiB (a sweep: each point checks where it runs)."""
    check_count("seeds", seeds, MAX_SEEDS)
    ref = transfer_reference(depths, transfer_from)
    if grads:
        require_gradients(model, run)
    configs = list(grid(inits, norm_positions, init.schemes))
    check_memory(model, init, run, configs, backward=grads, n_layers=max(depths), here=here)
    check_configs(model, init, run, configs, depths)
    points = [
        Point(
            depth_sweep_result,
            {"n_layers": L, "seed": seed_configs(init, run, i)[0].seed, "init": scheme, "norm_position": pos},
            {
                "model": model,
                "init": init,
                "run": run,
                "n_layers": L,
                "seed_index": i,
                "inits": (scheme,),
                "norm_positions": (pos,),
                "grads": grads,
            },
        )  # fmt: skip
        for L in depths
        for i in range(seeds)
        for scheme, pos in configs
    ]

    def gather(frames: dict[str, Frames]) -> Frames:
        done = [frames[p.name]["depth_sweep"] for p in points if p.name in frames]
        rows = [r for f in done for r in f.to_dict("records")]
        return assemble(rows, configs, model, init, ref)

    meta = grid_meta(
        dataclasses.replace(model, n_layers=max(depths)), init, run, configurations=configs,
        layers=list(depths), seeds=seeds, seed_values=[init.seed + i for i in range(seeds)], grads=grads,
        transfer_from=ref,
    )  # fmt: skip
    return Plan("depth-sweep", points, gather, meta,
                not_applicable(grads and model.branch == "model", init.schemes, model,
                               predicted=run.mf_draws > 0))  # fmt: skip


def depth_sweep_result(
    model: ModelConfig, init: InitConfig, run: RunConfig, n_layers: int, seed_index: int,
    inits: Sequence[str], norm_positions: Sequence[str], grads: bool, progress: Progress | None = None,
) -> ExperimentResult:  # fmt: skip
    """A point of the plan: :func:`depth_sweep_point`'s rows as frame ``depth_sweep``, the
    variance run's meta (with the gradient run's as ``grad_norms_meta``)."""
    rows, metas = depth_sweep_point(model, init, run, n_layers, seed_index, inits, norm_positions, grads,
                                    progress)  # fmt: skip
    meta = dict(metas[0])
    if len(metas) > 1:
        meta["grad_norms_meta"] = metas[1]
    return ExperimentResult({"depth_sweep": pd.DataFrame(rows, columns=SWEEP_COLUMNS)}, meta)


def not_applicable(
    grad_ratio: bool, custom=(), model: ModelConfig | None = None, predicted: bool = True
) -> dict:
    """The cells of the three frames that have no value by design (written empty):
    the gradient ratio without gradients (--no-grads, Gaussian branches, a zero readout
    that passes no gradient down: ``model``'s configuration of the scheme), standard
    errors over one seed, OLS errors below three points, a fit over one depth, and the
    large-width prediction's cells when it was not made (``predicted`` False: --mf-draws 0)."""

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

    def no_grad_ratio(df):  # a branch gain of 0 (ReZero), a zero readout: W_down gets no gradient at init
        silent = df["init"].map(lambda name: _zero_gain(name, custom) or _zero_readout(name, model, custom))
        return silent.astype(bool) | (not grad_ratio)

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
    fit.update(dict.fromkeys(("mf_ratio_max_min", "mf_transfer_ratio"), one_depth))
    fit["mf_transfer_z"] = lambda df: one_depth(df) | one_seed(df)
    if not predicted:
        for cols in (
            (fit, ("mf_ratio_max_min", "mf_transfer_ratio", "mf_transfer_z")),
            (summary, ("mf_v_final_mean", "mf_v_final_se", "mf_v_growth_mean", "mf_v_growth_se")),
        ):
            cols[0].update(dict.fromkeys(cols[1], True))
    summary["grad_ratio_mean"] = no_grad_ratio
    summary["grad_ratio_se"] = lambda df: no_grad_ratio(df) | one_seed(df)

    def no_reference(df):
        return zero_branches(df) | no_closed_form(df)

    sweep = {
        **dict.fromkeys(("mf_v_final", "mf_v_growth", "rel_err_mf"), not predicted),
        "grad_ratio": no_grad_ratio,
        "max_abs_cross_corr": zero_branches,
        **dict.fromkeys(("s2_ref_attn", "s2_ref_ffn"), no_reference),
        **dict.fromkeys(("pred_closed_final", "rel_err_closed"), no_closed_form),
    }
    # without a closed form there is no theory line, law or comparison with them
    theory_columns = ("theory_v_final", "theory_v_final_rel", "theory_v_growth")
    summary.update(dict.fromkeys(("pred_closed_final_mean", *theory_columns), no_closed_form))
    summary["pred_closed_final_se"] = lambda df: no_closed_form(df) | one_seed(df)
    for col in (
        "theory_slope",
        "theory_intercept",
        "theory_branch_var",
        "law_max_rel_err",
        "theory_rel_err_max",
        "slope_z",
    ):
        rule = fit.get(col)
        fit[col] = lambda df, r=rule: no_closed_form(df) | (r(df) if r else False)
    theory = dict.fromkeys(theory_columns, no_closed_form)
    return {
        "depth_sweep": sweep,
        "depth_sweep_summary": summary,
        "depth_sweep_fit": fit,
        "depth_sweep_theory": theory,
    }


def _no_closed_form(scheme: str, custom=()) -> bool:
    return not known(scheme, custom) or get_scheme(scheme, custom).depth_factor is None


def _zero_outputs(scheme: str, custom=()) -> bool:
    if not known(scheme, custom):
        return False
    s = get_scheme(scheme, custom)
    return s.rule("o").dist == "zero" and s.rule("down").dist == "zero"


def _zero_readout(scheme: str, model: ModelConfig | None, custom=()) -> bool:
    """The scheme's untied readout is exactly 0 in ``model``'s configuration of it
    (microsoft/mup's MuReadout at init): no gradient reaches the stream."""
    if model is None or not known(scheme, custom) or get_scheme(scheme, custom).rule("head").dist != "zero":
        return False
    from ...model.structure import apply_scheme

    return not apply_scheme(model, scheme, custom).tie_embeddings


def _zero_gain(scheme: str, custom=()) -> bool:
    if not known(scheme, custom):
        return False
    f = get_scheme(scheme, custom).branch_mult
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
    :func:`seed_configs`), for each (init scheme, norm position) given. Determined by
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
    var = run_variance(cfg, ini, r, inits, norm_positions, progress=sub_progress(progress, 0, per, total))
    metas, ratios = [var.meta], {}
    if grads:
        span = sub_progress(progress, per, 2 * per, total)
        grad = run_grad_norms(cfg, ini, r, inits, norm_positions, batches=1, progress=span)
        metas.append(grad.meta)
        for g in grad["summary"].itertuples(index=False):
            ratios[(g.init, g.norm_position)] = float(g.down_ratio_first_last)
    rows = []
    for row in var["summary"].to_dict("records"):
        row["grad_ratio"] = ratios.get((row["init"], row["norm_position"]), math.nan)
        rows.append({c: row[c] for c in SWEEP_COLUMNS})
    return rows, metas


def assemble(
    records: list[dict],
    configs: list[tuple[str, str]],
    model: ModelConfig,
    init: InitConfig | None = None,
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
    # (rows made before a column existed, e.g. a point of a resumed sweep written by an
    # older tinit, have it empty)
    sweep = sweep.sort_values(["_order", "n_layers", "seed"], kind="stable").reindex(columns=SWEEP_COLUMNS)
    sweep = sweep.reset_index(drop=True)
    theory_lines = {}
    for (scheme, pos), d in sweep.groupby(["init", "norm_position"], sort=False):
        theory_lines[(scheme, pos)] = theory_line(d, scheme, pos, model, init)
    with np.errstate(all="ignore"):  # a vanished v0 gives inf / nan (flagged), not a warning
        summary = summarize_points(sweep, theory_lines)
        fit = fit_configs(sweep, summary, theory_lines, transfer_from)
        theory_curves = theory_frame(sweep, theory_lines)
    return {
        "depth_sweep": sweep,
        "depth_sweep_summary": summary,
        "depth_sweep_fit": fit,
        "depth_sweep_theory": theory_curves,
    }
