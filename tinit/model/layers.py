"""The pieces of a block, pure torch: norms, RoPE, attention, FFNs, Gaussian branch.

Constructors allocate and never initialise (modules are built on the ``meta``
device and materialised with ``to_empty``); values come from
:func:`tinit.model.init.init_weights_`, the one place that sets weights.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import GATED_FFNS, ModelConfig
from .init import generator


class Linear(nn.Linear):
    """``nn.Linear`` that draws nothing on the meta device: its ``reset_parameters``
    (Kaiming-uniform weight, uniform bias) is skipped when the weight has no storage, as
    every block's is when built (its values come from ``init_weights_``); elsewhere it
    is nn.Linear's. Same parameters, names and forward."""

    def reset_parameters(self) -> None:
        if self.weight.device.type != "meta":
            super().reset_parameters()


def make_norm(
    cfg: ModelConfig, device=None, dtype=None, dim: int | None = None, offset: float = 0.0
) -> nn.Module:
    """RMSNorm ``x / sqrt(mean(x^2) + eps) * g`` (Zhang & Sennrich 2019) or LayerNorm
    ``(x - mean) / sqrt(var + eps) * g + b`` (Ba et al. 2016), eps from the config,
    over ``dim`` features (default d_model; QK-norm uses d_h). With ``offset`` the gain
    is applied as (offset + w) (Gemma's (1 + w), its w initialised to 0)."""
    dim = cfg.d_model if dim is None else dim
    if offset:
        return OffsetNorm(cfg.norm, dim, cfg.norm_eps, offset, device=device, dtype=dtype)
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(dim, eps=cfg.norm_eps, device=device, dtype=dtype)
    return nn.LayerNorm(dim, eps=cfg.norm_eps, device=device, dtype=dtype)


class OffsetNorm(nn.Module):
    """A norm whose gain is (offset + weight): Gemma's RMSNorm ``x_hat * (1 + w)``
    (HF transformers models/gemma2/modeling_gemma2.py Gemma2RMSNorm), or a LayerNorm
    likewise with its bias. The weight is what the init sets (0 for a gain of 1)."""

    def __init__(self, kind: str, dim: int, eps: float, offset: float, device=None, dtype=None):
        super().__init__()
        self.kind, self.dim, self.eps, self.offset = kind, dim, eps, offset
        self.weight = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))
        layer_norm = kind == "layernorm"
        self.bias = nn.Parameter(torch.empty(dim, device=device, dtype=dtype)) if layer_norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "rmsnorm":
            y = F.rms_norm(x, (self.dim,), eps=self.eps)
        else:
            y = F.layer_norm(x, (self.dim,), eps=self.eps)
        y = y * (self.offset + self.weight)
        return y if self.bias is None else y + self.bias


