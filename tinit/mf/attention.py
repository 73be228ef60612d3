"""Attention at large width: the softmax averaged over the Gaussian logits, by Monte Carlo.

At large width the queries, keys and values of a head are, coordinate by coordinate,
Gaussian over the tokens with the Grams K_q, K_k, K_v that the linear maps give the
attention input (independent of each other: W_Q, W_K, W_V are independent), so each
head's logit matrix is z_ij = scale * q_i . k_j over the head's d_h coordinates (RoPE
rotating the coordinate pairs as the model does), with covariance
scale^2 d_h K_q,ii' K_k,jj' (without RoPE). The head's output u_i = sum_j P_ij v_j has,
averaged over the values, the Gram P K_v P^T, and over the logits

    K_u = E_z[ P(z) K_v P(z)^T ],   P = softmax over the keys each query sees.

That expectation has no closed form; :func:`attention_gram` estimates it by Monte Carlo:
``draws`` heads per sequence, each with its queries and keys drawn as Gaussians with the
head's own d_h coordinates (so the logits are q.k exactly, not only their covariance;
they are Gaussian up to O(1/d_h)), the softmax taken as the model takes it (the scale,
the soft-cap, the causal mask), and P K_v P^T averaged. The draws come from a generator
seeded by (seed, layer), so the prediction is a function of its arguments. Grouped-query
attention shares a key/value head between query heads: the expected Gram is the same
(each query head's output fills its own coordinates), only its fluctuations differ.
"""

from __future__ import annotations

import math

import torch

from ..model.layers import apply_rope

#: Head coordinates drawn per query and key: the head's own d_h up to this; a wider head
#: is drawn with this many coordinates (every (d_h / 128)-th RoPE frequency pair), the
#: logits scaled to the head's variance.
MAX_COMPONENTS = 128
#: Bytes of float32 temporaries one chunk of draws may hold (the draws are taken in
#: chunks of sequences x heads that fit).
CHUNK_BYTES = 64 * 2**20


def factor(K: torch.Tensor) -> torch.Tensor:
    """A square root F of each positive semi-definite K (F F^T = K): its Cholesky factor,
    or where that fails (a Gram of repeated tokens is singular) by its eigenvalues, the
    negative rounding clipped at 0; NaN for a K that is not finite (an overflowed stream:
    the prediction goes on as NaN, which the run flags, as it flags the measurement's)."""
    if not bool(torch.isfinite(K).all()):  # a stream that overflowed: nothing to factor (NaN, flagged)
        return torch.full_like(K, math.nan)
    F, info = torch.linalg.cholesky_ex(K)
    if int(info.amax()) == 0:
        return F
    try:
        vals, vecs = torch.linalg.eigh(K)
    except torch.linalg.LinAlgError:  # finite but beyond the solver (entries near 1e300)
        return torch.full_like(K, math.nan)
    return vecs * vals.clamp_min(0).sqrt().unsqueeze(-2)


def gram(F: torch.Tensor) -> torch.Tensor:
    """F F^T."""
    return F @ F.transpose(-2, -1)


def scaled(F: torch.Tensor, var: float, bias2: float = 0.0) -> torch.Tensor:
    """A factor of var K + bias2 (every entry) from a factor F of K: sqrt(var) F, with a
    column sqrt(bias2) 1 appended when bias2 > 0 (a bias shared by every token)."""
    out = F * math.sqrt(var)
    if bias2 > 0:
        out = torch.cat([out, torch.full((*F.shape[:-1], 1), math.sqrt(bias2), dtype=F.dtype)], dim=-1)
    return out


def uniform_weights(T: int, causal: bool, dtype=torch.float64) -> torch.Tensor:
    """The attention of logits that are all equal: 1/(i+1) over the keys j <= i (causal)
    or 1/T over all."""
    if not causal:
        return torch.full((T, T), 1.0 / T, dtype=dtype)
    tri = torch.ones(T, T, dtype=dtype).tril()
    return tri / tri.sum(-1, keepdim=True)


def draw_bytes(T: int, m: int) -> int:
    """The float32 bytes one draw of :func:`attention_gram` holds for one sequence of ``T``
    tokens: its query and key projections and values (T x m each, ``m`` the components
    drawn) and four T x T logit and weight matrices. The chunk of draws is sized by it, and
    so is :func:`tinit.mf.stack.memory_bytes` (at m = min(head_dim, MAX_COMPONENTS))."""
    return 4 * (3 * T * m + 4 * T * T)


def attention_gram(
    Fq: torch.Tensor, Fk: torch.Tensor, Fv: torch.Tensor, head_dim: int, scale: float, causal: bool,
    rope: tuple[torch.Tensor, torch.Tensor] | None, softcap: float | None, draws: int,
    generator: torch.Generator,
) -> torch.Tensor:  # fmt: skip
    """E_z[P K_v P^T] per sequence, by ``draws`` sampled heads per sequence (see the
    module), from factors of the Grams (F F^T = K, shape (B, T, r), float64: sampling a
    Gaussian with covariance K is F times a standard one). ``rope``: the model's cos and
    sin tables (T, d_h / 2). Logits that are exactly 0 (a query or key of zero variance:
    muP's zero W_Q) give the uniform weights, computed exactly."""
    B, T, _ = Fv.shape
    if not (bool(torch.linalg.vector_norm(Fq) > 0) and bool(torch.linalg.vector_norm(Fk) > 0)):
        U = uniform_weights(T, causal)
        return U @ gram(Fv) @ U.T
    m = min(head_dim, MAX_COMPONENTS)
    m -= m % 2 if rope is not None else 0
    gain = scale * math.sqrt(head_dim / m)
    if rope is not None:
        cos, sin = rope
        half = cos.shape[-1]
        idx = torch.linspace(0, half - 1, m // 2).round().long() if m // 2 < half else torch.arange(half)
        rope = (cos[:T, idx].float(), sin[:T, idx].float())
    Fq, Fk, Fv = Fq.float(), Fk.float(), Fv.float()
    mask = torch.ones(T, T, dtype=torch.bool).triu(1) if causal else None
    out = torch.zeros(B, T, T, dtype=torch.float64)
    per_draw = draw_bytes(T, m)
    chunk = max(1, min(draws, CHUNK_BYTES // max(per_draw * B, 1)))
    done = 0
    while done < draws:
        n = min(chunk, draws - done)
        gq = torch.randn(B, n, Fq.shape[-1], m, generator=generator, dtype=torch.float32)
        gk = torch.randn(B, n, Fk.shape[-1], m, generator=generator, dtype=torch.float32)
        q = Fq.unsqueeze(1) @ gq  # (B, n, T, m): each column ~ N(0, K_q)
        k = Fk.unsqueeze(1) @ gk
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        z = (q @ k.transpose(-2, -1)) * gain
        if softcap is not None:
            z = softcap * torch.tanh(z / softcap)
        if mask is not None:
            z = z.masked_fill(mask, float("-inf"))
        a = torch.softmax(z, dim=-1) @ Fv.unsqueeze(1)  # P F_v: P K_v P^T = (P F_v)(P F_v)^T
        out += (a @ a.transpose(-2, -1)).sum(1).double()
        done += n
    return out / draws
