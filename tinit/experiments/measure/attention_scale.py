"""Attention logits at init, with and without the 1/sqrt(d_h) scale (Vaswani et al.
2017, section 3.2.1 and footnote 4).

A dot product q.k of two d_h-dimensional vectors with i.i.d. unit-variance components
has variance d_h; divided by sqrt(d_h) it has variance 1. Two inputs:

- ``unit``: q and k drawn i.i.d. N(0, 1) per component -- the textbook case, where the
  unscaled logit variance is d_h and the scaled one 1.
- ``model``: the real layer-0 W_Q and W_K of a model at init (the scheme's weights,
  drawn per (seed, layer, role)) applied to the normalised stream of the model's
  embedding of seeded tokens (RoPE applied when the model uses it: a rotation, it
  leaves the variance unchanged). Each component of q and k then has variance
  d sigma^2, so the logit variance is d_h (d sigma^2)^2 unscaled and (d sigma^2)^2
  scaled (:func:`tinit.theory.logit_var_model`).

The head count is fixed (``model.n_heads``) and d_model = n_heads * d_h, so in the
``model`` input d grows with d_h.

Softmax statistics use the model's mask (causal by default). Query i then sees n_i
visible keys (i + 1 causal, T bidirectional); its entropy is divided by its maximum,
log n_i, and queries with a single visible key (n_i = 1, the first causal query, whose
attention is trivially one-hot) are left out of ``entropy_rel`` and ``max_weight``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from ... import theory
from ...model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from ...model.init import generator, init_weights_
from ...model.layers import Attention, apply_rope, make_norm
from ...model.transformer import Transformer, to_empty
from ..device import make_tokens, resolve_device, resolve_dtype, stat_dtype
from ..driver import Meter, Run
from ..meta import run_meta
from ..result import ExperimentResult, Partial, Progress

INPUTS = ("unit", "model")
COLUMNS = [
    "input", "head_dim", "n_heads", "d_model", "scaled", "batch", "seq_len", "sigma", "seed",
    "q_var", "k_var", "pred_qk_var", "input_ms",
    "logit_var", "logit_var_se", "pred_logit_var", "rel_err", "pred_logit_var_ms", "rel_err_ms",
    "entropy_rel", "max_weight", "max_weight_uniform",
]  # fmt: skip


def _ratio(a: float, b: float) -> float:
    """a / b in IEEE arithmetic: inf or nan (flagged in the CSV) where b is 0."""
    with np.errstate(all="ignore"):
        return float(np.float64(a) / np.float64(b))


def _unit(df: pd.DataFrame):
    return df["input"] == "unit"


#: Cells with no value by design (written empty): unit q, k have no model around them.
NOT_APPLICABLE = {"attention_scale": {"d_model": _unit, "sigma": _unit, "input_ms": _unit}}


def check_head_dims(head_dims: Sequence[int], positions: str = "rope") -> list[int]:
    """The head sizes as a list of distinct positive ints (even ones with RoPE), or a
    ConfigError (a repeated size would give duplicated rows)."""
    try:
        out = list(head_dims)
    except TypeError:
        raise ConfigError("head_dims", f"give a list of head sizes, got {head_dims!r}") from None
    if not out:
        raise ConfigError("head_dims", "give at least one head size")
    for i, h in enumerate(out):
        if isinstance(h, bool) or not isinstance(h, int) or h < 1:
            raise ConfigError("head_dims", f"head sizes must be whole numbers >= 1, got {h!r}")
        if positions == "rope" and h % 2:
            raise ConfigError("head_dims", f"RoPE needs even head sizes, got {h}")
        if h in out[:i]:
            raise ConfigError("head_dims", f"{h} is given more than once; each head size must appear once")
    return out


def visible_mask(seq_len: int, causal: bool, device: torch.device) -> torch.Tensor:
    """(T, T) bool: which keys each query sees."""
    full = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device)
    return torch.tril(full) if causal else full


def attention_weights(logits: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the visible keys: (weights, log-weights), masked entries 0 and -inf."""
    logp = torch.log_softmax(logits.masked_fill(~mask, -math.inf), dim=-1)
    return logp.exp(), logp


