"""Residual-stream variance at every addition, against the variance law.

For each (init scheme, norm position) the same tokens go through a stack whose
weights share their draws; a :class:`VarianceProbe` records stream and branch
variances at k = 0..2L, and :mod:`tinit.theory` puts the predictions beside them.
The large-width prediction of :mod:`tinit.mf` (from the init and the tokens alone, no
forward) adds its own columns, ``mf_*``; with ``theory_only`` it is all that runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from ... import theory
from ...mf.stack import MF_COLUMNS, memory_bytes, predict
from ...model.catalogue import get_scheme, known
from ...model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from ...model.placements import Placement, get_placement, normed_stream_names
from ...model.transformer import Transformer
from ..configs import check_configs, config_label, config_name, configure, grid
from ..device import make_tokens, matmul_precision, resolve_device, resolve_dtype, stat_dtype
from ..driver import Meter, Run
from ..memory import available_memory, check_memory, should_stream
from ..meta import run_meta
from ..points import Plan, concat_plan
from ..result import ExperimentResult, Partial, Progress
from .probes import VarianceProbe

VARIANCE_COLUMNS = [
    "init", "norm_position", "n_layers", "seed", "k", "layer", "sublayer",
    "stream_var", "branch_var", "cross_corr", "stream_var_rel",
    "pred_cumulative", "pred_closed", "stream_var_normed", "cos_sim", "res_ratio",
]  # fmt: skip
SUMMARY_COLUMNS = [
    "init", "norm_position", "n_layers", "seed", "v0", "v_final", "v_final_rel",
    "branch_var_mean", "sigma2_rel", "pred_closed_final", "pred_cumulative_final",
    "rel_err_closed", "rel_err_cumulative", "max_abs_cross_corr", "v_final_normed",
    "s2_ref_attn", "s2_ref_ffn", "closed_form", "first_nonfinite_k", "v_growth",
]  # fmt: skip
#: The large-width prediction's columns (tinit.mf): variance.csv's per addition,
#: summary.csv's per configuration. tinit variance's files have them after the columns
#: above, which the audit and check share.
MF_VARIANCE_COLUMNS = list(MF_COLUMNS)
MF_SUMMARY_COLUMNS = ["mf_v_final", "mf_v_growth", "mf_branch_var_mean", "rel_err_mf"]
#: The columns of tinit variance's variance.csv and summary.csv.
RUN_VARIANCE_COLUMNS = [*VARIANCE_COLUMNS, *MF_VARIANCE_COLUMNS]
RUN_SUMMARY_COLUMNS = [*SUMMARY_COLUMNS, *MF_SUMMARY_COLUMNS]


def _is_embedding(df: pd.DataFrame):
    return df["k"] == 0


def _stream_not_normed(df: pd.DataFrame):
    """Rows of placements whose stream is the sum itself (no norm after it): all but post-norm."""
    return ~df["norm_position"].isin(normed_stream_names())


def _zero_branch(df: pd.DataFrame):
    return df["branch_var"] == 0


def _zero_branches(df: pd.DataFrame):
    return df["branch_var_mean"] == 0


def _no_closed_form(df: pd.DataFrame):
    """A user's scheme (--init-file: not in the catalogue, and a TOML scheme declares no
    depth factor) has no closed form; nor has a catalogue scheme without a depth factor."""
    return df["init"].map(lambda name: not known(name) or get_scheme(name).depth_factor is None).astype(bool)


#: Cells with no value by design (written empty; any other NaN is written ``nan``):
#: the embedding (k = 0) has no branch; only a placement with a norm after the sum
#: (post) has a normalised stream (the other placements' stream is the sum itself); a
#: branch that is exactly zero (a zero-initialised output: zero-out, nanochat) has no
#: correlation with the stream and no reference variance; a configuration whose stream
#: stayed finite has no first non-finite addition.
NOT_APPLICABLE = {
    "variance": {
        "branch_var": _is_embedding,
        "cross_corr": lambda df: _is_embedding(df) | _zero_branch(df),
        "pred_closed": lambda df: _no_closed_form(df) & ~_is_embedding(df),
        "stream_var_normed": lambda df: _stream_not_normed(df) | _is_embedding(df),
    },
    "summary": {
        # empty when no addition overflowed (a CSV read back has NaN there, not None)
        "first_nonfinite_k": lambda df: df["first_nonfinite_k"].isna(),
        "v_final_normed": _stream_not_normed,
        "max_abs_cross_corr": _zero_branches,
        **dict.fromkeys(("s2_ref_attn", "s2_ref_ffn"), lambda df: _zero_branches(df) | _no_closed_form(df)),
        **dict.fromkeys(("pred_closed_final", "rel_err_closed", "closed_form"), _no_closed_form),
    },
}
#: The measured columns (and the laws made from them), empty in a --theory-only run.
_MEASURED = {
    "variance": [c for c in VARIANCE_COLUMNS if c not in ("init", "norm_position", "n_layers", "seed", "k",
                                                          "layer", "sublayer")],
    "summary": [c for c in SUMMARY_COLUMNS if c not in ("init", "norm_position", "n_layers", "seed",
                                                        "closed_form")],
}  # fmt: skip


def not_applicable(run: RunConfig | None = None, theory_only: bool = False) -> dict:
    """The cells of tinit variance's frames empty by design: :data:`NOT_APPLICABLE`, the
    prediction's branch at k = 0, every ``mf_*`` cell when the run predicts nothing
    (``mf_draws`` 0), and with ``theory_only`` every measured cell (and the error
    against the measurement)."""
    out = {frame: dict(cols) for frame, cols in NOT_APPLICABLE.items()}
    out["variance"]["mf_branch_var"] = _is_embedding
    if run is not None and run.mf_draws == 0:
        out["variance"].update(dict.fromkeys(MF_VARIANCE_COLUMNS, True))
        out["summary"].update(dict.fromkeys(MF_SUMMARY_COLUMNS, True))
    if theory_only:
        for frame, cols in _MEASURED.items():
            out[frame].update(dict.fromkeys(cols, True))
        out["summary"]["rel_err_mf"] = True
    return out


def check_prediction(model: ModelConfig, run: RunConfig, theory_only: bool = False) -> None:
    """Before anything runs: the prediction's memory (:func:`tinit.mf.stack.memory_bytes`,
    its T x T Grams per sequence) fits in the free host memory (it runs on the CPU),
    else a ConfigError naming --seq-len or --batch, whichever is further beyond its
    default (128, 8); and a --theory-only run draws at least one head."""
    if theory_only and run.mf_draws == 0:
        raise ConfigError("mf_draws", "a --theory-only run needs at least one draw (the prediction is all it "
                          "writes), got 0")  # fmt: skip
    if run.mf_draws == 0:
        return
    need = memory_bytes(run.batch, run.seq_len, model.head_dim, run.mf_draws)
    free = available_memory(torch.device("cpu"))
    if need > free:
        field = "seq_len" if run.seq_len / 128 >= run.batch / 8 else "batch"
        raise ConfigError(field, f"the large-width prediction of {run.batch} x {run.seq_len} tokens holds "
                          f"{run.batch} Gram matrices of {run.seq_len} x {run.seq_len}: at least "
                          f"{need / 2**30:.3g} GiB, more than the {free / 2**30:.3g} GiB free")  # fmt: skip


def measure_stream(
    model: Transformer, tokens: torch.Tensor, stats: torch.dtype, on_block=None
) -> pd.DataFrame:
    """Run ``tokens`` through ``model`` (no gradients) with a probe; the raw rows."""
    probe = VarianceProbe(stats)
    with torch.no_grad():
        model.forward_stream(tokens, probe, after_block=on_block)
    return probe.frame()


def add_theory(
    raw: pd.DataFrame, norm_position: Placement | str, cfg: ModelConfig | None = None,
    init: InitConfig | None = None,
) -> pd.DataFrame:  # fmt: skip
    """Add stream_var_rel, pred_cumulative and pred_closed to one configuration's rows.

    With ``cfg`` and ``init``, the init scheme's theory (:mod:`tinit.theory`): the
    cumulative prediction from the measured branch variances and the scheme's
    multipliers, and its closed form from the reference branch variances (attrs
    ``s2_ref``). Without them, the plain variance law (a = g = 1, no depth factor: the
    naive scheme's theory), so a model tinit did not build gets the same columns as
    tinit's own naive model. ``norm_position``: the placement (or its name), whose
    stream law and branch law the predictions follow."""
    placement = get_placement(norm_position)
    df = raw.sort_values("k").reset_index(drop=True)
    v0 = float(df.loc[0, "stream_var"])
    adds = df["k"] > 0
    s2 = df.loc[adds, "branch_var"].to_numpy()
    mean_s2 = float(np.mean(s2)) if len(s2) else float("nan")
    k = df.loc[adds, "k"].to_numpy()
    mult = None
    if cfg is not None and init is not None and len(s2) == 2 * cfg.n_layers:
        mult = theory.addition_multipliers(init.definition, cfg, init)
    elif len(s2) and len(s2) % 2 == 0:  # a model tinit did not build: the plain law, as for naive
        mult = theory.AdditionMultipliers.plain(len(s2))
    if mult is not None:
        v_in = df.loc[adds, "stream_in_var"].to_numpy()
        cumulative = theory.pred_cumulative_scheme(v0, s2, mult, placement, v_in)
        refs = theory.reference_branch_vars(s2, mult, placement, v_in)
        closed = theory.pred_closed_scheme(v0, refs, mult, placement)
        df.attrs["s2_ref"] = refs
    elif not placement.resets:
        cumulative = theory.pred_cumulative_pre(v0, s2)
        closed = theory.pred_closed_pre(v0, k, mean_s2)
    else:
        cumulative = theory.pred_cumulative_post(df.loc[adds, "stream_in_var"].to_numpy(), s2)
        closed = theory.pred_closed_post(v0, k, mean_s2)
    df["stream_var_rel"] = df["stream_var"] / v0
    df["pred_cumulative"] = np.concatenate([[v0], cumulative])
    df["pred_closed"] = np.concatenate([[v0], closed])
    return df


def summarize(df: pd.DataFrame, closed_form: str = "") -> dict:
    """One summary row from one configuration's rows (with theory)."""
    first, last = df.iloc[0], df.iloc[-1]
    refs = df.attrs.get("s2_ref", (np.nan, np.nan))
    adds = df[df["k"] > 0]
    # float64 scalars: a vanished v0 or law gives inf / nan (flagged), not ZeroDivisionError
    v0, v_final = np.float64(first["stream_var"]), np.float64(last["stream_var"])
    mean_s2 = np.float64(adds["branch_var"].mean())
    closed, cumulative = np.float64(last["pred_closed"]), np.float64(last["pred_cumulative"])
    with np.errstate(all="ignore"):
        return {
            "v0": float(v0),
            "v_final": float(v_final),
            "v_final_rel": float(v_final / v0),
            "branch_var_mean": float(mean_s2),
            "sigma2_rel": float(mean_s2 / v0),
            "pred_closed_final": float(closed),
            "pred_cumulative_final": float(cumulative),
            "rel_err_closed": float(v_final / closed - 1.0),
            "rel_err_cumulative": float(v_final / cumulative - 1.0),
            "max_abs_cross_corr": float(adds["cross_corr"].abs().max()),
            "v_final_normed": float(last["stream_var_normed"]),
            "s2_ref_attn": refs[0],
            "s2_ref_ffn": refs[1],
            "closed_form": closed_form,
            "v_growth": float(v_final - v0),
            # the first addition whose stream variance is not a finite number (overflow), or None
            "first_nonfinite_k": next(
                (int(k) for k, v in zip(df["k"], df["stream_var"], strict=True) if not np.isfinite(v)), None
            ),  # fmt: skip
        }


def add_prediction(df: pd.DataFrame, frame: pd.DataFrame | None) -> pd.DataFrame:
    """One configuration's rows with the prediction's columns beside them (matched on k);
    NaN without a prediction."""
    if frame is None:
        return df.assign(**dict.fromkeys(MF_VARIANCE_COLUMNS, np.nan))
    mf = frame.set_index("k")[MF_VARIANCE_COLUMNS]
    return df.join(mf, on="k")


def summarize_prediction(df: pd.DataFrame) -> dict:
    """The prediction's summary cells from one configuration's rows: its v_2L, v_2L - v0
    (what its branches added), mean branch variance, and the measured v_2L's relative
    error against it."""
    first, last = df.iloc[0], df.iloc[-1]
    adds = df[df["k"] > 0]
    mf, v = np.float64(last["mf_stream_var"]), np.float64(last["stream_var"])
    with np.errstate(all="ignore"):
        return {
            "mf_v_final": float(mf),
            "mf_v_growth": float(mf - np.float64(first["mf_stream_var"])),
            "mf_branch_var_mean": float(np.float64(adds["mf_branch_var"].mean())),
            "rel_err_mf": float(v / mf - 1.0),
        }


def run_variance(
    model: ModelConfig | None = None,
    init: InitConfig | None = None,
    run: RunConfig | None = None,
    inits: Sequence[str] = ("naive", "scaled"),
    norm_positions: Sequence[str] | None = None,
    progress: Progress | None = None,
    on_partial: Partial | None = None,
    theory_only: bool = False,
) -> ExperimentResult:
    """Measure the residual-stream variance at every addition for each configuration,
    beside the large-width prediction (:func:`tinit.mf.stack.predict`, ``run.mf_draws``
    heads per sequence at each attention; 0: none).

    Returns frames ``variance`` (one row per configuration and k = 0..2L) and
    ``summary`` (one row per configuration). Raises :class:`IncompleteRun`, holding
    what was measured, if a configuration fails part-way (e.g. out of memory).
    ``on_partial`` gets a function building the result so far after each configuration.
    ``theory_only``: no model is built; the prediction alone, the measured cells empty.

    >>> res = run_variance(ModelConfig(n_layers=4, d_model=64, n_heads=2), run=RunConfig(batch=2, seq_len=16))
    >>> res["summary"][["init", "norm_position", "v_final"]]  # doctest: +SKIP
    """
    model, init, run = model or ModelConfig(), init or InitConfig(), run or RunConfig()
    device, dtype = resolve_device(run.device), resolve_dtype(run.dtype)
    configs = list(grid(inits, norm_positions, init.schemes))
    if not theory_only:
        check_memory(model, init, run, configs)
    check_prediction(model, run, theory_only)
    check_configs(model, init, run, configs)
    stream = False if theory_only else should_stream(model, dtype, device, run.stream)
    tokens = make_tokens(model, run, init.seed if run.data_seed is None else run.data_seed, device)
    frames, summaries = [], []
    kernel_error = [0.0]

    def assemble() -> dict[str, pd.DataFrame]:
        cols = RUN_VARIANCE_COLUMNS
        variance = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)
        summary = pd.DataFrame(summaries, columns=RUN_SUMMARY_COLUMNS)
        if run.mf_draws:
            meta["mf"] = {
                "draws": run.mf_draws,
                "theory_only": theory_only,
                "kernel_truncation_max": kernel_error[0],
                "device": "cpu",
                "dtype": "float64",
            }
        return {"variance": variance[cols], "summary": summary}

    meta = run_meta(model, init, run, device, streamed=stream, configurations=configs)
    units = (0 if theory_only else 1) + (1 if run.mf_draws else 0)
    driver = Run(meta, assemble, not_applicable(run, theory_only), meter=Meter(device), on_partial=on_partial,
                 progress=progress, total=len(configs) * model.n_layers * units)  # fmt: skip

    def measure(config: tuple[str, str]):
        cfg, ini = configure(model, init, run, *config)
        raw = None
        if not theory_only:
            with matmul_precision(run):
                net = Transformer(cfg, ini, device, dtype, stream=stream)
                raw = measure_stream(net, tokens, stat_dtype(dtype), on_block=lambda _layer: driver.tick())
            del net
        mf = None
        if run.mf_draws:
            mf = predict(cfg, ini, tokens, run.mf_draws, on_layer=lambda _layer: driver.tick())
        return cfg, ini, raw, mf

    def collect(config: tuple[str, str], measured) -> None:
        (scheme, norm_position), (cfg, ini, raw, mf) = config, measured
        labels = {"init": scheme, "norm_position": norm_position, "n_layers": cfg.n_layers, "seed": init.seed}
        if mf is not None:
            kernel_error[0] = max(kernel_error[0], mf.kernel_error)
        if theory_only:
            df = mf.frame.assign(**dict.fromkeys(_MEASURED["variance"], np.nan))
            row = dict.fromkeys(_MEASURED["summary"], np.nan)
            row["closed_form"] = theory.closed_form_text(ini.definition, norm_position)
        else:
            df = add_theory(raw, norm_position, cfg, ini)
            row = summarize(df, theory.closed_form_text(ini.definition, norm_position))
        df = add_prediction(df, None if mf is None else mf.frame) if not theory_only else df
        frames.append(df.assign(**labels))
        summaries.append({**labels, **row, **summarize_prediction(df)})

    driver.each(configs, measure, collect, label=config_label, span=config_name)
    return driver.result()


def variance_plan(model: ModelConfig, init: InitConfig, run: RunConfig, inits: Sequence[str],
                  norm_positions: Sequence[str] | None, theory_only: bool = False) -> Plan:  # fmt: skip
    """``variance`` as one point per (init, norm position): :func:`run_variance` of that
    configuration alone; the frames are the points' one after the other."""
    check_prediction(model, run, theory_only)
    return concat_plan("variance", run_variance, ("variance", "summary"), model, init, run, inits,
                       norm_positions, not_applicable(run, theory_only), theory_only=theory_only)  # fmt: skip
