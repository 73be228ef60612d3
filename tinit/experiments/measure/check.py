"""The init primer's five "check yourself" items, each answered by a measurement with
a stated pass criterion.

(a) v_2L = 1 + 2L sigma^2 and its independence assumption, (b) depth-scaled init
makes v_2L independent of L, (c) pre-norm keeps an unattenuated gradient path and
post-norm does not, (d) the tied-embedding count, (e) the 1/sqrt(d_h) logit scale.

Statistics. Every tolerance is a two-sided test at level ``alpha`` (default 0.01)
against a standard error that the run itself supplies; a row that is the maximum over
m quantities uses the Bonferroni level alpha/m. The criteria are fixed here, before
any number is seen; a row that fails is reported as failed.

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
from ...model.catalogue import get_scheme
from ...model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from ...model.init import role_std
from ...model.transformer import Transformer
from ..configs import configure
from ..device import cpu_threads, make_tokens, resolve_device, resolve_dtype, stat_dtype
from ..driver import Meter, Run
from ..memory import should_stream
from ..meta import run_meta
from ..result import ExperimentResult, Partial, Progress
from .attention_scale import NOT_APPLICABLE as ATTENTION_NOT_APPLICABLE
from .attention_scale import check_head_dims, run_attention_scale
from .grad_norms import STREAM_GRADS_NOT_APPLICABLE, require_gradients, run_grad_norms
from .params import NOT_APPLICABLE as PARAMS_NOT_APPLICABLE
from .params import run_params
from .probes import VarianceProbe
from .variance import VARIANCE_COLUMNS, add_theory

CHECK_COLUMNS = ["item", "claim", "measured", "theory", "rel_err", "passed", "criterion", "caveat", "detail"]
CHECK_VARIANCE_COLUMNS = ["branch", *VARIANCE_COLUMNS, "cov", "cov_se", "cov_z"]

#: The primer's numbers for item (d).
BACKGROUND_VOCAB, BACKGROUND_D, BACKGROUND_TOTAL = 128000, 2048, 1.5e9

def t_quantile(alpha: float, df: int, m: int = 1) -> float:
    """Two-sided Student-t quantile at level alpha (Bonferroni over m): the x with
    P(|T_df| > x) = alpha / m, by bisection on the t CDF (Simpson's rule on the density;
    accurate to ~1e-8, no SciPy needed)."""
    tail = alpha / m / 2
    logc = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def upper(x: float) -> float:  # P(T > x) = 1/2 - integral_0^x density
        t = np.linspace(0.0, x, 4001)
        f = np.exp(logc - (df + 1) / 2 * np.log1p(t * t / df))
        h = x / 4000
        return 0.5 - h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())

    lo, hi = 0.0, z_quantile(alpha, m)
    while upper(hi) > tail:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if upper(mid) > tail else (lo, mid)
    return (lo + hi) / 2


class CovarianceProbe:
    """Cov(x_{k-1}, F_k) at every addition and its standard error under independence.

    ``capture`` is a forward pre-hook for the branch's last linear layer (W_O, W_down):
    it keeps that layer's input h. At the addition, with xc the centred stream,
    se^2 = std^2 ||xc^T h||_F^2 / N^2 (``std`` the recipe's std of that matrix); for a
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


def _f(x) -> np.float64:
    """A float64 scalar: dividing by zero gives inf or nan (flagged in the CSV) rather
    than raising, so a run whose numbers overflow or vanish still gets its verdicts."""
    return np.float64(x)


def _argmax(values: pd.Series):
    """The label of the largest value; the first row when every value is NaN."""
    return values.idxmax() if values.notna().any() else values.index[0]


def _row(item, claim, measured, theory, passed, detail, rel_err=None, criterion="", caveat="") -> dict:
    """One claim. ``criterion``: the pass rule in a few words (printed beside the verdict);
    ``caveat``: why a large error beside a pass is expected (empty when none)."""
    if rel_err is None:
        rel_err = measured / theory - 1.0 if theory not in (0, None) and math.isfinite(theory) else math.nan
    return {
        "item": item, "claim": claim, "measured": float(measured), "theory": float(theory),
        "rel_err": float(rel_err), "passed": bool(passed), "criterion": criterion, "caveat": caveat,
        "detail": detail,
    }  # fmt: skip


# --- (a) ---


#: A law error beyond this beside a pass gets a caveat (why its tolerance is that wide).
WIDE_ERROR = 0.10


def law_row(df: pd.DataFrame, alpha: float) -> dict:
    """(a) at one depth: v_2L / v0 against the law v0 + sum s_k^2 (the measured branch
    variances), judged by the z of their difference, 2 sum Cov_k, against its exact
    standard error under independence."""
    adds = df[df["k"] > 0]
    L2 = len(adds)
    v0, v_final = _f(df["stream_var"].iloc[0]), _f(df["stream_var"].iloc[-1])
    law = _f(df["pred_cumulative"].iloc[-1])  # v0 + sum s_k^2 = v0 (1 + 2L sigma^2)
    sigma2 = _f(adds["branch_var"].mean()) / v0
    # v_2L - law = 2 sum Cov_k exactly; under independence its SE is 2 sqrt(sum se_k^2)
    se = 2 * np.sqrt(_f((adds["cov_se"] ** 2).sum()))
    z = (v_final - law) / se
    zc = z_quantile(alpha)
    err = v_final / law - 1
    caveat = ""
    if abs(z) <= zc and abs(err) > WIDE_ERROR:
        caveat = (
            f"(a) at L={L2 // 2}: {100 * err:+.0f}% is {z:+.2f} SE: deep in a naive stack the tokens "
            f"become alike and the covariances' standard error widens ({100 * se / law:.0f}% of the law), "
            f"so the law is not rejected there but is confirmed only to ±{100 * zc * se / law:.0f}%"
        )
    return _row(
        "a", f"v_2L / v0 = 1 + 2L sigma^2 (naive init, pre-norm, L={L2 // 2})", v_final / v0, law / v0,
        abs(z) <= zc,
        f"2L={L2}, sigma^2 = mean s^2/v0 = {sigma2:.4g}; error {100 * err:+.2f}% = "
        f"{z:+.2f} SE (SE {100 * se / law:.2f}% from the {L2} covariances; pass |z| <= {zc:.2f})",
        criterion=f"|z| ≤ {zc:.2f}", caveat=caveat,
    )  # fmt: skip


def law_rows(
    df: pd.DataFrame, gauss: pd.DataFrame, s2: float, n_el: int, alpha: float,
    deep: pd.DataFrame | None = None,
) -> list[dict]:
    """(a): the law with model branches at each depth the check runs (``df`` and the
    naive ``deep`` run: the claim speaks of every L), the independence assumption, and
    the exact model (``gauss``: Gaussian branches of variance ``s2``, ``n_el`` elements
    per tensor)."""
    adds = df[df["k"] > 0]
    L2 = len(adds)
    zc = z_quantile(alpha)
    rows = [law_row(df, alpha)] + ([law_row(deep, alpha)] if deep is not None else [])
    zs = adds["cov_z"].abs()
    zb = z_quantile(alpha, L2)
    worst = adds.loc[_argmax(zs)]
    rows.append(
        _row(
            "a", "Cov(stream, branch) = 0 at every addition", _f(adds["cross_corr"].abs().max()), 0.0,
            _f(zs.max()) <= zb,
            f"max |corr| over {L2} additions; max |z| = {zs.max():.2f} at k={int(worst['k'])} "
            f"(pass <= {zb:.2f}, Bonferroni); mean z = {adds['cov_z'].mean():+.2f}",
            rel_err=math.nan, criterion=f"max |z| ≤ {zb:.2f}",
        )
    )  # fmt: skip
    # the exact model: v_2L = v0 + 2L S2 with S2 given, not measured
    g_adds = gauss[gauss["k"] > 0]
    g_v0, g_final = _f(gauss["stream_var"].iloc[0]), _f(gauss["stream_var"].iloc[-1])
    pred = g_v0 + L2 * s2
    # sum of 2L sample variances (each SE S2 sqrt(2/(N-1))) plus the covariance terms
    g_se = np.sqrt(L2 * 2 * s2**2 / (n_el - 1) + 4 * _f((g_adds["cov_se"] ** 2).sum()))
    g_z = (g_final - pred) / g_se
    rows.append(
        _row(
            "a", "Gaussian branches (the law's exact case): v_2L = v0 + 2L S2", g_final / g_v0, pred / g_v0,
            abs(g_z) <= zc,
            f"S2 = {s2:.4g} (the model run's mean s^2); error {100 * (g_final / pred - 1):+.3f}% = "
            f"{g_z:+.2f} SE (SE {100 * g_se / pred:.3f}%; pass |z| <= {zc:.2f})",
            criterion=f"|z| ≤ {zc:.2f}",
        )
    )  # fmt: skip
    return rows


# --- (b) ---


def _depth_weight(recipe: str, L: int) -> float:
    """The scheme's depth factor of the branch variance at depth L (1/(2L) for gpt2,
    1 for naive); the check uses schemes whose factor does not depend on the layer."""
    factor = get_scheme(recipe).depth_factor
    return 1.0 if factor is None else factor[0](l=0.0, L=float(L))


def _unscaled(df: pd.DataFrame, recipe: str) -> pd.DataFrame:
    """Per-addition branch variance in units of the unscaled recipe: u = s^2 / w(L),
    i.e. s^2 * 2L for the depth-scaled init (its W_O, W_down have variance
    sigma^2 / 2L), s^2 for naive."""
    adds = df[df["k"] > 0]
    factor = 1.0 / _depth_weight(recipe, int(adds["n_layers"].iloc[0]))
    u = adds["branch_var"].to_numpy() * factor
    return pd.DataFrame({"sublayer": adds["sublayer"].to_numpy(), "u": u})


def depth_prediction(short: pd.DataFrame, long: pd.DataFrame, recipe: str) -> dict:
    """Predict the long run's v_2L from the short run's branch variances; the ratio
    v_2L(long) / v_2L(short), its theory and its relative standard error."""
    L_a, L_b = int(short["n_layers"].iloc[0]), int(long["n_layers"].iloc[0])
    u_a, u_b = _unscaled(short, recipe), _unscaled(long, recipe)
    means = u_a.groupby("sublayer")["u"].mean()
    # pooled within-run variance of u, per sublayer (attention and FFN differ systematically)
    sd2 = {}
    for sub in means.index:
        a, b = u_a.loc[u_a["sublayer"] == sub, "u"], u_b.loc[u_b["sublayer"] == sub, "u"]
        ss = ((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum()
        sd2[sub] = ss / max(len(a) + len(b) - 2, 1)

    def w(L: int) -> float:
        return _depth_weight(recipe, L)

    v0 = _f(short["stream_var"].iloc[0])
    pred_a = v0 + w(L_a) * L_a * means.sum()
    pred_b = v0 + w(L_b) * L_b * means.sum()
    cov_a = 4 * _f((short.loc[short["k"] > 0, "cov_se"] ** 2).sum())
    cov_b = 4 * _f((long.loc[long["k"] > 0, "cov_se"] ** 2).sum())
    var_b = w(L_b) ** 2 * sum(s * (L_b + L_b**2 / L_a) for s in sd2.values()) + cov_b
    v_a, v_b = _f(short["stream_var"].iloc[-1]), _f(long["stream_var"].iloc[-1])
    return {
        "L_short": L_a, "L_long": L_b, "v_short": v_a, "v_long": v_b,
        "ratio": v_b / v_a, "ratio_theory": pred_b / pred_a,
        "se_rel": np.sqrt(var_b / pred_b**2 + cov_a / pred_a**2),
        "sigma2": means.mean() / v0,
        "drift": {s: _f(u_b.loc[u_b["sublayer"] == s, "u"].mean() / m - 1) for s, m in means.items()},
    }  # fmt: skip


def depth_rows(runs: dict[tuple[str, int], pd.DataFrame], short: int, long: int, alpha: float) -> list[dict]:
    zc = z_quantile(alpha)
    rows = []
    for recipe, claim in (
        ("scaled", "scaled init: v_2L({long}) / v_2L({short}) = 1 (independent of L)"),
        ("naive", "naive init: v_2L grows as 1 + 2L sigma^2 ({long} vs {short} layers)"),
    ):
        p = depth_prediction(runs[(recipe, short)], runs[(recipe, long)], recipe)
        rel = p["ratio"] / p["ratio_theory"] - 1.0
        drift = ", ".join(f"{k} {100 * v:+.1f}%" for k, v in p["drift"].items())
        rows.append(
            _row(
                "b", claim.format(long=long, short=short), p["ratio"], p["ratio_theory"],
                abs(rel) <= zc * p["se_rel"],
                f"v_2L {p['v_short']:.4g} -> {p['v_long']:.4g}; error {100 * rel:+.2f}%, tolerance "
                f"+-{100 * zc * p['se_rel']:.2f}% ({zc:.2f} SE); branch variance drift {short}->{long} "
                f"layers (unscaled units): {drift}",
                rel_err=rel, criterion=f"|err| ≤ {100 * zc * p['se_rel']:.2f}%",
            )
        )  # fmt: skip
    return rows


# --- (c) ---


def gradient_rows(
    summary: pd.DataFrame, streams: pd.DataFrame, n_tokens: int, alpha: float, d_model: int = 0
) -> list[dict]:
    rows = []
    pre = streams[streams["norm_position"] == "pre"]
    if len(pre):
        L2 = int(pre["k"].max())
        z = z_quantile(alpha, L2, two_sided=False)
        bound = np.sqrt(max(1.0 - z**2 / n_tokens, 0.0))
        low = pre.loc[_argmax(-pre["stream_grad_rel"])]
        rows.append(
            _row(
                "c", "pre-norm: stream gradient never falls below the top's (identity gain 1)",
                _f(low["stream_grad_rel"]), 1.0, _f(low["stream_grad_rel"]) >= bound,
                f"min over k of RMS grad_k / RMS grad_2L, at k={int(low['k'])}; at k=0: "
                f"{_f(pre['stream_grad_rel'].iloc[0]):.3g} (branch paths add); pass >= {bound:.4f} "
                f"(1 - z^2/T, T={n_tokens} tokens, z={z:.2f})",
                criterion=f"≥ {bound:.4f}",
            )
        )  # fmt: skip
    post = streams[streams["norm_position"] == "post"].sort_values("k")
    if len(post) > 2:
        rows += post_norm_rows(post, n_tokens, alpha, d_model)
    return rows


def post_norm_rows(post: pd.DataFrame, n_tokens: int, alpha: float, d_model: int = 0) -> list[dict]:
    """(c), post-norm, in two parts, so that no pass rests on what it does not test:

    - from k = 1 to 2L (after the first norm): the measured gain RMS grad_1 / RMS grad_2L
      against the norms' compounded gain prod_{j>=2} 1/sqrt(var s_j). With small branches
      every s_j has variance ~1 and that product is ~1: then post-norm attenuates nothing
      here, and the row says so (its caveat) instead of passing as if it did;
    - the first norm alone: RMS grad_0 / RMS grad_1 against 1/sqrt(var s_1), which is
      the embedding's scale (x50 for a 0.02 embedding), not a compounding over depth.
      The norm divides each token by its own rms; for Gaussian tokens of d components
      (the embedding) the mean square is var * chi2_d / d, and the RMS over tokens of
      1/rms is sqrt(E[d / chi2_d] / var) = sqrt(d / (d - 2)) / sqrt(var): +1.6% at d = 64.
      (After the first norm every token's mean square is 1: no such spread.)

    Tolerance: |log(measured / prediction)| <= -log sqrt(1 - z^2/T), the allowance of the
    pre-norm row's bound (T tokens; z at alpha, Bonferroni over the 2L additions)."""
    L2 = int(post["k"].max())
    z = z_quantile(alpha, L2, two_sided=False)
    tol = -0.5 * np.log(max(1.0 - z**2 / n_tokens, 1e-12))
    at = post.set_index("k")
    m1, g1 = _f(at.loc[1, "stream_grad_rel"]), _f(at.loc[1, "pred_identity_gain"])
    m0, g0 = _f(at.loc[0, "stream_grad_rel"]), _f(at.loc[0, "pred_identity_gain"])
    d1 = abs(np.log(m1 / g1))
    caveat = ""
    if abs(g1 - 1) < 0.05:
        caveat = (
            f"(c) post-norm from k = 1: the norms' compounded gain is {g1:.4g} here, as pre-norm's 1: with "
            "small branches each addition's sum has variance ~1 and each norm's gain 1/sqrt(var s) is ~1, so "
            "at this sigma post-norm attenuates nothing after the first norm (what passes is the mechanism, "
            "not an attenuation); an attenuation needs branch variances of order 1 (--sigma inv-sqrt-d), "
            "where the branch paths, which the prediction leaves out, then carry the gradient"
        )
    rows = [_row(
        "c", f"post-norm, k = 1..{L2}: gradient gain = the norms' product prod_(j>=2) 1/sqrt(var s_j), not 1",
        m1, g1, d1 <= tol,
        f"RMS grad_1 / RMS grad_{L2} (after the first norm); |log(measured/prediction)| = {d1:.4f}, "
        f"pass <= {tol:.4f} (-log sqrt(1 - z^2/T), T={n_tokens} tokens, z={z:.2f}); the product "
        f"differs from 1 by {100 * (g1 - 1):+.2f}%",
        criterion=f"|log(m/p)| ≤ {tol:.3f}", caveat=caveat,
    )]  # fmt: skip
    spread = math.sqrt(d_model / (d_model - 2)) if d_model > 2 else 1.0
    m01, g01 = m0 / m1, g0 / g1 * spread
    d0 = abs(np.log(m01 / g01))
    rows.append(_row(
        "c", "post-norm, first norm: gain 1/sqrt(var s_1) (the embedding's scale, not depth)",
        m01, g01, d0 <= tol,
        f"RMS grad_0 / RMS grad_1; var s_1 = {(spread / g01) ** 2:.4g} (the embedding plus the first "
        f"branch); prediction sqrt(d/(d-2))/sqrt(var s_1), the per-token rms spread of d={d_model} "
        "Gaussian components; "
        f"|log(measured/prediction)| = {d0:.4f}, pass <= {tol:.4f}",
        criterion=f"|log(m/p)| ≤ {tol:.3f}",
    ))  # fmt: skip
    return rows


# --- (d) ---


def params_rows(model: ModelConfig) -> tuple[list[dict], dict[str, pd.DataFrame]]:
    """(d): the primer's shape and the configured model; the frames ``params``,
    ``params_summary`` (a ``model`` column tells them apart) and ``ffn`` (the primer's)."""
    # a fresh config: d_ff is derived from this d (replace() would keep a resolved d_ff)
    background = ModelConfig(vocab_size=BACKGROUND_VOCAB, d_model=BACKGROUND_D, n_heads=16)
    res_bg = run_params(background, reference_total=BACKGROUND_TOTAL)
    res_cfg = run_params(model)
    s_bg, s_cfg = res_bg["summary"].iloc[0], res_cfg["summary"].iloc[0]
    V, d = BACKGROUND_VOCAB, BACKGROUND_D
    frac = float(s_bg["saved_frac_reference"])
    rows = [
        _row(
            "d", f"tied head saves V*d = {V * d:,} (V={V}, d={d})", s_bg["saved"], V * d,
            int(s_bg["saved"]) == V * d,
            f"exact count: untied {int(s_bg['total_untied']):,} - tied {int(s_bg['total_tied']):,} "
            f"(L={int(s_bg['n_layers'])}; the saving does not depend on the blocks)",
            criterion="exact",
        ),
        _row(
            "d", "... about 17.5% of a 1.5B model", frac, 0.175, abs(100 * frac - 17.5) < 0.05,
            f"{int(s_bg['saved']):,} / 1.5e9 = {100 * frac:.3f}% (pass: 17.5% at the stated 0.1 pt)",
            criterion="± 0.05 pt",
        ),
    ]  # fmt: skip
    theory_cfg = model.vocab_size * model.d_model + (model.vocab_size if model.bias else 0)
    rows.append(
        _row(
            "d", "this model: untied - tied = V*d" + (" + V (head biases)" if model.bias else ""),
            s_cfg["saved"], theory_cfg, int(s_cfg["saved"]) == theory_cfg,
            f"V={model.vocab_size}, d={model.d_model}: {100 * s_cfg['saved_frac_untied']:.1f}% of the "
            f"untied total {int(s_cfg['total_untied']):,}",
            criterion="exact",
        )
    )  # fmt: skip
    names = (f"V={V}, d={d}", "configured")

    def both(key: str) -> pd.DataFrame:
        frames = [r[key].assign(model=n) for r, n in zip((res_bg, res_cfg), names, strict=True)]
        df = pd.concat(frames, ignore_index=True)
        return df[["model", *[c for c in df.columns if c != "model"]]]

    return rows, {"params": both("params"), "params_summary": both("summary"), "ffn": res_bg["ffn"]}


# --- (e) ---


def attention_rows(frame: pd.DataFrame, alpha: float, n_units: int) -> list[dict]:
    rows = []
    tq = t_quantile(alpha, max(n_units - 1, 1))
    for r in frame.itertuples(index=False):
        z = (r.logit_var - r.pred_logit_var) / r.logit_var_se
        claim = (
            f"d_h={r.head_dim}: logit var of q.k/sqrt(d_h) = 1"
            if r.scaled
            else f"d_h={r.head_dim}: logit var of q.k = d_h"
        )
        rows.append(
            _row(
                "e", claim, r.logit_var, r.pred_logit_var, abs(z) <= tq,
                f"{z:+.2f} SE (SE {100 * r.logit_var_se / r.pred_logit_var:.2f}%, {n_units} units; pass "
                f"|t| <= {tq:.2f}); entropy/log n {r.entropy_rel:.3f}, max weight {r.max_weight:.3f}",
                criterion=f"|t| ≤ {tq:.2f}",
            )
        )  # fmt: skip
    return rows


#: Work per layer (tokens x d^2 multiply-adds) below which CPU threads cost more than
#: they give: at the check's default sizes one thread is 2-3x faster than two.
SMALL_WORK = 1 << 22


def check_check_args(deep_layers: Any, head_dims: Any, alpha: Any, model: ModelConfig) -> None:
    """ConfigError unless ``deep_layers`` is a whole number >= 1, ``head_dims`` valid
    head sizes and ``alpha`` a level strictly between 0 and 1."""
    if isinstance(deep_layers, bool) or not isinstance(deep_layers, int) or deep_layers < 1:
        raise ConfigError("deep_layers", f"must be a whole number >= 1, got {deep_layers!r}")
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
    ``on_partial`` is called with the result so far after each item's measurement.
    """
    model = model or ModelConfig(**CHECK_MODEL)
    init, run = init or InitConfig(), run or RunConfig(**CHECK_RUN)
    check_check_args(deep_layers, head_dims, alpha, model)
    require_gradients(model, run)
    device = resolve_device(run.device)
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
    for branch, recipe, L in plan:
        cfg, ini = configure(dataclasses.replace(model, n_layers=L), init, run, recipe, "pre")
        if branch == "gaussian":
            mean_s2 = float(runs[("naive", short)].query("k > 0")["branch_var"].mean())
            cfg = dataclasses.replace(cfg, branch="gaussian", branch_var=mean_s2)
        with driver.guard(f"{branch} branches, {recipe} init, {L} layers"):
            df = measure_additions(cfg, ini, tokens, device, dtype, stream, on_block=tick)
        df = df.assign(init=recipe, norm_position="pre", n_layers=L, seed=init.seed, branch=branch)
        var_frames.append(df[CHECK_VARIANCE_COLUMNS])
        if branch == "gaussian":
            gauss, s2 = df, cfg.branch_var
        else:
            runs[(recipe, L)] = df
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
