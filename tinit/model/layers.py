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

from .config import ModelConfig
from .init import generator


def make_norm(cfg: ModelConfig, device=None, dtype=None, dim: int | None = None) -> nn.Module:
    """RMSNorm ``x / sqrt(mean(x^2) + eps) * g`` (Zhang & Sennrich 2019) or LayerNorm
    ``(x - mean) / sqrt(var + eps) * g + b`` (Ba et al. 2016), eps from the config,
    over ``dim`` features (default d_model; QK-norm uses d_h)."""
    dim = cfg.d_model if dim is None else dim
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(dim, eps=cfg.norm_eps, device=device, dtype=dtype)
    return nn.LayerNorm(dim, eps=cfg.norm_eps, device=device, dtype=dtype)


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


class Attention(nn.Module):
    """Multi-head self-attention: softmax(q k^T / sqrt(d_h)) v, then W_O.

    The 1/sqrt(d_h) scale keeps the logits at order one: a dot product of two
    d_h-dimensional unit-variance vectors has variance d_h. ``scale`` overrides it
    (muP's 1/d_h). With ``cfg.n_kv_heads`` < heads, K and V have that many heads, each
    shared by heads / kv_heads query heads (grouped-query attention, Ainslie et al.
    2023). ``qk_norm`` normalises every head's q and k over d_h before RoPE.
    """

    def __init__(self, cfg: ModelConfig, device=None, dtype=None, scale: float | None = None,
                 qk_norm: bool = False):  # fmt: skip
        super().__init__()
        d, kv = cfg.d_model, cfg.kv_heads * cfg.head_dim
        kw = {"bias": cfg.bias, "device": device, "dtype": dtype}
        self.q = nn.Linear(d, d, **kw)
        self.k = nn.Linear(d, kv, **kw)
        self.v = nn.Linear(d, kv, **kw)
        self.o = nn.Linear(d, d, **kw)  # writes the stream: depth-scaled
        self.n_heads, self.kv_heads = cfg.n_heads, cfg.kv_heads
        self.head_dim = cfg.head_dim
        self.causal = cfg.attention == "causal"
        self.scale = scale if scale is not None else 1.0 / math.sqrt(cfg.head_dim) if cfg.attn_scale else 1.0
        self.norm_q = make_norm(cfg, device, dtype, cfg.head_dim) if qk_norm else None
        self.norm_k = make_norm(cfg, device, dtype, cfg.head_dim) if qk_norm else None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        b, t, d = x.shape
        q = self.q(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.kv_heads != self.n_heads:
            group = self.n_heads // self.kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        if self.norm_q is not None:
            q, k = self.norm_q(q), self.norm_k(k)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, scale=self.scale)
        return self.o(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    """Gated FFN (Shazeer 2020): W_down (silu(W_gate x) * (W_up x))."""

    def __init__(self, cfg: ModelConfig, device=None, dtype=None):
        super().__init__()
        kw = {"bias": cfg.bias, "device": device, "dtype": dtype}
        self.gate = nn.Linear(cfg.d_model, cfg.d_ff, **kw)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, **kw)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, **kw)  # writes the stream: depth-scaled

    def forward(self, x: torch.Tensor, rope=None) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class GeluFFN(nn.Module):
    """Classic FFN (Vaswani et al. 2017, with GELU): W_2 gelu(W_1 x); W_1 has role up."""

    def __init__(self, cfg: ModelConfig, device=None, dtype=None):
        super().__init__()
        kw = {"bias": cfg.bias, "device": device, "dtype": dtype}
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, **kw)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, **kw)  # writes the stream: depth-scaled

    def forward(self, x: torch.Tensor, rope=None) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class GaussianBranch(nn.Module):
    """The Gaussian-branch model (the law's exact case) of a branch: an independent N(0, var) draw of the
    input's shape, ignoring the input. Drawn per (seed, layer, sublayer), so a
    rebuilt branch draws the same numbers."""

    def __init__(self, var: float, seed: int, layer: int, sublayer: str):
        super().__init__()
        self.std = math.sqrt(var)
        self.key = (seed, layer, f"branch/{sublayer}")

    def forward(self, x: torch.Tensor, rope=None) -> torch.Tensor:
        seed, layer, key = self.key
        gen = generator(seed, layer, key, x.device)
        return torch.randn(x.shape, generator=gen, device=x.device, dtype=x.dtype) * self.std


def make_ffn(cfg: ModelConfig, device=None, dtype=None) -> nn.Module:
    return (SwiGLU if cfg.ffn == "swiglu" else GeluFFN)(cfg, device=device, dtype=dtype)
