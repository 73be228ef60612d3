"""One layer of the stack: two literal residual sums, each calling the probe.

Each addition, attention then FFN, is one literal residual sum (nanoGPT's shape):

    s = a x + g Out(F(In(x)));   x <- Stream(s)

with the init scheme's stream multiplier a and branch multiplier g (1 and 1 for most
schemes; :class:`BlockMultipliers`), and In, Out, Stream each a norm or the identity as
the placement (``cfg.norm_position``, :mod:`tinit.model.placements`) says. The stack, its
placements' table and the probe's contract are in :mod:`tinit.model.transformer`; how a
block comes to exist (on the meta device, then materialised and initialised, or rebuilt
when streamed) in :mod:`tinit.model.build`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from .config import InitConfig, ModelConfig
from .draws import environment, evaluate, evaluate_optional, ffn_of
from .layers import Attention, GaussianBranch, make_ffn, make_norm
from .placements import SLOTS
from .schemes import Scheme


class Probe(Protocol):
    """Called at k = 0 (embedding: only ``stream_out``) and at every addition k >= 1."""

    def __call__(
        self,
        k: int,
        layer: int,
        sublayer: str,
        stream_in: torch.Tensor | None,
        branch: torch.Tensor | None,
        stream_out: torch.Tensor,
        normed: torch.Tensor | None = None,
    ) -> None: ...


@dataclass(frozen=True)
class BlockMultipliers:
    """A scheme's multipliers at one block: stream a and branch g (s = a x + g F), the x0
    mix (lambda, mu) or None, the attention logit scale, the q/k gain and the attention
    soft-cap (each None when the scheme has none)."""

    a: float
    g: float
    mix: tuple[float, float] | None = None
    attn_scale: float | None = None
    qk_gain: float | None = None
    attn_softcap: float | None = None


def block_multipliers(
    cfg: ModelConfig, scheme: Scheme, init: InitConfig | None, layer: int
) -> BlockMultipliers:
    """The scheme's multipliers at block ``layer``."""
    env = environment(cfg, init or InitConfig(), layer)
    what = f"{scheme.name} multipliers"
    mix = None
    if scheme.x0_mix is not None:
        mix = (evaluate(scheme.x0_mix[0], env, what), evaluate(scheme.x0_mix[1], env, what))
    return BlockMultipliers(
        a=evaluate(scheme.stream_mult, env, what),
        g=evaluate(scheme.branch_mult, env, what),
        mix=mix,
        attn_scale=evaluate_optional(scheme.attn_scale, env, what),
        qk_gain=evaluate_optional(scheme.qk_gain, env, what),
        attn_softcap=evaluate_optional(scheme.attn_softcap, env, what),
    )


def backout_of(cfg: ModelConfig, init: InitConfig) -> tuple[float, int] | None:
    """nanochat's backout: (beta, mid) with x <- x - beta x_mid before the final norm,
    x_mid the stream after block mid = L // 2 (nanochat/gpt.py GPT.forward); None when
    the scheme has none."""
    scheme = init.definition
    if scheme.backout is None:
        return None
    beta = evaluate(scheme.backout, environment(cfg, init, cfg.n_layers), f"{scheme.name} backout")
    return beta, cfg.n_layers // 2


