"""Per-layer gradient norms at initialization, pre- vs post-norm (Xiong et al. 2020,
"On Layer Normalization in the Transformer Architecture", Figure 3).

For each (init scheme, norm position) the same seeded token batches go through a
stack whose weights share their draws; the loss is the mean next-token
cross-entropy of ``Transformer.logits``. With ``batches`` N > 1 the parameter
gradients are summed over the N batches and divided by N *before* any norm is
taken (the gradient of the mean of the N batch losses).

Recorded:

- the Frobenius norm of every parameter's gradient, with the parameter's own norm;
- the RMS of d loss / d stream at every addition k = 0..2L. "The stream" at k is
  the tensor that continues along the residual path: pre-norm x_k = x_{k-1} + F_k
  (k = 0: the embedding output; k = 2L: the input of the final norm); post-norm the
  *normalised* output y_k = Norm(x_{k-1} + F_k) (k = 2L: what the head reads). Each
  batch's gradient is of its own mean loss; the RMS pools all elements of all N
  batches, so it does not shrink with N;
- the identity-path prediction of the stream gradient (:mod:`tinit.theory`): 1 for
  pre-norm, the product of the norm Jacobian gains 1/sqrt(var(s_j)) above k for
  post-norm, with var(s_j) the forward variances of the sums (averaged over batches).

The gradients come from :mod:`tinit.experiments.measure.backward`: an ordinary
backward through the built model, or a layer-wise walk that holds one block at a time
(streamed: automatic when the built model with gradients would not fit).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from ... import theory
from ...model.checks import MAX_BATCHES, check_count
from ...model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from ...model.init import draw_seed
from ...model.placements import Placement, get_placement, normed_stream_names
from ...model.transformer import Transformer
from ..configs import check_configs, config_label, config_name, configure, grid
from ..device import make_tokens, matmul_precision, resolve_device, resolve_dtype, stat_dtype
from ..driver import Meter, Run
from ..memory import backward_bound, check_memory, should_stream
from ..meta import run_meta
from ..points import Plan, concat_plan
from ..result import ExperimentResult, Partial, Progress
from .backward import PATH_ROWS, GradRecorder, autograd_backward, layerwise_backward
from .probes import VarianceProbe

GRAD_COLUMNS = [
    "init", "norm_position", "n_layers", "seed", "layer", "tensor", "param", "role",
    "grad_norm", "param_norm",
]  # fmt: skip
STREAM_COLUMNS = [
    "init", "norm_position", "n_layers", "seed", "k", "layer", "sublayer", "stream_grad_rms",
    "stream_grad_rel", "pred_identity_gain", "pred_stream_grad_rms", "stream_var",
    "branch_back_gain", "grad_cross_corr", "norm_back_gain", "norm_proj_frac", "pred_full_gain",
    "pred_full_stream_grad_rms",
]  # fmt: skip
SUMMARY_COLUMNS = [
    "init", "norm_position", "n_layers", "seed", "batches", "loss",
    "down_ratio_first_last", "down_max_min", "down_max_layer",
    "o_ratio_first_last", "o_max_min", "o_max_layer",
    "stream_grad_ratio", "pred_stream_grad_ratio", "stream_grad_ratio_err",
    "pred_full_stream_grad_ratio", "full_stream_grad_ratio_err", "better_path",
]  # fmt: skip
#: The summary's W_down and W_O statistics (not applicable without those tensors).
TENSOR_STAT_COLUMNS = [
    f"{t}_{s}" for t in ("down", "o") for s in ("ratio_first_last", "max_min", "max_layer")
]


def batch_seeds(seed: int, batches: int) -> list[int]:
    """Data seeds of the N batches: batch 0 uses ``seed`` itself (so one batch sees the
    tokens ``tinit variance`` sees), batch i > 0 a seed derived from (seed, i)."""
    return [seed if i == 0 else draw_seed(seed, i, "batch") for i in range(batches)]


def stream_frame(
    sq: np.ndarray, count: int, stream_var: np.ndarray, norm_position: Placement | str, eps: float,
    stream_mult: np.ndarray | None = None, paths: np.ndarray | None = None,
):  # fmt: skip
    """stream_grads rows of one configuration, with the identity-path prediction and,
    with ``paths`` (from :func:`.backward.branch_paths`), the full-path one.

    Identity path: a placement with a norm after each sum (post-norm) has one on it,
    modelled as the scalar 1/sqrt(var(s_j) + eps) from the forward variance of the sum;
    the others (pre, sandwich, reordered, none) pass the gradient unchanged, times the scheme's stream
    multipliers a_j (and x0-mix lambdas) above k. Full path: the gradient entering
    addition j from above is split into the identity part c_j w_j and the branch part
    r_j; with b_j = |r_j|^2 / |w_j|^2 the branch's backward gain (squared) and the two
    parts uncorrelated, |u_{j-1}|^2 = (c_j^2 + b_j) |w_j|^2, so the gain from 2L down to
    k is the product over j > k of sqrt(c_j^2 + b_j), times post-norm's norm backward
    sqrt(n_j): the norm's Jacobian per token, (1 / r_t)(I - y_t y_t^T / d), applied to
    the gradient arriving at its output (:func:`.backward.norm_backward`; n_j = |J^T g|^2 / |g|^2).
    Per token it removes the gradient's component along the token, a share
    ``norm_proj_frac`` of |g|^2 that the scalar model leaves in (about 3% per addition at
    sigma 1/sqrt(d), naive, L 12: compounded over 24 additions, 2.4x). ``grad_cross_corr``
    measures the uncorrelatedness the full path still assumes."""
    n_add = len(sq) - 1
    k = np.arange(n_add + 1)
    rms = np.sqrt(sq / count)
    with np.errstate(all="ignore"):  # a vanished or overflowing gradient: nan / inf, flagged
        rel = rms / rms[-1]
    a = np.ones(n_add) if stream_mult is None else np.asarray(stream_mult, dtype=np.float64)
    post = get_placement(norm_position).resets  # a norm on the identity path
    if not post:
        gain = theory.identity_gain_pre(n_add)
    else:
        gain = theory.identity_gain_post(stream_var[1:], eps)
    gain = gain * np.concatenate([np.cumprod(a[::-1])[::-1], [1.0]])
    nan = np.full(n_add + 1, np.nan)
    b, corr, full, n_gain, removed = nan.copy(), nan.copy(), nan.copy(), nan.copy(), nan.copy()
    if paths is not None:
        rr, ww, cross = paths[0, 1:], paths[1, 1:], paths[2, 1:]
        with np.errstate(all="ignore"):  # overflow or 0/0: inf / nan, flagged in the CSV
            b[1:] = rr / ww
            corr[1:] = cross / np.sqrt(a**2 * ww * rr)
            norm_step = np.ones(n_add)
            if post and len(paths) >= PATH_ROWS:
                n_gain[1:] = paths[3, 1:] / paths[4, 1:]
                removed[1:] = paths[5, 1:] / paths[4, 1:]
                norm_step = np.sqrt(n_gain[1:])
            step = np.sqrt(a**2 + b[1:]) * norm_step
            full = np.concatenate([np.cumprod(step[::-1])[::-1], [1.0]])
    return pd.DataFrame(
        {
            "k": k,
            "layer": np.where(k == 0, -1, (k - 1) // 2),
            "sublayer": np.where(k == 0, "embed", np.where(k % 2 == 1, "attn", "ffn")),
            "stream_grad_rms": rms,
            "stream_grad_rel": rel,
            "pred_identity_gain": gain,
            "pred_stream_grad_rms": rms[-1] * gain,
            "stream_var": stream_var,
            "branch_back_gain": b,
            "grad_cross_corr": corr,
            "norm_back_gain": n_gain,
            "norm_proj_frac": removed,
            "pred_full_gain": full,
            "pred_full_stream_grad_rms": rms[-1] * full,
        }
    )


def _ratio(a: float, b: float) -> float:
    """a / b in IEEE arithmetic: inf or nan (flagged in the CSV) where b is 0."""
    with np.errstate(all="ignore"):
        return float(np.float64(a) / np.float64(b))


def _tensor_stats(grads: pd.DataFrame, tensor: str, prefix: str) -> dict:
    d = grads[grads["tensor"] == tensor].sort_values("layer")
    if d.empty:
        return {f"{prefix}_ratio_first_last": math.nan, f"{prefix}_max_min": math.nan,
                f"{prefix}_max_layer": math.nan}  # fmt: skip
    g = d["grad_norm"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        return {
            f"{prefix}_ratio_first_last": g[0] / g[-1],
            f"{prefix}_max_min": g.max() / g.min(),
            # the largest is undefined when a norm is NaN (argmax would say the first NaN's layer)
            f"{prefix}_max_layer": (
                int(d["layer"].to_numpy()[int(np.argmax(g))]) if not np.isnan(g).any() else math.nan
            ),
        }


def summarize(grads: pd.DataFrame, streams: pd.DataFrame) -> dict:
    """One summary row from one configuration's grad_norms and stream_grads rows."""
    rel0 = np.float64(streams["stream_grad_rel"].iloc[0])
    pred0 = np.float64(streams["pred_identity_gain"].iloc[0])
    full0 = np.float64(streams["pred_full_gain"].iloc[0])
    # which prediction explains the measurement: the smaller |log(measured / predicted)|
    with np.errstate(all="ignore"):  # inf / nan (flagged) rather than a warning
        logs = {name: float(abs(np.log(rel0 / p))) if p > 0 and rel0 > 0 and np.isfinite(p) else math.inf
                for name, p in (("identity", pred0), ("full", full0))}  # fmt: skip
    better = min(logs, key=logs.get) if any(math.isfinite(v) for v in logs.values()) else ""
    return {
        **_tensor_stats(grads, "down", "down"),
        **_tensor_stats(grads, "o", "o"),
        "stream_grad_ratio": float(rel0),
        "pred_stream_grad_ratio": float(pred0),
        "stream_grad_ratio_err": _ratio(rel0, pred0) - 1.0,
        "pred_full_stream_grad_ratio": float(full0),
        "full_stream_grad_ratio_err": _ratio(rel0, full0) - 1.0,
        "better_path": better,
    }


