"""The large-width recursion through every addition of tinit's stack, from the init alone.

:func:`predict` walks the blocks as :mod:`tinit.model.block` runs them, on the token
Gram matrices K (:mod:`tinit.mf.kernels`) instead of the tokens: the embedding's Gram
from the batch's token ids, then at each addition ``s = a x + g Out(F(In(x)))`` and
``x <- Stream(s)`` the norms, the linear maps, the attention average
(:mod:`tinit.mf.attention`) and the FFN's activation kernel, with the stream and the
branch independent at large width (the branch's last matrix is drawn independently of
the stream), so K_s = a^2 K_x + g^2 K_F. Every std is the one the model draws: the
scheme's resolution (:func:`tinit.model.init.role_rule`, the draws' own std, truncation
included) at the layer and shape of each role; every multiplier, scale, gain and soft-cap
the block's (:func:`tinit.model.block.block_multipliers`); the FFN the scheme builds
(:func:`tinit.model.schemes.ffn_of`). Nothing is built and nothing depends on d beyond
the fan-ins: the cost is that of T x T matrices, per sequence.

What the recursion takes as exact at large width: the embedding rows of distinct tokens
are orthogonal (K_0 = sigma_emb^2 [t_i = t_j], + sigma_pos^2 [i = j] for learned
positions), every token's mean square is its diagonal entry (the norms), coordinates are
Gaussian across the width (the activations, the logits), and W_Q, W_K, W_V, W_O are
independent of the stream and of each other. A bias drawn at random (torchscale's,
ReZero's nn.Linear biases) enters as its mean square on every entry, and is taken
Gaussian inside an activation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
import torch

from ..model.block import backout_of, block_multipliers
from ..model.config import GATED_FFNS, InitConfig, ModelConfig, RunConfig
from ..model.draws import environment, evaluate, ffn_of
from ..model.init import generator, role_rule
from ..model.layers import rope_cache
from ..model.schemes import bias_role
from . import kernels as kn
from .attention import CHUNK_BYTES, MAX_COMPONENTS, attention_gram, draw_bytes, factor, scaled

#: Heads drawn per sequence at each attention addition (the Monte Carlo of
#: :func:`tinit.mf.attention.attention_gram`), unless the caller says: RunConfig's default.
DEFAULT_DRAWS: int = RunConfig().mf_draws
#: The columns of :func:`predict`'s frame.
MF_COLUMNS = ("mf_stream_var", "mf_branch_var", "mf_cos_sim")


@dataclass
class Prediction:
    """One configuration's prediction: a row per addition k = 0..2L (``frame``: k, layer,
    sublayer and :data:`MF_COLUMNS`), the Monte Carlo draws per sequence, and the largest
    truncation error of an FFN kernel's series (relative; 0 for the closed forms)."""

    frame: pd.DataFrame
    draws: int
    kernel_error: float = 0.0
    notes: list[str] = field(default_factory=list)


class _Stream:
    """The stream's Gram and, when the scheme needs them, its cross Grams with the
    embedding output x0 (an x0 mix) and with the middle block's output (a backout)."""

    def __init__(self, K0: torch.Tensor, track: bool):
        self.K, self.K0, self.track = K0, K0, track
        self.C0 = K0 if track else None  # C(x, x0)_ij = x_i . x0_j / d
        self.Cmid = self.Kmid = self.C0mid = None  # C(x, x_mid), K(x_mid), C(x0, x_mid)

    def scale(self, a: float) -> None:
        """x <- a x (on the cross Grams; the Gram itself is set by the caller)."""
        if self.track:
            self.C0 = a * self.C0
            self.Cmid = None if self.Cmid is None else a * self.Cmid

    def rescale(self, f: torch.Tensor) -> None:
        """x_i <- f_i x_i (a norm on the stream), on the cross Grams."""
        if self.track:
            self.C0 = f.unsqueeze(-1) * self.C0
            self.Cmid = None if self.Cmid is None else f.unsqueeze(-1) * self.Cmid

    def mix(self, lam: float, mu: float) -> None:
        """x <- lam x + mu x0 (nanochat's x0 mix before a block)."""
        C0 = self.C0
        self.K = lam * lam * self.K + mu * mu * self.K0 + lam * mu * (C0 + C0.transpose(-2, -1))
        if self.Cmid is not None:
            self.Cmid = lam * self.Cmid + mu * self.C0mid
        self.C0 = lam * C0 + mu * self.K0

    def capture(self) -> None:
        """x_mid <- x (the stream after the middle block)."""
        self.Kmid, self.Cmid = self.K, self.K
        self.C0mid = self.C0.transpose(-2, -1)

    def backout(self, beta: float) -> torch.Tensor:
        """The Gram of x - beta x_mid."""
        C = self.Cmid
        return self.K - beta * (C + C.transpose(-2, -1)) + beta * beta * self.Kmid