def times(m: float | torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """m * t, skipping the multiply when m is the number 1 (the common case costs
    nothing). A learned gain (a tensor) always multiplies: comparing it with 1 would
    read it back from the device, and skipping it would cut its gradient."""
    return t if not isinstance(m, torch.Tensor) and m == 1.0 else m * t


class Block(nn.Module):
    """One layer: an attention addition and an FFN addition, their norms where the
    placement puts them (identities elsewhere)."""

    def __init__(self, cfg: ModelConfig, layer: int, seed: int = 0, device=None, dtype=None,
                 init: InitConfig | None = None):  # fmt: skip
        super().__init__()
        self.layer = layer
        init = init if init is not None else InitConfig()
        scheme = init.definition
        m = block_multipliers(cfg, scheme, init, layer)
        self.placement = cfg.placement
        self.a, self.mix = m.a, m.mix
        back = backout_of(cfg, init)
        # the last block carries the backout onto its final addition's identity path
        self.backout = back if back is not None and layer == cfg.n_layers - 1 else None
        # ReZero trains its gain: a parameter (role "gain"), valued by init_weights_
        learned = scheme.branch_learned
        self.gain = nn.Parameter(torch.empty((), device=device, dtype=dtype)) if learned else None
        self.g = m.g
        self._place_norms(cfg, device, dtype, scheme.norm_offset)
        qk_norm = scheme.qk_norm if cfg.qk_norm is None else cfg.qk_norm
        span = scheme.qk_norm_span if cfg.qk_norm_span is None else cfg.qk_norm_span
        if cfg.branch == "gaussian":
            self.attn = GaussianBranch(cfg.branch_var, seed, layer, "attn")
            self.ffn = GaussianBranch(cfg.branch_var, seed, layer, "ffn")
        else:
            off = scheme.norm_offset
            self.attn = Attention(cfg, device=device, dtype=dtype, scale=m.attn_scale, qk_norm=qk_norm,
                                  qk_gain=m.qk_gain, softcap=m.attn_softcap, norm_offset=off,
                                  subln=scheme.subln, qk_norm_span=span)  # fmt: skip
            kind, d_ff = ffn_of(cfg, scheme)
            self.ffn = make_ffn(cfg, device, dtype, kind, d_ff, subln=scheme.subln, norm_offset=off)

    def _place_norms(self, cfg: ModelConfig, device, dtype, offset: float) -> None:
        """The six slots attn_in, attn_out, attn_stream, ffn_in, ffn_out, ffn_stream: a
        norm where the placement has one, registered under its kept name (per sublayer,
        ``norm1`` then ``norm1o``; ``norm2``, ``norm2o``), else an identity. The slots are
        plain attributes, not submodules (``object.__setattr__`` skips nn.Module's
        registration), so each norm's parameters appear once, under that name."""
        names: dict[str, str] = {}
        for i, slot in enumerate(self.placement.slots):
            for n, sub in ((1, "attn"), (2, "ffn")):
                name = f"norm{n}" + ("", "o", "s")[i]
                self.add_module(name, make_norm(cfg, device, dtype, offset=offset))
                names[f"{sub}_{slot}"] = name
        identity = nn.Identity()
        for sub in ("attn", "ffn"):
            for slot in SLOTS:
                key = f"{sub}_{slot}"
                object.__setattr__(self, key, getattr(self, names[key]) if key in names else identity)
        self.norm_names = names  # slot -> the norm's name in the block (the audit's sites read it)

    def forward(
        self, x: torch.Tensor, rope=None, probe: Probe | None = None, x0: torch.Tensor | None = None,
        x_mid: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """The block's two residual sums. ``x0``: the embedding output (a scheme with an
        x0 mix); ``x_mid``: the stream after the middle block (a scheme with a backout,
        at the last block; None when the middle block is this one)."""
        a, g, k = self.a, (self.gain if self.gain is not None else self.g), 2 * self.layer + 1
        if self.mix is not None:
            if x0 is None:
                raise ValueError("this scheme mixes the embedding x0 into every block: pass x0")
            x = self.mix[0] * x + self.mix[1] * x0

        # attention: x <- Stream(a x + g Out(Attn(In(x))))
        f = self.attn_out(self.attn(self.attn_in(x), rope))
        s = times(a, x) + times(g, f)
        y = self.attn_stream(s)
        self._report(probe, k, "attn", x, f, s, y)
        x = y

        # FFN: x <- Stream(a x + g Out(FFN(In(x)))); the identity path x - beta x_mid at a backout
        x_id, c = self._backout_path(x, x_mid)
        f = times(c, self.ffn_out(self.ffn(self.ffn_in(x))))
        s = times(a, x_id) + times(g, f)
        y = self.ffn_stream(s)
        self._report(probe, k + 1, "ffn", x_id, f, s, y)
        return y

    def _backout_path(self, x: torch.Tensor, x_mid: torch.Tensor | None) -> tuple[torch.Tensor, float]:
        """The FFN addition's identity path and the scale of the whole addition: (x, 1),
        or at the last block of a scheme with a backout (x - beta x_mid, 1), or, when
        x_mid is this block's own output (L <= 2), ((1 - beta) x, 1 - beta)."""
        if self.backout is None:
            return x, 1.0
        beta = self.backout[0]
        if x_mid is not None:
            return x - beta * x_mid, 1.0
        return (1.0 - beta) * x, 1.0 - beta

    def _report(self, probe: Probe | None, k: int, sublayer: str, x, f, s, y) -> None:
        """The probe at addition k: stream in, branch (before g), the sum, and the
        normalised stream when a norm follows the sum."""
        if probe is None:
            return
        if self.placement.norm_stream:
            probe(k, self.layer, sublayer, x, f, s, normed=y)
        else:
            probe(k, self.layer, sublayer, x, f, s)