def rope_cache(
    seq_len: int, head_dim: int, base: float, device=None, dtype=torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of rotary embeddings (Su et al. 2021), shape (seq, head_dim/2)."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float64), inv_freq)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., :h/2], x[..., h/2:]) of x (batch, heads, seq, h) by the
    position's angles. A rotation: it preserves every vector's norm."""
    x1, x2 = x.chunk(2, dim=-1)
    t = x.shape[-2]
    c, s = cos[:t], sin[:t]
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)


def attend(q, k, v, causal: bool, scale: float, softcap: float | None = None) -> torch.Tensor:
    """softmax(q k^T scale) v; with ``softcap`` c the logits become c tanh(z / c) first
    (Gemma 2's attn_logit_softcapping, which SDPA cannot do: written out)."""
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    z = torch.matmul(q, k.transpose(-2, -1)) * scale
    z = softcap * torch.tanh(z / softcap)
    if causal:
        t, s = z.shape[-2], z.shape[-1]
        mask = torch.ones(t, s, dtype=torch.bool, device=z.device).triu(s - t + 1)
        z = z.masked_fill(mask, float("-inf"))
    return torch.matmul(torch.softmax(z, dim=-1), v)


class Attention(nn.Module):
    """Multi-head self-attention: softmax(q k^T / sqrt(d_h)) v, then W_O.

    The 1/sqrt(d_h) scale keeps the logits at order one: a dot product of two
    d_h-dimensional unit-variance vectors has variance d_h. ``scale`` overrides it
    (muP's 1/d_h, Gemma's query_pre_attn_scalar^-1/2). With ``cfg.n_kv_heads`` < heads,
    K and V have that many heads, each shared by heads / kv_heads query heads
    (grouped-query attention, Ainslie et al. 2023). ``qk_norm`` normalises every head's
    q and k over d_h before RoPE (a rotation: the order does not matter), or with
    ``qk_norm_span="full"`` the whole q (d wide) and k (kv_heads d_h wide) before they are
    split into heads (OLMo-core's Attention unless use_head_qk_norm, as OLMo 2 runs it); then
    ``qk_gain`` multiplies both (nanochat's 1.2); ``softcap`` caps the logits (Gemma 2);
    ``subln`` puts a norm before W_O (torchscale's inner_attn_ln).
    """

    def __init__(self, cfg: ModelConfig, device=None, dtype=None, scale: float | None = None,
                 qk_norm: bool = False, qk_gain: float | None = None, softcap: float | None = None,
                 norm_offset: float = 0.0, subln: bool = False, qk_norm_span: str = "head"):  # fmt: skip
        super().__init__()
        d, kv = cfg.d_model, cfg.kv_heads * cfg.head_dim
        kw = {"bias": cfg.bias, "device": device, "dtype": dtype}
        self.q = Linear(d, d, **kw)
        self.k = Linear(d, kv, **kw)
        self.v = Linear(d, kv, **kw)
        self.o = Linear(d, d, **kw)  # writes the stream: depth-scaled
        self.n_heads, self.kv_heads = cfg.n_heads, cfg.kv_heads
        self.head_dim = cfg.head_dim
        self.causal = cfg.attention == "causal"
        self.scale = scale if scale is not None else 1.0 / math.sqrt(cfg.head_dim) if cfg.attn_scale else 1.0
        self.qk_gain, self.softcap = qk_gain, softcap
        self.qk_full = qk_norm_span == "full"
        q_dim, k_dim = (d, kv) if self.qk_full else (cfg.head_dim, cfg.head_dim)
        self.norm_q = make_norm(cfg, device, dtype, q_dim, norm_offset) if qk_norm else None
        self.norm_k = make_norm(cfg, device, dtype, k_dim, norm_offset) if qk_norm else None
        self.norm_o = make_norm(cfg, device, dtype, d, norm_offset) if subln else None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        b, t, d = x.shape
        q, k = self.q(x), self.k(x)
        if self.qk_full and self.norm_q is not None:
            q, k = self.norm_q(q), self.norm_k(k)  # across the full width, before the heads
        q = q.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.kv_heads != self.n_heads:
            group = self.n_heads // self.kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        if self.norm_q is not None and not self.qk_full:
            q, k = self.norm_q(q), self.norm_k(k)
        if self.qk_gain is not None:
            q, k = q * self.qk_gain, k * self.qk_gain
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        y = attend(q, k, v, self.causal, self.scale, self.softcap).transpose(1, 2).reshape(b, t, d)
        return self.o(y if self.norm_o is None else self.norm_o(y))


#: The hidden activation of each FFN kind (gated ones: applied to the gate).
ACTIVATIONS = {
    "swiglu": F.silu,  # Shazeer 2020
    "geglu": lambda x: F.gelu(x, approximate="tanh"),  # Gemma's gelu_pytorch_tanh
    "gelu": F.gelu,  # Vaswani et al. 2017, with GELU
    "relu2": lambda x: F.relu(x).square(),  # nanochat's MLP
    "relu": F.relu,  # Vaswani et al. 2017 (microsoft/mup's example, ReZero, fairseq)
}


class GatedFFN(nn.Module):
    """Gated FFN: W_down (act(W_gate x) * (W_up x)), act silu (SwiGLU, Shazeer 2020) or
    gelu-tanh (GeGLU, Gemma). With ``subln`` a norm over d_ff before W_down."""

    def __init__(self, cfg: ModelConfig, kind: str = "swiglu", d_ff: int | None = None, device=None,
                 dtype=None, subln: bool = False, norm_offset: float = 0.0):  # fmt: skip
        super().__init__()
        d_ff = cfg.d_ff if d_ff is None else d_ff
        kw = {"bias": cfg.bias, "device": device, "dtype": dtype}
        self.act = ACTIVATIONS[kind]
        self.gate = Linear(cfg.d_model, d_ff, **kw)
        self.up = Linear(cfg.d_model, d_ff, **kw)
        self.down = Linear(d_ff, cfg.d_model, **kw)  # writes the stream: depth-scaled
        self.norm_ff = make_norm(cfg, device, dtype, d_ff, norm_offset) if subln else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.gate(x)) * self.up(x)
        return self.down(h if self.norm_ff is None else self.norm_ff(h))


class PlainFFN(nn.Module):
    """Two-matrix FFN: W_2 act(W_1 x), act GELU (Vaswani et al. 2017), relu^2
    (nanochat) or ReLU (mup's example); W_1 has role up. With ``subln`` a norm over d_ff before W_2."""

    def __init__(self, cfg: ModelConfig, kind: str = "gelu", d_ff: int | None = None, device=None,
                 dtype=None, subln: bool = False, norm_offset: float = 0.0):  # fmt: skip
        super().__init__()
        d_ff = cfg.d_ff if d_ff is None else d_ff
        kw = {"bias": cfg.bias, "device": device, "dtype": dtype}
        self.act = ACTIVATIONS[kind]
        self.up = Linear(cfg.d_model, d_ff, **kw)
        self.down = Linear(d_ff, cfg.d_model, **kw)  # writes the stream: depth-scaled
        self.norm_ff = make_norm(cfg, device, dtype, d_ff, norm_offset) if subln else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.up(x))
        return self.down(h if self.norm_ff is None else self.norm_ff(h))


class GaussianBranch(nn.Module):
    """The Gaussian-branch model (the law's exact case) of a branch: an independent N(0, var) draw of the
    input's shape, ignoring the input. Drawn per (seed, layer, sublayer), so a
    rebuilt branch draws the same numbers."""

    def __init__(self, var: float, seed: int, layer: int, sublayer: str):
        super().__init__()
        self.std = math.sqrt(var)
        self.key = (seed, layer, f"branch/{sublayer}")

    def forward(self, x: torch.Tensor, rope=None) -> torch.Tensor:
        """An independent draw of ``x``'s shape; ``rope`` (the attention branch's call) is unused."""
        seed, layer, key = self.key
        gen = generator(seed, layer, key, x.device)
        return torch.randn(x.shape, generator=gen, device=x.device, dtype=x.dtype) * self.std


def make_ffn(cfg: ModelConfig, device=None, dtype=None, kind: str | None = None, d_ff: int | None = None,
             subln: bool = False, norm_offset: float = 0.0) -> nn.Module:  # fmt: skip
    """The FFN of kind ``kind`` (default ``cfg.ffn``) and width ``d_ff`` (default ``cfg.d_ff``)."""
    kind = cfg.ffn if kind is None else kind
    cls = GatedFFN if kind in GATED_FFNS else PlainFFN
    return cls(cfg, kind, d_ff, device=device, dtype=dtype, subln=subln, norm_offset=norm_offset)
