"""The deterministic steps of the large-width recursion, on token Gram matrices.

A stream of T tokens, each a vector of d coordinates, is summarised by its Gram
matrix K_ij = x_i . x_j / d (T x T per sequence; a batch is a leading axis). At large
width every linear map with i.i.d. zero-mean weights makes its output coordinates
i.i.d. Gaussian across coordinates with covariance K over the tokens (the NNGP limit:
Neal 1996, Lee et al. 2018, for attention Hron et al. 2020), so each part of a block
acts on K alone:

- a linear layer y = W x + b (W: std s, fan-in n; b: mean square m): s^2 n K + m;
- a norm (RMSNorm, LayerNorm) rescales each token: g^2 K_ij / sqrt((K_ii + eps)(K_jj + eps))
  (+ b^2), LayerNorm on the mean-removed K (1 - 1/n) K, n the normalised width;
- an elementwise activation: E[phi(u_i) phi(u_j)] over (u_i, u_j) ~ N(0, K restricted to
  i, j): the arc-cosine kernels (Cho & Saul 2009) for ReLU and relu^2 in closed form,
  Mehler's expansion over Hermite polynomials for GELU, SiLU and GELU-tanh (:func:`act_kernel`).

Everything here is float64 torch on the CPU; nothing depends on d except through the
layers' fan-ins (a number).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from ..model.layers import ACTIVATIONS

#: Activations with a closed-form kernel (arc-cosine of degree 1, 2).
CLOSED = {"relu": 1, "relu2": 2}
#: Terms of Mehler's series for the smooth activations, and Gauss-Hermite nodes for
#: their Hermite coefficients: against a 200 x 200-node 2-D quadrature at rho = 0.5,
#: 0.9, 0.99 and 1, 40 terms are exact to 4e-15 for SiLU and GELU of unit input
#: variance (the truncation grows with the input's scale; :func:`act_kernel` reports it).
MEHLER_TERMS = 48
HERMITE_NODES = 160


def linear(K: torch.Tensor, weight_var_fan_in: float, bias_ms: float = 0.0) -> torch.Tensor:
    """The Gram of y = W x + b: ``weight_var_fan_in`` (s^2 n) times K, plus the bias's mean
    square on every entry (a bias is the same vector for every token)."""
    out = K * weight_var_fan_in
    return out + bias_ms if bias_ms else out


def _inv_sqrt(diag: torch.Tensor) -> torch.Tensor:
    """1 / sqrt(d) where d > 0, else 0 (a zero token, or a norm's eps of 0)."""
    return torch.where(diag > 0, diag.clamp_min(0).rsqrt(), torch.zeros_like(diag))


def norm(
    K: torch.Tensor, kind: str, eps: float, gain2: float, width: int, bias2: float = 0.0,
    mean: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """RMSNorm or LayerNorm of every token: x / sqrt(mean(x^2) + eps) * g. The per-token
    mean square is K_ii (exact at large width); LayerNorm first removes each token's mean
    over its ``width`` features: its large-width value ``mean`` (mu_i, the features' mean:
    0 for the output of a linear map with zero-mean weights, E[phi(u_i)] after an
    activation) and its fluctuation, which scales what is left by (1 - 1/width) in
    expectation: (K - mu mu^T)(1 - 1/width). ``gain2``: the gain's mean square; ``bias2``:
    the bias's."""
    if kind == "layernorm":
        if mean is not None:
            K = K - mean.unsqueeze(-1) * mean.unsqueeze(-2)
        K = K * (1.0 - 1.0 / width)
    inv = _inv_sqrt(torch.diagonal(K, dim1=-2, dim2=-1) + eps)
    out = K * inv.unsqueeze(-1) * inv.unsqueeze(-2) * gain2
    return out + bias2 if bias2 else out


def norm_factor(diag: torch.Tensor, kind: str, eps: float, gain: float, width: int) -> torch.Tensor:
    """The per-token factor a norm multiplies each token by (g / sqrt(K_ii + eps), times
    (1 - 1/width) for LayerNorm's mean removal), from the Gram's diagonal K_ii, for cross
    Grams C(x, z) with another stream z: the norm maps C to factor_i C_ij."""
    scale = 1.0 - 1.0 / width if kind == "layernorm" else 1.0
    return _inv_sqrt(diag * scale + eps) * gain * scale


def cosine(K: torch.Tensor) -> torch.Tensor:
    """The mean pairwise cosine of the tokens, per sequence (i != j, as the probe's
    ``cos_sim``), averaged over the batch; NaN for one token."""
    T = K.shape[-1]
    if T < 2:
        return torch.tensor(math.nan, dtype=K.dtype)
    inv = _inv_sqrt(torch.diagonal(K, dim1=-2, dim2=-1))
    C = K * inv.unsqueeze(-1) * inv.unsqueeze(-2)
    off = C.sum(dim=(-2, -1)) - torch.diagonal(C, dim1=-2, dim2=-1).sum(-1)
    return (off / (T * (T - 1))).mean()


def mean_diag(K: torch.Tensor) -> torch.Tensor:
    """The mean square of the tokens' coordinates: the pooled variance of a zero-mean stream."""
    return torch.diagonal(K, dim1=-2, dim2=-1).mean()


def _correlation(K: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rho, diag): K's correlations, clamped to [-1, 1] (0 where a token is zero), and its diagonal."""
    diag = torch.diagonal(K, dim1=-2, dim2=-1)
    inv = _inv_sqrt(diag)
    rho = K * inv.unsqueeze(-1) * inv.unsqueeze(-2)
    rho = (0.5 * (rho + rho.transpose(-2, -1))).clamp(-1.0, 1.0)  # exactly symmetric (arccos is steep at 1)
    return rho, diag.clamp_min(0)


def activation_mean(K: torch.Tensor, kind: str) -> torch.Tensor:
    """E[phi(u_i)] for u_i ~ N(0, K_ii): the large-width mean of a token's features after
    the activation (what a LayerNorm on them removes). relu: sqrt(K_ii / (2 pi)); relu^2:
    K_ii / 2; the smooth ones by Gauss-Hermite quadrature."""
    diag = torch.diagonal(K, dim1=-2, dim2=-1).clamp_min(0)
    if kind == "relu":
        return torch.sqrt(diag / (2 * math.pi))
    if kind == "relu2":
        return diag / 2
    x, hw = _hermite_table(HERMITE_NODES, MEHLER_TERMS)
    return ACTIVATIONS[kind](torch.sqrt(diag).unsqueeze(-1) * x) @ hw[0]


def arccos_kernel(K: torch.Tensor, degree: int) -> torch.Tensor:
    """E[relu(u)^n relu(v)^n] for (u, v) ~ N(0, [[a, c], [c, b]]), n = ``degree`` (1, 2):
    (ab)^(n/2) J_n(theta) / (2 pi), cos theta = c / sqrt(ab), with Cho & Saul (2009)'s
    J_1 = sin t + (pi - t) cos t and J_2 = 3 sin t cos t + (pi - t)(1 + 2 cos^2 t)."""
    rho, diag = _correlation(K)
    theta = torch.arccos(rho)
    s, c = torch.sin(theta), rho
    if degree == 1:
        J = s + (math.pi - theta) * c
        scale = torch.sqrt(diag.unsqueeze(-1) * diag.unsqueeze(-2))
    else:
        J = 3 * s * c + (math.pi - theta) * (1 + 2 * c * c)
        scale = diag.unsqueeze(-1) * diag.unsqueeze(-2)
    return scale * J / (2 * math.pi)


@lru_cache(maxsize=4)
def _hermite_table(nodes: int, terms: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gauss-Hermite nodes x_q (probabilists', weights summing to 1) and the normalised
    Hermite polynomials He_n(x_q) / sqrt(n!) times the weights, (terms, nodes)."""
    x, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / w.sum()
    h = np.zeros((terms, nodes))
    h[0] = 1.0
    if terms > 1:
        h[1] = x
    for n in range(1, terms - 1):  # He_{n+1} = x He_n - n He_{n-1}, normalised by sqrt(n!)
        h[n + 1] = (x * h[n] - math.sqrt(n) * h[n - 1]) / math.sqrt(n + 1)
    return torch.from_numpy(x), torch.from_numpy(h * w)


def mehler_kernel(K: torch.Tensor, kind: str) -> tuple[torch.Tensor, float]:
    """E[phi(u_i) phi(u_j)] by Mehler's formula: for standard normals with correlation
    rho, E[f(x) g(y)] = sum_n rho^n c_n(f) c_n(g), c_n = E[f He_n] / sqrt(n!); here
    f = phi(sqrt(K_ii) .), each token its own coefficients (Gauss-Hermite, exact for the
    polynomial part), summed to :data:`MEHLER_TERMS` terms by Horner's scheme. The diagonal
    is E[phi(sqrt(K_ii) x)^2] itself; returns the kernel and the largest truncation error
    relative to it (the deficit of the series at rho = 1, which bounds the off-diagonal's
    for rho >= 0)."""
    phi = ACTIVATIONS[kind]
    x, hw = _hermite_table(HERMITE_NODES, MEHLER_TERMS)
    rho, diag = _correlation(K)
    f = phi(torch.sqrt(diag).unsqueeze(-1) * x)  # (..., T, nodes)
    c = f @ hw.T  # (..., T, terms)
    exact = (f * f) @ hw[0]  # E[phi^2] (hw[0] holds the weights)
    # the terms that matter: beyond the last whose c_n^2 exceeds 1e-18 E[phi^2], the rest
    # add less than rounding (their sum is in the deficit below either way)
    big = (c.square() > 1e-18 * exact.unsqueeze(-1)).flatten(0, -2).any(0) if c.dim() > 1 else c != 0
    last = int(big.nonzero().max()) if bool(big.any()) else 0
    if bool((diag == diag.flatten()[0]).all()):  # one scale for every token: scalar coefficients
        cs = c.flatten(0, -2)[0] if c.dim() > 1 else c
        out = torch.full_like(rho, float(cs[last] ** 2))
        for n in range(last - 1, -1, -1):
            out = out * rho + float(cs[n] ** 2)
    else:  # Horner's scheme in place: out <- out * rho + c_n c_n^T
        shape = rho.shape
        r = rho.reshape(-1, *shape[-2:])
        cb = c.reshape(-1, *c.shape[-2:])
        out = cb[..., last].unsqueeze(-1) * cb[..., last].unsqueeze(-2)
        for n in range(last - 1, -1, -1):
            cn = cb[..., n]
            out.mul_(r).baddbmm_(cn.unsqueeze(-1), cn.unsqueeze(-2))
        out = out.reshape(shape)
    series = torch.diagonal(out, dim1=-2, dim2=-1)
    deficit = torch.where(exact > 0, (exact - series).abs() / exact, torch.zeros_like(exact))
    idx = torch.arange(K.shape[-1])
    out[..., idx, idx] = exact
    return out, float(deficit.max()) if deficit.numel() else 0.0


def act_kernel(K: torch.Tensor, kind: str) -> tuple[torch.Tensor, float]:
    """E[phi(u_i) phi(u_j)], (u_i, u_j) Gaussian with covariance K's entries, for the
    activation of ``kind`` (a key of :data:`tinit.model.layers.ACTIVATIONS`: the gated
    FFNs' gate, the plain FFNs' hidden): closed form for relu and relu2, Mehler's series
    otherwise. Returns the kernel and its truncation error (0 for the closed forms)."""
    if kind in ("swiglu", "geglu", "gelu"):
        return mehler_kernel(K, kind)
    if kind in CLOSED:
        return arccos_kernel(K, CLOSED[kind]), 0.0
    raise ValueError(f"no kernel for activation {kind!r}")