class _Roles:
    """The std, fan-in and bias of each role at one layer, as the model draws them."""

    def __init__(self, cfg: ModelConfig, init: InitConfig, layer: int):
        self.cfg, self.init, self.layer = cfg, init, layer
        scheme = init.definition
        gain = role_rule(init, cfg, "norm", layer)
        self.norm_gain2 = (scheme.norm_offset + gain.std) ** 2
        self.norm_bias2 = role_rule(init, cfg, "bias", layer).std ** 2 if cfg.norm == "layernorm" else 0.0

    def weight(self, role: str, fan_in: int) -> float:
        """s^2 n of the role's weight: its draws' variance times its fan-in."""
        return role_rule(self.init, self.cfg, role, self.layer).std_drawn ** 2 * fan_in

    def bias(self, owner: str) -> float:
        """The mean square of the bias of the linear layer of role ``owner`` (0 without
        ``--bias``): the scheme's bias constant, or nn.Linear's random bias where the
        scheme's upstream keeps it (drawn by the weight's rule at the weight's shape)."""
        if not self.cfg.bias:
            return 0.0
        scheme = self.init.definition
        if bias_role(scheme, owner) != "bias":
            draw = role_rule(self.init, self.cfg, owner, self.layer, rule=scheme.bias_rule)
        else:
            draw = role_rule(self.init, self.cfg, "bias", self.layer)
        return draw.std**2 if draw.dist == "const" else draw.std_drawn**2

    def linear(self, K: torch.Tensor, role: str, fan_in: int) -> torch.Tensor:
        return kn.linear(K, self.weight(role, fan_in), self.bias(role))

    def norm(self, K: torch.Tensor, width: int, mean: torch.Tensor | None = None) -> torch.Tensor:
        cfg = self.cfg
        return kn.norm(K, cfg.norm, cfg.norm_eps, self.norm_gain2, width, self.norm_bias2, mean)

    def norm_factor(self, F: torch.Tensor, width: int) -> torch.Tensor:
        """A factor of the normed Gram from a factor F of the Gram: each token's row times
        its norm's factor (a LayerNorm bias as one more column)."""
        cfg = self.cfg
        diag = F.square().sum(-1)
        f = kn.norm_factor(diag, cfg.norm, cfg.norm_eps, math.sqrt(self.norm_gain2), width)
        return scaled(F * f.unsqueeze(-1), 1.0, self.norm_bias2)


def memory_bytes(batch: int, seq_len: int, head_dim: int, draws: int) -> int:
    """A bound on the bytes :func:`predict` holds at once for ``batch`` sequences of
    ``seq_len`` tokens: 16 float64 T x T Grams per sequence (the stream's, the branch's,
    their norms', the activation kernel's, the cross Grams of an x0 mix), the FFN
    kernel's per-token coefficients, the attention's factors and one chunk of its draws
    (at least one head per sequence). Nothing of it depends on d or L."""
    from .kernels import HERMITE_NODES, MEHLER_TERMS

    T, B = seq_len, batch
    grams = 16 * B * T * T * 8
    coeffs = 3 * B * T * (HERMITE_NODES + MEHLER_TERMS) * 8
    factors = 3 * B * T * (T + 1) * 12
    per_draw = draw_bytes(T, min(head_dim, MAX_COMPONENTS))
    chunk = max(B * per_draw, min(draws * B * per_draw, CHUNK_BYTES))
    return grams + coeffs + factors + chunk