def logit_stats(
    q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool, stats: torch.dtype
) -> dict[str, torch.Tensor]:
    """Statistics of softmax(scale * q k^T) for q, k of shape (batch, heads, T, d_h).

    Returns, on the device: ``var_bh`` (batch, heads), the mean squared deviation of each
    (sequence, head)'s visible logits from the mean of all visible logits, so that their
    average is the pooled variance (docs/design.md §11); ``entropy_rel`` and ``max_weight``,
    means over batch, heads and the queries with >= 2 visible keys of H_i / log n_i and
    max_j p_ij; ``max_weight_uniform``, the mean of 1 / n_i over the same queries (what
    uniform attention would give).
    """
    t = q.shape[-2]
    mask = visible_mask(t, causal, q.device)
    logits = (q @ k.transpose(-1, -2)).to(stats) * scale
    count = mask.sum()
    mean = logits.masked_fill(~mask, 0).sum() / (count * logits.shape[0] * logits.shape[1])
    var_bh = ((logits - mean).masked_fill(~mask, 0) ** 2).sum((-1, -2)) / count
    p, logp = attention_weights(logits, mask)
    entropy = -(p * logp).masked_fill(~mask, 0).sum(-1)  # (batch, heads, T)
    n_visible = mask.sum(-1).to(stats)  # (T,)
    rows = n_visible > 1
    return {
        "var_bh": var_bh,
        "entropy_rel": (entropy[..., rows] / n_visible[rows].log()).mean(),
        "max_weight": p.amax(-1)[..., rows].mean(),
        "max_weight_uniform": (1.0 / n_visible[rows]).mean(),
    }


def check_fits(run: RunConfig, n_heads: int, head_dim: int, device, dtype: torch.dtype) -> None:
    """Before anything is drawn: q and k (batch x heads x T x d_h each) and the logits
    (batch x heads x T x T, in the statistics dtype), which :func:`logit_stats` holds at
    once, fit in the free memory; else a ConfigError naming --seq-len, --batch or
    --head-dims, whichever drives the larger of the two (against 8 x 128 tokens, d_h 64)."""
    from ..memory import check_fits

    item, stats = torch.empty((), dtype=dtype).element_size(), 8 if dtype == torch.float64 else 4
    B, T = run.batch, run.seq_len
    qk, logits = 2 * B * n_heads * T * head_dim * item, B * n_heads * T * T * stats
    ratios = {"batch": B / 8, "seq_len": T / 128}
    if qk > logits:
        ratios["head_dims"] = head_dim / 64
    check_fits({("q", "k"): qk, ("logits",): logits}, {},
               f"{B} x {T} tokens, {n_heads} heads of d_h={head_dim} need", device,
               field=max(ratios, key=ratios.__getitem__),
               purpose=" for q, k and the logits")  # fmt: skip


def unit_qk(run: RunConfig, n_heads: int, head_dim: int, seed: int, device, dtype):
    """q, k of shape (batch, heads, T, d_h), i.i.d. N(0, 1), drawn per (seed, d_h)."""
    shape = (run.batch, n_heads, run.seq_len, head_dim)
    out = []
    for name in ("q", "k"):
        gen = generator(seed, -3, f"attention-scale/unit/{head_dim}/{name}", device)
        out.append(torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype))
    return out[0], out[1], math.nan


def layer0_qk(cfg: ModelConfig, init: InitConfig, device, dtype) -> tuple[nn.Module, nn.Module, nn.Module]:
    """Layer 0's first norm and its W_Q, W_K with the scheme's weights: the same draws a
    built block has (``init_weights_`` keys them by layer and role, and the names are the
    block's), without allocating W_V, W_O or the FFN."""
    with torch.device("meta"):
        norm, attn = make_norm(cfg, dtype=dtype), Attention(cfg, dtype=dtype)
    parts = []
    for name, module in (("norm1", norm), ("attn.q", attn.q), ("attn.k", attn.k)):
        module = to_empty(module, device)
        init_weights_(module, cfg, init, 0, prefix=name)
        parts.append(module)
    return parts[0], parts[1], parts[2]


@torch.no_grad()
def model_qk(cfg: ModelConfig, init: InitConfig, run: RunConfig, seed: int, device, dtype):
    """q, k (batch, heads, T, d_h) of the model at init: layer 0's W_Q, W_K on the
    normalised embedding of seeded tokens, RoPE'd when the model uses RoPE; and the
    mean square of the normalised stream (1 up to the norm's eps)."""
    net = Transformer(cfg, init, device, dtype, stream=True)  # embedding side only
    tokens = make_tokens(cfg, run, seed, device)
    norm, w_q, w_k = layer0_qk(cfg, init, device, dtype)
    x = norm(net.embed_tokens(tokens))
    b, t, _ = x.shape
    shape = (b, t, cfg.n_heads, cfg.head_dim)
    q = w_q(x).view(shape).transpose(1, 2)
    k = w_k(x).view(shape).transpose(1, 2)
    if net.rope is not None:
        q, k = apply_rope(q, *net.rope), apply_rope(k, *net.rope)
    input_ms = float(x.to(stat_dtype(dtype)).pow(2).mean())
    return q, k, input_ms


