"""The stream and the gradients of a model tinit did not build, through hooks: the
forward pass turned into tinit's 2L additions (:class:`StreamHooks`, the same
:class:`~tinit.experiments.measure.probes.VarianceProbe` as ``tinit variance``, each
addition checked against the block's own output), and one backward of the mean
next-token cross-entropy (every parameter's gradient norm, the stream gradient at
every addition). What the model's own code raises becomes a :class:`ModelError`.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from ...model.config import ConfigError
from ...model.roles import AUDIT_MATRIX_ROLES
from ..measure.probes import VarianceProbe
from ..result import is_run_failure
from .roles import ParamRole
from .sites import Sites, block_input, first_tensor


class StreamHooks:
    """Hooks that turn a model's forward pass into tinit's 2L additions.

    The block's forward-pre-hook gives the stream entering it; the branch (or its
    ``added`` module) output is the branch; stream_out = stream_in + branch, or, with a
    ``stream`` norm (post-norm), that norm's output. Each addition is passed to
    ``probe`` as ``Block._add`` would; with ``grads`` each stream tensor's gradient is
    summed (squared) per addition k into ``sq``. ``max_rel_err`` collects, per block,
    ||reconstructed - block output|| / ||block output||.
    """

    def __init__(self, model: nn.Module, sites: Sites, probe=None, grads: bool = False):
        self.model, self.sites, self.probe, self.grads = model, sites, probe, grads
        L = sites.n_layers
        self.sq = [None] * (2 * L + 1)
        self.max_rel_err = [math.nan] * L
        self._handles = []
        self._cur = None
        self.width = 0
        self._pending: dict[int, tuple] = {}
        # |r_k|^2, |w_k|^2, <w_k, r_k> per addition (backward.branch_paths' layout): in a plain
        # sum x_k = x_{k-1} + F_k the gradient of F_k is w_k, that of F_{k-1} (or of the
        # embedding, k = 1) is u_{k-1}, and the branch part is r_k = u_{k-1} - w_k
        self.paths = np.full((3, 2 * L + 1), np.nan)
        self._above: tuple[int, torch.Tensor] | None = None

    def _tap(self, k: int, t: torch.Tensor) -> None:
        if self.grads and t.requires_grad:

            def acc(g, k=k):
                g = g.detach().to(torch.float64 if g.dtype == torch.float64 else torch.float32)
                s = g.square().sum()
                self.sq[k] = s if self.sq[k] is None else self.sq[k] + s
                if self._above is not None and self._above[0] == k + 1:  # backward runs k = 2L .. 0
                    w = self._above[1]
                    r = g - w
                    sums = (r.square().sum(), w.square().sum(), (w * r).sum())
                    self.paths[:, k + 1] = [float(x) for x in sums]
                self._above = (k, g)

            t.register_hook(acc)

    def _record(self, k, layer, sub, stream_in, branch, s, normed=None) -> None:
        if self.probe is not None:
            with torch.no_grad():
                self.probe(k, layer, sub, stream_in, branch, s, normed)
        self._tap(k, branch if normed is None else normed)
        self._cur = s if normed is None else normed

    def __enter__(self):
        get = self.model.get_submodule
        for b in self.sites.blocks:
            i = b.layer
            self._handles.append(get(b.block).register_forward_pre_hook(self._pre(i), with_kwargs=True))
            self._handles.append(get(b.block).register_forward_hook(self._post(i)))
            for sub, k, branch, added, stream in (
                ("attn", 2 * i + 1, b.attn, b.attn_added, b.attn_stream),
                ("ffn", 2 * i + 2, b.ffn, b.ffn_added, b.ffn_stream),
            ):
                self._handles.append(
                    get(added or branch).register_forward_hook(self._branch(i, sub, k, stream))
                )
                if stream:
                    self._handles.append(get(stream).register_forward_hook(self._stream(i, sub, k)))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _pre(self, i):
        def fn(_m, args, kwargs):
            x = block_input(args, kwargs)
            self._cur = x
            self.width = int(x.shape[-1])
            if i == 0:
                if self.probe is not None:
                    with torch.no_grad():
                        self.probe(0, -1, "embed", None, None, x)
                self._tap(0, x)

        return fn

    def _branch(self, i, sub, k, stream):
        def fn(_m, _args, output):
            f = first_tensor(output)
            stream_in = self._cur
            s = stream_in + f
            if stream:  # post-norm: wait for the norm's output
                self._pending[k] = (stream_in, f, s)
            else:
                self._record(k, i, sub, stream_in, f, s)

        return fn

    def _stream(self, i, sub, k):
        def fn(_m, _args, output):
            if k in self._pending:
                stream_in, f, s = self._pending.pop(k)
                self._record(k, i, sub, stream_in, f, s, normed=first_tensor(output))

        return fn

    def _post(self, i):
        def fn(_m, _args, output):
            y = first_tensor(output)
            if y is None or self._cur is None or y.shape != self._cur.shape:
                return
            with torch.no_grad():
                d = torch.linalg.vector_norm((self._cur - y).to(torch.float64))
                self.max_rel_err[i] = float(
                    d / torch.linalg.vector_norm(y.to(torch.float64)).clamp_min(1e-300)
                )

        return fn


class ModelError(ConfigError):
    """The audited model cannot be measured: its forward or backward fails (or calls
    sys.exit), or it returns no logits of shape (batch, seq, > every token id). Bad
    input (the CLI names --hf or --module), not a failed run."""

    def __init__(self, message: str):
        super().__init__("model", message)


def _user_code(what: str, fn):
    """``fn()``, with whatever the model's own code raises as a :class:`ModelError`
    (out of memory and interrupts stay run failures)."""
    try:
        return fn()
    except ConfigError:
        raise
    except (Exception, SystemExit) as exc:
        if isinstance(exc, Exception) and is_run_failure(exc):
            raise
        from .loaders import one_line

        raise ModelError(f"{what} failed: {one_line(exc)}") from None


def checked_logits(output, tokens: torch.Tensor) -> torch.Tensor:
    """The logits of ``output`` (see :func:`logits_of`), which must be (batch, seq, V)
    with V above every token id; a :class:`ModelError` otherwise."""
    try:
        logits = logits_of(output)
    except TypeError as exc:
        raise ModelError(f"forward(tokens) returned no logits: {exc}") from None
    b, t = tokens.shape
    if logits.dim() != 3 or tuple(logits.shape[:2]) != (b, t) or logits.shape[2] <= int(tokens.max()):
        raise ModelError(f"forward(tokens) of shape ({b}, {t}) returned logits of shape "
                         f"{tuple(logits.shape)}; expected ({b}, {t}, vocab) with vocab > "
                         f"{int(tokens.max())}")  # fmt: skip
    return logits


def logits_of(output) -> torch.Tensor:
    """Logits from what a model returns: a tensor, an object with ``.logits``, a tuple."""
    if isinstance(output, torch.Tensor):
        return output
    if getattr(output, "logits", None) is not None:
        return output.logits
    if isinstance(output, tuple | list) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"cannot find logits in the model's output ({type(output).__name__})")


def stats_dtype(model: nn.Module) -> torch.dtype:
    p = next(model.parameters(), None)
    return torch.float64 if p is not None and p.dtype == torch.float64 else torch.float32


def measure_stream(model: nn.Module, sites: Sites, tokens: torch.Tensor, forward=None,
                   stats: torch.dtype | None = None) -> tuple[pd.DataFrame, list[float]]:  # fmt: skip
    """The probe's rows for one forward pass (no gradients), and the stream check.
    The logits are not used: a model that can (transformers' ``logits_to_keep``)
    computes them for the last position only (the head of a 32000-token vocabulary was
    a third of this pass). ``forward``: run the tokens through this instead (a causal
    LM's base model: no head at all); ``stats``: the probe's dtype (default: from the
    model's parameters)."""
    probe = VarianceProbe(stats or stats_dtype(model))
    with StreamHooks(model, sites, probe) as hooks, torch.no_grad():
        if forward is not None:
            _user_code(f"the model's forward at batch {tokens.shape[0]} x seq {tokens.shape[1]}",
                       lambda: forward(tokens))  # fmt: skip
            return probe.frame(), hooks.max_rel_err
        keep = _last_logits_only(model)
        out = _user_code(f"the model's forward at batch {tokens.shape[0]} x seq {tokens.shape[1]}",
                         lambda: model(tokens, **keep))  # fmt: skip
        if not keep:  # (transformers' models, asked for the last position only, are checked elsewhere)
            checked_logits(out, tokens)
    return probe.frame(), hooks.max_rel_err


def _last_logits_only(model: nn.Module) -> dict:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    return {"logits_to_keep": 1} if "logits_to_keep" in params else {}


def check_tolerance(model: nn.Module) -> float:
    """How closely stream_in + branch must match a block's output: summation order
    differs at most by rounding (bf16 has an 8-bit mantissa)."""
    p = next(model.parameters())
    return {torch.float64: 1e-9, torch.float32: 1e-4}.get(p.dtype, 3e-2)


def measure_grads(model: nn.Module, sites: Sites, tokens: torch.Tensor, roles: list[ParamRole]):
    """Gradient norms of every parameter, the summed squared stream gradient per
    addition, and the loss, for one batch (mean next-token cross-entropy)."""
    stats = stats_dtype(model)
    model.zero_grad(set_to_none=True)
    with StreamHooks(model, sites, grads=True) as hooks:
        out = _user_code("the model's forward (with gradients)", lambda: model(tokens))
        logits = checked_logits(out, tokens)[:, :-1].to(stats)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        _user_code("the model's backward", loss.backward)
    params = dict(model.named_parameters())
    rows = []
    for r in roles:
        p = params[r.name]
        g = 0.0 if p.grad is None else float(torch.linalg.vector_norm(p.grad, dtype=stats))
        owner, _, leaf = r.name.rpartition(".")
        matrix = leaf == "weight" and r.role in AUDIT_MATRIX_ROLES
        tensor = r.role if matrix else f"{owner.rpartition('.')[2]}.{leaf}"
        rows.append({"layer": r.layer, "tensor": tensor, "param": r.name, "role": r.role, "grad_norm": g,
                     "param_norm": float(torch.linalg.vector_norm(p.detach(), dtype=stats))})  # fmt: skip
    sq = np.array([math.nan if s is None else float(s) for s in hooks.sq])
    model.zero_grad(set_to_none=True)
    return pd.DataFrame(rows), sq, float(loss.detach()), hooks.width, hooks.paths if sites.plain_sum else None
