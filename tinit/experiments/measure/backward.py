"""The gradients of one configuration at init, two ways with the same numbers, and the
split of the gradient at each addition into its identity and branch parts.

*Autograd* (:func:`autograd_backward`): a fully built model, one ordinary backward per
batch. *Layer-wise* (:func:`layerwise_backward`; streamed: automatic when the built
model with gradients would not fit, or ``RunConfig.stream=True``): the forward pass
runs without gradients and keeps only the stream at each layer boundary; the loss is
taken from the last stream; then the layers are walked backwards, each block rebuilt
from its (seed, layer, role) draws, recomputed with gradients on its saved input,
back-propagated with the incoming stream gradient, its gradient norms recorded on the
device, and dropped. Embedding, final norm and head are held; with tied embeddings
the embedding's gradient collects both the head's contribution (at the loss) and the
input lookup's (after the walk). Memory holds one block and the layer-boundary
streams, never all the weights.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import torch
import torch.nn.functional as F

from ...model.config import ConfigError
from ...model.init import role_of
from ...model.transformer import Transformer, build_block
from .probes import VarianceProbe


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


class GradRecorder:
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


def autograd_backward(net, toks, stats, sq, losses, probes, tick, coef=None, acc=None) -> None:
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


def layerwise_backward(net, cfg, ini, device, dtype, toks, stats, sq, losses, probes, rec: GradRecorder, tick,
               coef=None, acc=None) -> None:  # fmt: skip
    """The streamed backward: no-grad forward keeping layer-boundary streams, then a
    walk down the layers rebuilding, recomputing and back-propagating one block at a
    time. Records block gradient norms as it goes (``rec``)."""
    L = cfg.n_layers
    if ini.definition.x0_mix is not None:
        raise ConfigError("stream", f"{ini.scheme} mixes x0 into every block: its streamed (layer-wise) "
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