def run_attention_scale(
    model: ModelConfig | None = None,
    init: InitConfig | None = None,
    run: RunConfig | None = None,
    head_dims: Sequence[int] = (16, 32, 64, 128, 256),
    progress: Progress | None = None,
    inputs: Sequence[str] = INPUTS,
    on_partial: Partial | None = None,
) -> ExperimentResult:
    """Logit variance, softmax entropy and largest weight at init for each head size,
    unscaled and scaled by 1/sqrt(d_h), for unit-variance q, k and for the model's own
    projections. ``model.n_heads`` is held fixed; d_model = n_heads * d_h.

    Returns frame ``attention_scale``: one row per (input, head_dim, scaled).
    ``logit_var_se`` is the standard error from the spread over independent units:
    (sequence, head) pairs for ``unit``, heads (independent rows of W_Q, W_K) for ``model``.
    ``on_partial`` gets a function building the result so far after each (input, head size).

    >>> run = RunConfig(batch=2, seq_len=32)
    >>> res = run_attention_scale(ModelConfig(n_heads=4), run=run, head_dims=(8, 16))
    >>> res["attention_scale"][["input", "head_dim", "scaled", "logit_var"]]  # doctest: +SKIP
    """
    model, init, run = model or ModelConfig(), init or InitConfig(), run or RunConfig()
    dims = check_head_dims(head_dims, model.positions)
    for name in inputs:
        if name not in INPUTS:
            raise ConfigError("inputs", f"{name!r} is not one of {', '.join(map(repr, INPUTS))}")
    device, dtype = resolve_device(run.device), resolve_dtype(run.dtype)
    stats = stat_dtype(dtype)
    seed = init.seed if run.data_seed is None else run.data_seed
    causal = model.attention == "causal"
    n_heads = model.n_heads
    check_fits(run, n_heads, max(dims), device, dtype)
    rows: list[dict] = []
    meta = run_meta(
        model, init, run, device, head_dims=dims, n_heads=n_heads, inputs=list(inputs),
        d_models={h: n_heads * h for h in dims},
        entropy_rel="mean over queries with >= 2 visible keys of entropy / log(visible keys)",
    )  # fmt: skip
    driver = Run(meta, lambda: {"attention_scale": pd.DataFrame(rows, columns=COLUMNS)}, NOT_APPLICABLE,
                 meter=Meter(device), on_partial=on_partial, progress=progress,
                 total=len(dims) * len(inputs))  # fmt: skip

    def measure(unit: tuple[str, int]) -> None:
        """Both rows (unscaled, scaled) of one (input, head size), each kept as it is measured."""
        name, h = unit
        cfg = dataclasses.replace(
            model, d_model=n_heads * h, d_ff=None, max_seq_len=max(model.max_seq_len, run.seq_len)
        )
        sigma = init.resolved_sigma(cfg.d_model)
        if name == "unit":
            q, k, input_ms = unit_qk(run, n_heads, h, seed, device, dtype)
            pred_qk = 1.0
        else:
            q, k, input_ms = model_qk(cfg, init, run, seed, device, dtype)
            pred_qk = theory.qk_component_var(cfg.d_model, sigma)
        # the theory takes a unit mean-square input; the norm's eps makes it
        # 1 - eps / mean(x0^2), and the logit variance scales with its square
        ms2 = 1.0 if name == "unit" else input_ms**2
        q_var = float(q.to(stats).var(correction=0))
        k_var = float(k.to(stats).var(correction=0))
        for scaled in (False, True):
            s = logit_stats(q, k, 1.0 / math.sqrt(h) if scaled else 1.0, causal, stats)
            var_bh = s["var_bh"].to(torch.float64)
            # independent units: (sequence, head) for unit q, k; heads for the model
            units = var_bh.flatten() if name == "unit" else var_bh.mean(0)
            se = float(units.std() / math.sqrt(units.numel())) if units.numel() > 1 else math.nan
            if name == "unit":
                pred = theory.logit_var_unit(h, scaled)
            else:
                pred = theory.logit_var_model(h, cfg.d_model, sigma, scaled)
            logit_var = float(units.mean())
            rows.append({
                "input": name, "head_dim": h, "n_heads": n_heads,
                "d_model": cfg.d_model if name == "model" else math.nan,
                "scaled": scaled, "batch": run.batch, "seq_len": run.seq_len,
                "sigma": sigma if name == "model" else math.nan, "seed": seed,
                "q_var": q_var, "k_var": k_var, "pred_qk_var": pred_qk, "input_ms": input_ms,
                "logit_var": logit_var, "logit_var_se": se, "pred_logit_var": pred,
                "rel_err": _ratio(logit_var, pred) - 1.0,
                "pred_logit_var_ms": pred * ms2, "rel_err_ms": _ratio(logit_var, pred * ms2) - 1.0,
                "entropy_rel": float(s["entropy_rel"]), "max_weight": float(s["max_weight"]),
                "max_weight_uniform": float(s["max_weight_uniform"]),
            })  # fmt: skip
        del q, k

    driver.each([(name, h) for name in inputs for h in dims], measure, lambda _unit, _: driver.tick(),
                label=lambda u: f"{u[0]} input, d_h={u[1]}", span=lambda u: f"{u[0]}/{u[1]}")  # fmt: skip
    return driver.result()