def require_gradients(model: ModelConfig, run: RunConfig) -> None:
    """Refuse, as bad input, what leaves the next-token loss without a gradient: a
    one-token vocabulary (the cross-entropy is constant, 0) or one-token sequences
    (nothing to predict: the loss is a mean over no targets). Every gradient would be
    0 or NaN and every ratio 0/0."""
    if model.vocab_size < 2:
        raise ConfigError("vocab_size", f"must be >= 2 to measure gradients, got {model.vocab_size}")
    if run.seq_len < 2:
        raise ConfigError(
            "seq_len",
            f"must be >= 2 to measure gradients (the loss predicts token t+1 from t), got {run.seq_len}",
        )


def not_applicable(model: ModelConfig, grads: pd.DataFrame) -> dict:
    """Cells with no value by design (written empty; any other NaN is written ``nan``):
    the embedding (k = 0) has no branch, so no branch backward gain or correlation; a
    branch that passes no gradient back (ReZero's gain 0, a zero-initialised output)
    has no correlation either; Gaussian branches have no W_O or W_down, and a
    configuration whose W_O and W_down receive no gradient at all (ReZero) has no ratio
    of their norms. (No rows, as when every point of a sweep failed: no dead branch.)"""
    dead = set()
    if "tensor" in grads:
        wo = grads[grads["tensor"].isin(("o", "down"))]
        dead = {key for key, g in wo.groupby(["init", "norm_position"]) if (g["grad_norm"] == 0).all()}

    def no_tensor_grads(df):
        gaussian = model.branch == "gaussian"
        return pd.Series(
            [gaussian or (i, p) in dead for i, p in zip(df["init"], df["norm_position"], strict=True)],
            index=df.index,
        )

    silent = set()  # no gradient reaches the stream (a zero readout): every tensor but the head at 0
    if "tensor" in grads:
        body = grads[grads["tensor"] != "head"]
        silent = {key for key, g in body.groupby(["init", "norm_position"]) if (g["grad_norm"] == 0).all()}

    def no_stream_grad(df):
        return pd.Series([(i, p) in silent for i, p in zip(df["init"], df["norm_position"], strict=True)],
                         index=df.index)  # fmt: skip

    return {"stream_grads": STREAM_GRADS_NOT_APPLICABLE,
            "summary": {**dict.fromkeys(TENSOR_STAT_COLUMNS, no_tensor_grads),
                        **dict.fromkeys(STREAM_RATIO_COLUMNS, no_stream_grad)}}  # fmt: skip