def embedding_gram(cfg: ModelConfig, init: InitConfig, tokens: torch.Tensor) -> torch.Tensor:
    """K_0 of the embedding output for ``tokens`` (batch, T) at large width: the rows of
    distinct tokens orthogonal, sigma_emb^2 [t_i = t_j] times the scheme's embedding
    multiplier squared, plus sigma_pos^2 on the diagonal for learned positions, then
    RMS-normalised where the scheme normalises the embedding (nanochat)."""
    scheme = init.definition
    env = environment(cfg, init, -1)
    mult = evaluate(scheme.embed_mult, env, f"{scheme.name} embedding multiplier")
    e = role_rule(init, cfg, "embed", -1).std_drawn
    same = (tokens.unsqueeze(-1) == tokens.unsqueeze(-2)).to(torch.float64)
    K = same * (mult * e) ** 2
    if cfg.positions == "learned":
        p = role_rule(init, cfg, "pos", -1).std_drawn
        K = K + torch.eye(tokens.shape[-1], dtype=torch.float64) * p**2
    if scheme.embed_norm:
        K = kn.norm(K, "rmsnorm", cfg.norm_eps, 1.0, cfg.d_model)
    return K


def _attention(cfg: ModelConfig, init: InitConfig, roles: _Roles, K: torch.Tensor, m, draws: int,
               rope, seed: int) -> torch.Tensor:  # fmt: skip
    """The Gram of the attention branch's output W_O u for an input of Gram K. One
    factor of K serves q, k and v: each is a multiple of it (plus a column for a bias)."""
    scheme, d, dh = init.definition, cfg.d_model, cfg.head_dim
    if roles.weight("o", d) == 0 and roles.bias("o") == 0:
        return torch.zeros_like(K)
    FK = factor(K)
    Fq, Fk, Fv = (scaled(FK, roles.weight(r, d), roles.bias(r)) for r in ("q", "k", "v"))
    if scheme.qk_norm if cfg.qk_norm is None else cfg.qk_norm:
        full = (scheme.qk_norm_span if cfg.qk_norm_span is None else cfg.qk_norm_span) == "full"
        Fq = roles.norm_factor(Fq, d if full else dh)
        Fk = roles.norm_factor(Fk, cfg.kv_heads * dh if full else dh)
    if m.qk_gain is not None:
        Fq, Fk = Fq * m.qk_gain, Fk * m.qk_gain
    scale = m.attn_scale if m.attn_scale is not None else 1.0 / math.sqrt(dh) if cfg.attn_scale else 1.0
    gen = generator(seed, roles.layer, "mf/attn", "cpu")
    U = attention_gram(Fq, Fk, Fv, dh, scale, cfg.attention == "causal", rope, m.attn_softcap, draws, gen)
    if scheme.subln:
        U = roles.norm(U, d)
    return roles.linear(U, "o", d)


