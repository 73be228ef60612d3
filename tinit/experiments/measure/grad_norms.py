"""Per-layer gradient norms at initialization, pre- vs post-norm (Xiong et al. 2020,
"On Layer Normalization in the Transformer Architecture", Figure 3).

For each (init recipe, norm position) the same seeded token batches go through a
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

Two ways to get the gradients, with the same numbers. *Autograd*: a fully built
model, one ordinary backward per batch. *Layer-wise* (streamed; automatic when the
built model with gradients would not fit, or ``RunConfig.stream=True``): the forward
pass runs without gradients and keeps only the stream at each layer boundary; the
loss is taken from the last stream; then the layers are walked backwards, each
block rebuilt from its (seed, layer, role) draws, recomputed with gradients on its
saved input, back-propagated with the incoming stream gradient, its gradient norms
recorded on the device, and dropped. Embedding, final norm and head are held; with
tied embeddings the embedding's gradient collects both the head's contribution (at
the loss) and the input lookup's (after the walk). Memory holds one block and the
layer-boundary streams, never all the weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from ... import theory
from ...model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from ...model.init import draw_seed, role_of
from ...model.transformer import Transformer, build_block
from ..configs import check_configs, config_label, config_name, configure, grid
from ..device import make_tokens, matmul_precision, resolve_device, resolve_dtype, stat_dtype
from ..driver import Meter, Run
from ..memory import backward_bound, should_stream
from ..meta import run_meta
from ..result import ExperimentResult, Partial, Progress
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


def param_key(name: str, n_layers: int) -> tuple[int, str]:
    """(layer, tensor) of a model parameter name: blocks.3.attn.o.weight -> (3, "o"),
    blocks.3.norm1.weight -> (3, "norm1"), embed.weight -> (-1, "embed"),
    head.weight -> (L, "head"); biases keep a ``.bias`` suffix."""
    parts = name.split(".")
    if parts[0] == "blocks":
        layer, local = int(parts[1]), parts[2:]
    else:
        layer, local = (-1 if parts[0] in ("embed", "pos") else n_layers), parts
    if local[0] in ("attn", "ffn") and len(local) > 2:
        local = local[1:]
    if local[-1] == "weight":
        local = local[:-1]
    return layer, ".".join(local)


def next_token_loss(
    net: Transformer, x: torch.Tensor, tokens: torch.Tensor, stats: torch.dtype
) -> torch.Tensor:
    """Mean cross-entropy of predicting token t+1 from the stream at t (logits in the
    statistics dtype, so a bf16 run takes its loss in float32)."""
    logits = net.logits(x)[:, :-1].to(stats)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


class _BlockReached:
    """The backward hook of a block's last addition: counts and reports progress.

    A hook registered on a tensor lives on the C++ side of autograd, where Python's
    garbage collector cannot see it, so it must not reach the tap (whose ``streams``
    hold the tensor that holds the hook: a cycle the collector never frees, keeping
    every stream, its gradient and through the graph the weights of every
    configuration alive). It holds only the callback and a count."""

    __slots__ = ("callback", "count")

    def __init__(self, callback: Callable[[], None]):
        self.callback, self.count = callback, 0

    def __call__(self, grad: torch.Tensor) -> None:
        self.count += 1
        self.callback()


class GradTap:
    """Probe that keeps the stream tensor of every addition (post-norm: the normalised
    output, the one that continues along the path) and retains its gradient; it can
    also feed a :class:`VarianceProbe`, outside autograd. ``on_block_grad`` is called
    each time the backward pass reaches a block's output (progress through the
    backward; ``block_grads`` counts those calls). Call :meth:`close` once the
    gradients are read: it lets go of every tensor the tap (and its variance probe)
    holds, so nothing of a configuration outlives it."""

    def __init__(
        self, variance: VarianceProbe | None = None, on_block_grad: Callable[[], None] | None = None
    ):
        self.streams: dict[int, torch.Tensor] = {}
        self.sums: dict[int, torch.Tensor] = {}  # post-norm: the sum before the norm
        self.variance = variance
        self._reached = _BlockReached(on_block_grad) if on_block_grad is not None else None

    @property
    def block_grads(self) -> int:
        return 0 if self._reached is None else self._reached.count

    def close(self) -> None:
        """Drop the kept streams (and the variance probe's last stream): their graphs,
        gradients and hooks go with them."""
        self.streams.clear()
        self.sums.clear()
        if self.variance is not None:
            self.variance.release()

    def __call__(self, k, layer, sublayer, stream_in, branch, stream_out, normed=None) -> None:
        if self.variance is not None:
            with torch.no_grad():
                self.variance(k, layer, sublayer, stream_in, branch, stream_out, normed)
        t = stream_out if normed is None else normed
        if t.requires_grad:
            t.retain_grad()
            self.streams[k] = t
            if self._reached is not None and sublayer == "ffn":  # the block's last addition
                t.register_hook(self._reached)
        if normed is not None and stream_out.requires_grad:
            stream_out.retain_grad()
            self.sums[k] = stream_out


#: Rows of the path accumulator (per addition k): |r_k|^2, |w_k|^2, <c_k w_k, r_k>, and
#: for post-norm |J_k^T g_k|^2 (the norm's per-token Jacobian applied to the gradient
#: g_k arriving at its output), |g_k|^2 and the part of |g_k|^2 along the tokens.
PATH_ROWS = 6


def norm_backward(s: torch.Tensor, y: torch.Tensor, g: torch.Tensor, layernorm: bool) -> tuple:
    """The norm's backward per token, from the forward sum ``s``, its normed output ``y``
    (unit gain, as at init) and the gradient ``g`` arriving at ``y``: (|J^T g|^2 summed
    over tokens, |g|^2 summed, sum of (y_t . g_t)^2 / |y_t|^2).

    RMSNorm y_t = s_t / r_t, r_t = sqrt(mean(s_t^2) + eps), has the Jacobian
    (1 / r_t)(I - y_t y_t^T / d): it scales each token's gradient by 1 / r_t and removes
    its component along the token (Xiong et al. 2020, eq. (5) for LayerNorm); LayerNorm
    also removes the component along 1 (its mean). r_t = |s_t - c_t| / |y_t|, with c_t the
    token's mean for LayerNorm and 0 for RMSNorm, so eps needs no separate handling."""
    d = s.shape[-1]
    centred = s - s.mean(dim=-1, keepdim=True) if layernorm else s
    r = torch.linalg.vector_norm(centred, dim=-1, keepdim=True) / torch.linalg.vector_norm(
        y, dim=-1, keepdim=True
    ).clamp_min(torch.finfo(y.dtype).tiny)
    along = (y * g).sum(dim=-1, keepdim=True)
    jg = g - y * along / d
    if layernorm:
        jg = jg - g.mean(dim=-1, keepdim=True)
    jg = jg / r
    removed = along.square() / y.square().sum(dim=-1, keepdim=True).clamp_min(torch.finfo(y.dtype).tiny)
    return jg.square().sum(), g.square().sum(), removed.sum()


def branch_paths(tap: GradTap, ks, coef, acc: torch.Tensor, stats: torch.dtype, extra=None,
                 layernorm: bool = False) -> None:  # fmt: skip
    """Split the gradient reaching the stream before addition k into its identity part
    and its branch part, for every k in ``ks``, and accumulate into ``acc``
    (PATH_ROWS, 2L+1): |r_k|^2, |w_k|^2 and <c_k w_k, r_k>. w_k is the gradient at the
    addition's output (post-norm: at the sum, before the norm), c_k the scheme's stream
    multiplier (times the x0-mix lambda), and r_k = u_{k-1} - c_k w_k what came back
    through the branch (u_{k-1}: the gradient at the stream entering addition k;
    ``extra`` supplies those the tap did not see, e.g. a block's input). Post-norm also
    accumulates the norm's per-token backward (:func:`norm_backward`)."""
    extra = extra or {}
    for k in ks:
        prev = extra[k - 1] if k - 1 in extra else tap.streams[k - 1].grad
        out = tap.sums[k] if k in tap.sums else tap.streams[k]
        if prev is None or out.grad is None:
            continue
        w = out.grad.to(stats)
        ident = float(coef[k - 1]) * w
        r = prev.to(stats) - ident
        acc[0, k] += r.square().sum()
        acc[1, k] += w.square().sum()
        acc[2, k] += (ident * r).sum()
        y = tap.streams[k]
        if k in tap.sums and y.grad is not None:  # post-norm: the norm between y_k and s_k
            jg, gg, removed = norm_backward(out.detach().to(stats), y.detach().to(stats), y.grad.to(stats),
                                            layernorm)  # fmt: skip
            acc[3, k] += jg
            acc[4, k] += gg
            acc[5, k] += removed


class _Recorder:
    """Gradient and parameter norms of one configuration, kept on the device."""

    def __init__(self, n_layers: int, batches: int, stats: torch.dtype):
        self.n_layers, self.batches, self.stats = n_layers, batches, stats
        self.keys: list[tuple[int, str, str, str]] = []
        self.values: list[torch.Tensor] = []

    def record(self, named_params) -> None:
        for name, p in named_params:
            if p.grad is None:  # unused by the loss (e.g. a norm before a Gaussian branch)
                g = torch.zeros((), dtype=self.stats, device=p.device)
            else:  # norm of the mean gradient = norm of the summed gradient / N
                g = torch.linalg.vector_norm(p.grad, dtype=self.stats) / self.batches
            w = torch.linalg.vector_norm(p.detach(), dtype=self.stats)
            layer, tensor = param_key(name, self.n_layers)
            self.keys.append((layer, tensor, name, role_of(name)[0]))
            self.values.append(torch.stack([g, w]))

    def frame(self) -> pd.DataFrame:
        """One row per parameter, in model order; one device-to-host transfer."""
        values = torch.stack(self.values).cpu().to(torch.float64).numpy()
        df = pd.DataFrame(self.keys, columns=["layer", "tensor", "param", "role"])
        df["grad_norm"], df["param_norm"] = values[:, 0], values[:, 1]
        return df.sort_values("layer", kind="stable").reset_index(drop=True)


def _autograd(net, toks, stats, sq, losses, probes, tick, coef=None, acc=None) -> None:
    """Ordinary autograd on a fully built model, one backward per batch (grads sum)."""
    L = net.cfg.n_layers
    for i, tok in enumerate(toks):
        tap = GradTap(probes[i], on_block_grad=tick)  # the backward ticks once per block too
        x = net.forward_stream(tok, tap, after_block=lambda _l: tick())
        loss = next_token_loss(net, x, tok, stats)
        loss.backward()
        losses.append(loss.detach())
        for k, t in tap.streams.items():
            sq[k] += t.grad.to(stats).square().sum()
        if acc is not None:
            branch_paths(tap, range(1, 2 * L + 1), coef, acc, stats, layernorm=net.cfg.norm == "layernorm")
        if tap.block_grads < L:  # (never, unless the backward missed a block's output)
            tick(L - tap.block_grads)
        tap.close()
        del tap, x, loss


def _layerwise(net, cfg, ini, device, dtype, toks, stats, sq, losses, probes, rec: _Recorder, tick,
               coef=None, acc=None) -> None:  # fmt: skip
    """The streamed backward: no-grad forward keeping layer-boundary streams, then a
    walk down the layers rebuilding, recomputing and back-propagating one block at a
    time. Records block gradient norms as it goes (``rec``)."""
    L = cfg.n_layers
    if ini.scheme.x0_mix is not None:
        raise ConfigError("stream", f"{ini.recipe} mixes x0 into every block: its streamed (layer-wise) "
                          "backward is not implemented; use --no-stream")  # fmt: skip
    with torch.no_grad():
        xs = [[net.embed_tokens(tok, probes[i])] for i, tok in enumerate(toks)]
        for layer in range(L):
            block = build_block(cfg, ini, layer, device, dtype)
            for i in range(len(toks)):
                xs[i].append(block(xs[i][layer], net.rope, probes[i]))
                tick()
            del block
    grads = []
    for i, tok in enumerate(toks):  # the loss: head (and tied embedding) get their grads here
        x_last = xs[i][L].requires_grad_()
        loss = next_token_loss(net, x_last, tok, stats)
        loss.backward()
        losses.append(loss.detach())
        grads.append(x_last.grad)
        sq[2 * L] += x_last.grad.to(stats).square().sum()
        xs[i][L] = None
    for layer in reversed(range(L)):
        block = build_block(cfg, ini, layer, device, dtype)
        for i in range(len(toks)):
            x_in = xs[i][layer].requires_grad_()
            tap = GradTap()
            out = block(x_in, net.rope, tap)
            out.backward(grads[i])
            sq[2 * layer + 1] += tap.streams[2 * layer + 1].grad.to(stats).square().sum()
            if acc is not None:
                branch_paths(tap, (2 * layer + 1, 2 * layer + 2), coef, acc, stats, {2 * layer: x_in.grad},
                             cfg.norm == "layernorm")  # fmt: skip
            grads[i] = x_in.grad  # d loss / d stream at addition 2*layer (layer 0: the embedding)
            sq[2 * layer] += grads[i].to(stats).square().sum()
            xs[i][layer] = None
            tap.close()
            del tap, out, x_in
            tick()
        rec.record(block.named_parameters(prefix=f"blocks.{layer}"))
        del block
    for i, tok in enumerate(toks):  # the input lookup: adds to the tied head's contribution
        net.embed_tokens(tok).backward(grads[i])


def stream_frame(
    sq: np.ndarray, count: int, stream_var: np.ndarray, norm_position: str, eps: float,
    stream_mult: np.ndarray | None = None, paths: np.ndarray | None = None,
):  # fmt: skip
    """stream_grads rows of one configuration, with the identity-path prediction and,
    with ``paths`` (from :func:`branch_paths`), the full-path one.

    Identity path: only post-norm has a norm on it, modelled as the scalar
    1/sqrt(var(s_j) + eps) from the forward variance of the sum; the others (pre,
    sandwich, reordered, none) pass the gradient unchanged, times the scheme's stream
    multipliers a_j (and x0-mix lambdas) above k. Full path: the gradient entering
    addition j from above is split into the identity part c_j w_j and the branch part
    r_j; with b_j = |r_j|^2 / |w_j|^2 the branch's backward gain (squared) and the two
    parts uncorrelated, |u_{j-1}|^2 = (c_j^2 + b_j) |w_j|^2, so the gain from 2L down to
    k is the product over j > k of sqrt(c_j^2 + b_j), times post-norm's norm backward
    sqrt(n_j): the norm's Jacobian per token, (1 / r_t)(I - y_t y_t^T / d), applied to
    the gradient arriving at its output (:func:`norm_backward`; n_j = |J^T g|^2 / |g|^2).
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
    post = norm_position == "post"
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
    of their norms."""
    wo = grads[grads["tensor"].isin(("o", "down"))]
    dead = {key for key, g in wo.groupby(["init", "norm_position"]) if (g["grad_norm"] == 0).all()}

    def no_tensor_grads(df):
        gaussian = model.branch == "gaussian"
        return pd.Series([gaussian or (i, p) in dead for i, p in zip(df["init"], df["norm_position"],
                                                                          strict=True)], index=df.index)

    return {"stream_grads": STREAM_GRADS_NOT_APPLICABLE,
            "summary": dict.fromkeys(TENSOR_STAT_COLUMNS, no_tensor_grads)}


def _embedding(df: pd.DataFrame):
    return df["k"] == 0


def _no_norm_on_path(df: pd.DataFrame):  # only post-norm has a norm between additions
    return _embedding(df) | (df["norm_position"] != "post")


#: stream_grads.csv's cells with no value by design, wherever the frame is written
#: (grad-norms, check, audit): the embedding (k = 0) has no branch, so no branch backward
#: gain or correlation; a branch that passes no gradient back has no correlation; only
#: post-norm has a norm between additions to measure the backward of.
STREAM_GRADS_NOT_APPLICABLE = {
    "branch_back_gain": _embedding,
    "grad_cross_corr": lambda df: _embedding(df) | (df["branch_back_gain"] == 0),
    "norm_back_gain": _no_norm_on_path,
    "norm_proj_frac": _no_norm_on_path,
}


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
    ``on_partial`` is called with the result so far after each configuration.

    >>> cfg = ModelConfig(n_layers=4, d_model=64, n_heads=2)
    >>> res = run_grad_norms(cfg, run=RunConfig(batch=2, seq_len=16))
    >>> res["summary"][["init", "norm_position", "down_ratio_first_last"]]  # doctest: +SKIP
    """
    model, init, run = model or ModelConfig(), init or InitConfig(), run or RunConfig()
    require_gradients(model, run)
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
        raise ConfigError("batches", f"must be a whole number >= 1, got {batches!r}")
    device, dtype = resolve_device(run.device), resolve_dtype(run.dtype)
    stats = stat_dtype(dtype)
    configs = list(grid(inits, norm_positions, init.schemes))
    check_configs(model, init, run, configs)
    # built whole, the backward holds weights, gradients and every block's saved activations
    need = None
    if run.stream is None:
        built = [configure(model, init, run, recipe, position) for recipe, position in configs]
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
        rec = _Recorder(L, batches, stats)
        sq = torch.zeros(2 * L + 1, dtype=stats, device=device)
        mult = theory.addition_multipliers(ini.scheme, cfg, ini)
        coef = mult["a"] * mult["lam"]
        acc = torch.zeros(PATH_ROWS, 2 * L + 1, dtype=stats, device=device)
        losses: list[torch.Tensor] = []
        probes = [VarianceProbe(stats) for _ in toks]
        with matmul_precision(run):
            if stream:
                _layerwise(net, cfg, ini, device, dtype, toks, stats, sq, losses, probes, rec, tick,
                           coef, acc)  # fmt: skip
            else:
                _autograd(net, toks, stats, sq, losses, probes, tick, coef, acc)
        rec.record(net.named_parameters())
        grads = rec.frame()
        sq_host = sq.cpu().to(torch.float64).numpy()
        acc_host = acc.cpu().to(torch.float64).numpy()
        loss = float(torch.stack(losses).mean())
        del net, rec, sq, losses
        return cfg, coef, grads, sq_host, acc_host, loss, probes

    def collect(config: tuple[str, str], measured) -> None:
        (recipe, norm_position), (cfg, coef, grads, sq_host, acc_host, loss, probes) = config, measured
        # forward variances, averaged over the batches (each batch has equal size)
        stream_var = np.mean([p.frame()["stream_var"].to_numpy() for p in probes], axis=0)
        count = batches * run.batch * run.seq_len * cfg.d_model
        streams = stream_frame(sq_host, count, stream_var, norm_position, cfg.norm_eps, coef, acc_host)
        labels = {"init": recipe, "norm_position": norm_position, "n_layers": L, "seed": init.seed}
        grad_frames.append(grads.assign(**labels))
        stream_frames.append(streams.assign(**labels))
        summaries.append({**labels, "batches": batches, "loss": loss, **summarize(grads, streams)})

    driver.each(configs, measure, collect, label=config_label, span=config_name)
    return driver.result()