def _embedding(df: pd.DataFrame):
    return df["k"] == 0


def _no_norm_on_path(df: pd.DataFrame):  # only post-norm has a norm between additions
    return _embedding(df) | ~df["norm_position"].isin(normed_stream_names())


#: stream_grads.csv's cells with no value by design, wherever the frame is written
#: (grad-norms, check, audit): the embedding (k = 0) has no branch, so no branch backward
#: gain or correlation; a branch that passes no gradient back has no correlation; only
#: post-norm has a norm between additions to measure the backward of.
def _silent(df: pd.DataFrame):
    """No gradient reaches the stream in this configuration at all (a zero readout, as
    microsoft/mup's untied MuReadout at init): every ratio of stream gradients is 0/0."""
    zero = (df["stream_grad_rms"] == 0).groupby([df["init"], df["norm_position"]]).transform("all")
    return zero.astype(bool)


STREAM_GRADS_NOT_APPLICABLE = {
    "stream_grad_rel": _silent,
    "branch_back_gain": lambda df: _embedding(df) | _silent(df),
    "grad_cross_corr": lambda df: _embedding(df) | (df["branch_back_gain"] == 0) | _silent(df),
    "norm_back_gain": lambda df: _no_norm_on_path(df) | _silent(df),
    "norm_proj_frac": lambda df: _no_norm_on_path(df) | _silent(df),
    "pred_full_gain": _silent,
    "pred_full_stream_grad_rms": _silent,
}
#: summary.csv's ratios of stream gradients (empty where no gradient reaches the stream)
STREAM_RATIO_COLUMNS = [
    "stream_grad_ratio",
    "stream_grad_ratio_err",
    "pred_full_stream_grad_ratio",
    "full_stream_grad_ratio_err",
]