def _ffn(cfg: ModelConfig, init: InitConfig, roles: _Roles, K: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The Gram of the FFN branch's output for an input of Gram K, and its kernel's
    truncation error."""
    scheme, d = init.definition, cfg.d_model
    kind, d_ff = ffn_of(cfg, scheme)
    if roles.weight("down", d_ff) == 0 and roles.bias("down") == 0:
        return torch.zeros_like(K), 0.0
    mean = None  # the hidden features' mean per token (a gated FFN's: 0, its up is zero-mean)
    if kind in GATED_FFNS:
        H, err = kn.act_kernel(roles.linear(K, "gate", d), kind)
        H = H * roles.linear(K, "up", d)
    else:
        pre = roles.linear(K, "up", d)
        H, err = kn.act_kernel(pre, kind)
        mean = kn.activation_mean(pre, kind)
    if scheme.subln:  # a norm over the hidden features (a LayerNorm removes their mean)
        H = roles.norm(H, d_ff, mean)
    return roles.linear(H, "down", d_ff), err


def predict(
    cfg: ModelConfig, init: InitConfig, tokens: torch.Tensor, draws: int = DEFAULT_DRAWS,
    on_layer: Callable[[int], None] | None = None,
) -> Prediction:  # fmt: skip
    """The large-width prediction at every addition of the stack ``cfg`` under ``init``
    for the token ids ``tokens`` (batch, T): per k = 0..2L the stream's pooled variance
    (the sum, before a post-norm's norm), the branch's (before g, as the probe sees it:
    after the branch's own norm), and the tokens' mean pairwise cosine of the stream
    leaving the addition (post-norm: after the norm). ``draws``: heads drawn per sequence
    at each attention (Monte Carlo, seeded by the init's seed and the layer).
    ``on_layer(layer)`` is called after each block."""
    tokens = torch.as_tensor(tokens).cpu()
    scheme, place, L = init.definition, cfg.placement, cfg.n_layers
    T = tokens.shape[-1]
    back = backout_of(cfg, init)
    st = _Stream(embedding_gram(cfg, init, tokens), track=scheme.x0_mix is not None or back is not None)
    rope = None
    if cfg.positions == "rope" and cfg.branch == "model":
        rope = rope_cache(T, cfg.head_dim, cfg.rope_base, dtype=torch.float64)
    rows = [(0, -1, "embed", float(kn.mean_diag(st.K)), math.nan, float(kn.cosine(st.K)))]
    worst = 0.0
    eye = torch.eye(T, dtype=torch.float64)
    for layer in range(L):
        m = block_multipliers(cfg, scheme, init, layer)
        roles = _Roles(cfg, init, layer)
        if m.mix is not None:
            st.mix(*m.mix)
        for j, sub in enumerate(("attn", "ffn")):
            k = 2 * layer + 1 + j
            x_in = st.K
            c = 1.0
            if sub == "ffn" and back is not None and layer == L - 1:
                if back[1] < L - 1:
                    x_in = st.backout(back[0])
                else:  # the middle block is this one: (1 - beta) x, the branch scaled alike
                    c = 1.0 - back[0]
                    x_in = c * c * st.K
            y = roles.norm(st.K, cfg.d_model) if place.norm_in else st.K
            if cfg.branch == "gaussian":
                F = eye * cfg.branch_var
            elif sub == "attn":
                F = _attention(cfg, init, roles, y, m, draws, rope, init.seed)
            else:
                F, err = _ffn(cfg, init, roles, y)
                worst = max(worst, err)
            if place.norm_out:  # (Gaussian branches too: the block normalises their noise)
                F = roles.norm(F, cfg.d_model)
            F = c * c * F
            s = m.a * m.a * x_in + m.g * m.g * F
            if c != 1.0:
                st.scale(c)
            st.scale(m.a)  # (after a backout, the last addition, no cross Gram is read again)
            if place.norm_stream:
                diag = torch.diagonal(s, dim1=-2, dim2=-1)
                f = kn.norm_factor(diag, cfg.norm, cfg.norm_eps, math.sqrt(roles.norm_gain2), cfg.d_model)
                st.K = roles.norm(s, cfg.d_model)
                st.rescale(f)
            else:
                st.K = s
            values = (kn.mean_diag(s), kn.mean_diag(F), kn.cosine(st.K))
            rows.append((k, layer, sub, *(float(v) for v in values)))
        if back is not None and layer == back[1]:
            st.capture()
        if on_layer is not None:
            on_layer(layer)
    frame = pd.DataFrame(rows, columns=["k", "layer", "sublayer", *MF_COLUMNS])
    return Prediction(frame, draws, worst)
