"""The init primer's five "check yourself" items, each answered by a measurement with
a stated pass criterion.

(a) v_2L = 1 + 2L sigma^2 and its independence assumption, (b) depth-scaled init
makes v_2L independent of L, (c) pre-norm keeps an unattenuated gradient path and
post-norm does not, (d) the tied-embedding count, (e) the 1/sqrt(d_h) logit scale.

Statistics. Every tolerance is a two-sided test at level ``alpha`` (default 0.01)
against a standard error that the run itself supplies; a row that is the maximum over
m quantities uses the Bonferroni level alpha/m. The criteria are fixed here, before
any number is seen; a row that fails is reported as failed. The verdicts are in
:mod:`tinit.experiments.measure.verdicts`; this module measures and runs the items.

The key standard error is that of the covariance of stream and branch at an addition
(items a, b). A branch ends in a linear map W (W_O or W_down) drawn N(0, std^2)
independently of everything the stream and the branch's hidden input h depend on, so
with xc the centred stream, Cov = (1/N) sum_ij W_ij M_ij, M = xc^T h, which given the
stream and h is exactly N(0, std^2 ||M||_F^2 / N^2). Its z-score is therefore N(0, 1)
when the independence assumption holds, whatever the correlations between the N
pooled elements (a naive 1/sqrt(N) ignores them and is far too small deep in the
stack, where tokens become alike). For a Gaussian branch (independent N(0, S2)
noise) the same reasoning gives S2 ||xc||^2 / N^2.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from ...criteria import (  # noqa: F401 (ITEMS and the CHECK_ defaults: re-exported for callers)
    CHECK_ALPHA,
    CHECK_DEEP_LAYERS,
    CHECK_HEAD_DIMS,
    CHECK_MODEL,
    CHECK_RUN,
    ITEMS,
    z_quantile,
)
from ...model.checks import MAX_LAYERS, check_count
from ...model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from ...model.init import role_std
from ...model.transformer import Transformer
from ..configs import configure
from ..device import cpu_threads, make_tokens, resolve_device, resolve_dtype, stat_dtype
from ..driver import Meter, Run
from ..memory import check_memory, should_stream
from ..meta import run_meta
from ..result import ExperimentResult, Partial, Progress
from .attention_scale import NOT_APPLICABLE as ATTENTION_NOT_APPLICABLE
from .attention_scale import check_head_dims, run_attention_scale
from .grad_norms import STREAM_GRADS_NOT_APPLICABLE, require_gradients, run_grad_norms
from .params import NOT_APPLICABLE as PARAMS_NOT_APPLICABLE
from .probes import VarianceProbe
from .variance import VARIANCE_COLUMNS, add_theory
from .verdicts import attention_rows, depth_rows, gradient_rows, law_rows, params_rows

CHECK_COLUMNS = ["item", "claim", "measured", "theory", "rel_err", "passed", "criterion", "caveat", "detail"]
CHECK_VARIANCE_COLUMNS = ["branch", *VARIANCE_COLUMNS, "cov", "cov_se", "cov_z"]


class CovarianceProbe:
    """Cov(x_{k-1}, F_k) at every addition and its standard error under independence.

    ``capture`` is a forward pre-hook for the branch's last linear layer (W_O, W_down):
    it keeps that layer's input h. At the addition, with xc the centred stream,
    se^2 = std^2 ||xc^T h||_F^2 / N^2 (``std`` the scheme's std of that matrix); for a
    Gaussian branch of variance S2, se^2 = S2 ||xc||^2 / N^2.
    """

    def __init__(self, stats: torch.dtype, stds: dict[str, float], gaussian_var: float | None = None):
        self.dtype, self.stds, self.gaussian_var = stats, stds, gaussian_var
        self.h: torch.Tensor | None = None
        self.keys: list[int] = []
        self.values: list[torch.Tensor] = []

    def capture(self, module, args) -> None:
        self.h = args[0]

    def __call__(self, k, layer, sublayer, stream_in, branch, stream_out, normed=None) -> None:
        if stream_in is None:
            return
        dt = self.dtype
        x = stream_in.to(dt).reshape(-1, stream_in.shape[-1])
        f = branch.to(dt).reshape(-1, branch.shape[-1])
        n = x.numel()
        xc = x - x.mean()
        cov = (xc * f).sum() / n
        if self.gaussian_var is not None:
            var = self.gaussian_var * xc.square().sum() / n**2
        else:
            h = self.h.to(dt).reshape(x.shape[0], -1)
            var = self.stds[sublayer] ** 2 * (xc.T @ h).square().sum() / n**2
        self.h = None
        self.keys.append(k)
        self.values.append(torch.stack([cov, var.sqrt()]))

    def frame(self) -> pd.DataFrame:
        values = torch.stack(self.values).cpu().to(torch.float64).numpy()
        return pd.DataFrame({"k": self.keys, "cov": values[:, 0], "cov_se": values[:, 1]})


def measure_additions(
    cfg: ModelConfig, init: InitConfig, tokens: torch.Tensor, device, dtype, stream: bool, on_block=None
) -> pd.DataFrame:
    """One forward pass with a VarianceProbe and a CovarianceProbe: the rows of
    ``tinit variance`` (same helpers, same numbers) plus cov, cov_se and cov_z."""
    stats = stat_dtype(dtype)
    gaussian = cfg.branch == "gaussian"
    var_probe = VarianceProbe(stats)
    cov_probe = CovarianceProbe(
        stats,
        {"attn": role_std(init, cfg, "o"), "ffn": role_std(init, cfg, "down")},
        cfg.branch_var if gaussian else None,
    )

    def probe(*args, **kw) -> None:
        var_probe(*args, **kw)
        cov_probe(*args, **kw)

    net = Transformer(cfg, init, device, dtype, stream=stream)
    with torch.no_grad():
        x = net.embed_tokens(tokens, probe)
        for block in net.iter_blocks():
            writers = () if gaussian else (block.attn.o, block.ffn.down)
            hooks = [m.register_forward_pre_hook(cov_probe.capture) for m in writers]
            try:
                x = block(x, net.rope, probe)
            finally:
                for hook in hooks:
                    hook.remove()
            if on_block is not None:
                on_block()
    df = add_theory(var_probe.frame(), cfg.norm_position, cfg, init)
    df = df.merge(cov_probe.frame(), on="k", how="left")
    df["cov_z"] = df["cov"] / df["cov_se"]
    return df


#: Work per layer (tokens x d^2 multiply-adds) below which CPU threads cost more than
#: they give: at the check's default sizes one thread is 2-3x faster than two.
SMALL_WORK = 1 << 22


def check_check_args(deep_layers: Any, head_dims: Any, alpha: Any, model: ModelConfig) -> None:
    """ConfigError unless ``deep_layers`` is a whole number >= 1, ``head_dims`` valid
    head sizes and ``alpha`` a level strictly between 0 and 1."""
    check_count("deep_layers", deep_layers, MAX_LAYERS)
    check_head_dims(head_dims, model.positions)
    ok = isinstance(alpha, int | float) and not isinstance(alpha, bool) and 0 < alpha < 1
    if not ok:
        raise ConfigError("alpha", f"must be a level strictly between 0 and 1, got {alpha!r}")


def run_check(
    model: ModelConfig | None = None,
    init: InitConfig | None = None,
    run: RunConfig | None = None,
    deep_layers: int = CHECK_DEEP_LAYERS,
    head_dims: Sequence[int] = CHECK_HEAD_DIMS,
    alpha: float = CHECK_ALPHA,
    progress: Progress | None = None,
    on_partial: Partial | None = None,
) -> ExperimentResult:
    """Answer the five items; frame ``check`` has one row per claim (CHECK_COLUMNS).

    Also returns the frames behind the figures: ``variance`` (the (a)/(b) runs, with
    cov, cov_se, cov_z), ``stream_grads`` and ``grad_summary`` (c), ``params`` (d) and
    ``attention_scale`` (e). ``model.n_layers`` is the short depth, ``deep_layers`` the
    long one of (b). On the CPU, tiny shapes (under SMALL_WORK per layer) run on one
    thread (the numbers do not depend on it beyond float rounding).
    ``on_partial`` gets a function building the result so far after each item's measurement.
    """
    model = model or ModelConfig(**CHECK_MODEL)
    init, run = init or InitConfig(), run or RunConfig(**CHECK_RUN)
    check_check_args(deep_layers, head_dims, alpha, model)
    require_gradients(model, run)
    device = resolve_device(run.device)
    # before anything is allocated: the short model's backward, the deep one's forward
    for L, backward in ((model.n_layers, True), (deep_layers, False)):
        check_memory(dataclasses.replace(model, branch="model"), init, run, [("naive", "pre")], backward, L)
    small = device.type == "cpu" and run.batch * run.seq_len * model.d_model**2 <= SMALL_WORK
    with cpu_threads(1 if small else None), np.errstate(all="ignore"):
        return _run_check(model, init, run, deep_layers, head_dims, alpha, progress, on_partial)


def _k0(df: pd.DataFrame):
    return df["k"] == 0


#: Cells with no value by design (written empty): the embedding has no branch; the
#: check runs pre-norm only (no normalised stream); no relative error from a zero theory.
NOT_APPLICABLE = {
    "check": {"rel_err": lambda df: df["theory"] == 0},
    "variance": {"branch_var": _k0, "cross_corr": _k0, "cov": _k0, "cov_se": _k0, "cov_z": _k0,
                 "stream_var_normed": True},
    "stream_grads": STREAM_GRADS_NOT_APPLICABLE,
    "params_summary": PARAMS_NOT_APPLICABLE,
    "attention_scale": ATTENTION_NOT_APPLICABLE["attention_scale"],
}  # fmt: skip


def _run_check(model, init, run, deep_layers, head_dims, alpha, progress, on_partial) -> ExperimentResult:
    device, dtype = resolve_device(run.device), resolve_dtype(run.dtype)
    short, long = model.n_layers, deep_layers
    model = dataclasses.replace(model, branch="model")
    deep = dataclasses.replace(model, n_layers=long)
    stream = should_stream(deep, dtype, device, run.stream)
    tokens = make_tokens(model, run, init.seed if run.data_seed is None else run.data_seed, device)
    plan = [("model", "naive", short), ("gaussian", "naive", short), ("model", "scaled", short),
            ("model", "naive", long), ("model", "scaled", long)]  # fmt: skip
    # (variance: naive and scaled pre-norm; gradients: naive pre- and post-norm)
    grid = [("naive", "pre"), ("scaled", "pre"), ("naive", "post")]
    meta = run_meta(model, init, run, device, streamed=stream, deep_layers=long, head_dims=list(head_dims),
                    alpha=alpha, items={k: v[0] for k, v in ITEMS.items()}, configurations=grid)  # fmt: skip
    frames: dict[str, pd.DataFrame] = {}
    rows: list[dict] = []
    # the gradient and attention runs stop with their own IncompleteRun: the reason is theirs
    driver = Run(meta, lambda: {"check": pd.DataFrame(rows, columns=CHECK_COLUMNS), **frames}, NOT_APPLICABLE,
                 meter=Meter(device), on_partial=on_partial, progress=progress,
                 total=sum(L for _, _, L in plan) + 2 * 2 * short + len(head_dims) + 1,
                 nested=lambda exc: exc.result.error or str(exc))  # fmt: skip
    tick = driver.tick

    # (a), (b): the forward passes of the plan, timed together
    runs: dict[tuple[str, int], pd.DataFrame] = {}
    var_frames = []
    gauss, s2 = None, math.nan
    driver.meter.start()
    for branch, scheme, L in plan:
        cfg, ini = configure(dataclasses.replace(model, n_layers=L), init, run, scheme, "pre")
        if branch == "gaussian":
            s2 = float(runs[("naive", short)].query("k > 0")["branch_var"].mean())
            if not math.isfinite(s2):
                # the model run overflowed (its s^2 flagged in variance.csv): no branch
                # variance to draw the law's exact case from; its claim says so and fails
                tick(L)
                continue
            cfg = dataclasses.replace(cfg, branch="gaussian", branch_var=s2)
        with driver.guard(f"{branch} branches, {scheme} init, {L} layers"):
            df = measure_additions(cfg, ini, tokens, device, dtype, stream, on_block=tick)
        df = df.assign(init=scheme, norm_position="pre", n_layers=L, seed=init.seed, branch=branch)
        var_frames.append(df[CHECK_VARIANCE_COLUMNS])
        if branch == "gaussian":
            gauss = df
        else:
            runs[(scheme, L)] = df
    frames["variance"] = pd.concat(var_frames, ignore_index=True)
    driver.meter.stop("variance")
    rows += law_rows(runs[("naive", short)], gauss, s2, tokens.numel() * model.d_model, alpha,
                     runs[("naive", long)])  # fmt: skip
    rows += depth_rows(runs, short, long, alpha)
    driver.partial()

    # (c): the gradient run's forward and backward steps move our bar
    start, steps = tick.done, 2 * 2 * short
    grads = driver.step(
        "gradient norms",
        lambda: run_grad_norms(model, init, run, inits=("naive",), norm_positions=("pre", "post"),
                               progress=lambda d, t: tick(start + d - tick.done)),
        span="grad_norms", inner=lambda g: [g.meta],
    )  # fmt: skip
    if tick.done < start + steps:
        tick(start + steps - tick.done)
    frames["stream_grads"] = grads["stream_grads"]
    frames["grad_summary"] = grads["summary"]
    rows += gradient_rows(grads["summary"], grads["stream_grads"], run.batch * run.seq_len, alpha,
                          model.d_model)  # fmt: skip
    driver.partial()

    # (d): counted, not measured
    p_rows, p_frames = params_rows(model)
    rows += p_rows
    frames.update(p_frames)
    tick()
    driver.partial()

    # (e)
    att = driver.step(
        "attention scale",
        lambda: run_attention_scale(model, init, run, head_dims=head_dims, inputs=("unit",),
                                    progress=lambda d, t: tick()),
        span="attention_scale", inner=lambda a: [a.meta],
    )  # fmt: skip
    frames["attention_scale"] = att["attention_scale"]
    rows += attention_rows(att["attention_scale"], alpha, run.batch * model.n_heads)
    return driver.result()