def run_grad_norms(
    model: ModelConfig | None = None,
    init: InitConfig | None = None,
    run: RunConfig | None = None,
    inits: Sequence[str] = ("naive", "scaled"),
    norm_positions: Sequence[str] | None = None,
    batches: int = 1,
    progress: Progress | None = None,
    on_partial: Partial | None = None,
) -> ExperimentResult:
    """Gradient norms of every parameter and of the stream at every addition, at init.

    Returns frames ``grad_norms`` (one row per configuration and parameter),
    ``stream_grads`` (one row per configuration and k = 0..2L) and ``summary`` (one
    row per configuration). ``batches`` N averages the parameter gradients over N
    seeded batches before taking norms. Raises :class:`IncompleteRun`, holding what
    was measured, if a configuration fails part-way (e.g. out of memory).
    ``on_partial`` gets a function building the result so far after each configuration.

    >>> cfg = ModelConfig(n_layers=4, d_model=64, n_heads=2)
    >>> res = run_grad_norms(cfg, run=RunConfig(batch=2, seq_len=16))
    >>> res["summary"][["init", "norm_position", "down_ratio_first_last"]]  # doctest: +SKIP
    """
    model, init, run = model or ModelConfig(), init or InitConfig(), run or RunConfig()
    require_gradients(model, run)
    check_count("batches", batches, MAX_BATCHES)
    device, dtype = resolve_device(run.device), resolve_dtype(run.dtype)
    stats = stat_dtype(dtype)
    configs = list(grid(inits, norm_positions, init.schemes))
    check_memory(model, init, run, configs, backward=True)
    check_configs(model, init, run, configs)
    # built whole, the backward holds weights, gradients and every block's saved activations
    need = None
    if run.stream is None:
        built = [configure(model, init, run, scheme, position) for scheme, position in configs]
        need = backward_bound(built, run.batch, run.seq_len, dtype)
    stream = should_stream(model, dtype, device, run.stream, need)
    seeds = batch_seeds(init.seed if run.data_seed is None else run.data_seed, batches)
    toks = [make_tokens(model, run, s, device) for s in seeds]
    L = model.n_layers
    grad_frames, stream_frames, summaries = [], [], []
    meta = run_meta(model, init, run, device, streamed=stream, configurations=configs,
                    batches=batches, data_seeds=seeds,
                    built_backward_gib=None if need is None else need / 2**30)  # fmt: skip

    def assemble() -> dict[str, pd.DataFrame]:
        def cat(frames, columns):
            return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)

        return {
            "grad_norms": cat(grad_frames, GRAD_COLUMNS),
            "stream_grads": cat(stream_frames, STREAM_COLUMNS),
            "summary": pd.DataFrame(summaries, columns=SUMMARY_COLUMNS),
        }

    driver = Run(meta, assemble, lambda frames: not_applicable(model, frames["grad_norms"]),
                 meter=Meter(device), on_partial=on_partial, progress=progress,
                 total=len(configs) * 2 * batches * L)  # fmt: skip
    tick = driver.tick

    def measure(config: tuple[str, str]):
        cfg, ini = configure(model, init, run, *config)
        net = Transformer(cfg, ini, device, dtype, stream=stream)
        rec = GradRecorder(L, batches, stats)
        sq = torch.zeros(2 * L + 1, dtype=stats, device=device)
        mult = theory.addition_multipliers(ini.definition, cfg, ini)
        coef = mult.a * mult.lam
        acc = torch.zeros(PATH_ROWS, 2 * L + 1, dtype=stats, device=device)
        losses: list[torch.Tensor] = []
        probes = [VarianceProbe(stats) for _ in toks]
        with matmul_precision(run):
            if stream:
                layerwise_backward(net, cfg, ini, device, dtype, toks, stats, sq, losses, probes, rec, tick,
                           coef, acc)  # fmt: skip
            else:
                autograd_backward(net, toks, stats, sq, losses, probes, tick, coef, acc)
        rec.record(net.named_parameters())
        grads = rec.frame()
        sq_host = sq.cpu().to(torch.float64).numpy()
        acc_host = acc.cpu().to(torch.float64).numpy()
        loss = float(torch.stack(losses).mean())
        del net, rec, sq, losses
        return cfg, coef, grads, sq_host, acc_host, loss, probes

    def collect(config: tuple[str, str], measured) -> None:
        (scheme, norm_position), (cfg, coef, grads, sq_host, acc_host, loss, probes) = config, measured
        # forward variances, averaged over the batches (each batch has equal size)
        stream_var = np.mean([p.frame()["stream_var"].to_numpy() for p in probes], axis=0)
        count = batches * run.batch * run.seq_len * cfg.d_model
        streams = stream_frame(sq_host, count, stream_var, norm_position, cfg.norm_eps, coef, acc_host)
        labels = {"init": scheme, "norm_position": norm_position, "n_layers": L, "seed": init.seed}
        grad_frames.append(grads.assign(**labels))
        stream_frames.append(streams.assign(**labels))
        summaries.append({**labels, "batches": batches, "loss": loss, **summarize(grads, streams)})

    driver.each(configs, measure, collect, label=config_label, span=config_name)
    return driver.result()


def grad_norms_plan(model: ModelConfig, init: InitConfig, run: RunConfig, inits: Sequence[str],
                    norm_positions: Sequence[str] | None, batches: int = 1) -> Plan:  # fmt: skip
    """``grad-norms`` as one point per (init, norm position)."""
    require_gradients(model, run)
    plan = concat_plan(
        "grad-norms", run_grad_norms, ("grad_norms", "stream_grads", "summary"), model, init, run, inits,
        norm_positions, backward=True, batches=batches,
    )  # fmt: skip
    # the single run's rules, from the gathered frames (which configurations pass no gradient)
    plan.not_applicable = lambda frames: not_applicable(model, frames["grad_norms"])
    return plan
