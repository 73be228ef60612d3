"""The largest singular value of a matrix, exactly or by Lanczos to a stated tolerance.

``tinit audit --checkpoint --spectral`` takes one of :data:`METHODS`:

- ``exact``: ``torch.linalg.svdvals`` (float64 up to :data:`EXACT_F64_MAX` elements).
  Every singular value is computed to get the largest: 3 s for an 8192 x 2048 matrix and
  ~40 s for a 128256 x 2048 embedding on one core.
- ``fast`` (the default): the Lanczos iteration on the Gram matrix of the matrix's
  smaller side (G = AᵀA or AAᵀ: one product with A and one with Aᵀ per step, no
  factorisation), started from a seeded random vector and stopped when the estimated
  error is below a fifth of the tolerance (:data:`FAST_RTOL`, 1% relative, see
  :func:`lanczos_top`). Matrices whose smaller side is at most :data:`EXACT_SIDE` are
  factorised instead (their SVD costs less than the iterations, and is exact).
- ``off``: not measured (the column is empty).

The Lanczos estimate approaches the largest eigenvalue λ₁ of G from below. Without a
spectral gap (a random matrix at init: the Marchenko-Pastur edge) the Ritz value
converges as θ_k ≈ λ₁(1 - c/k²) (Kuczyński & Woźniakowski 1992: the error falls at
least that fast, gap or no gap); the remaining error is then (k/2)(θ_k - θ_{k-1}), which
is what the stop rule estimates. A gap only makes the convergence faster (geometric).
``tests/test_spectral.py`` holds the estimate against ``svdvals`` on random matrices
(no gap) and trained-like ones (a small gap, a low-rank part over noise).

A matrix too large to hold (a 128256-row embedding of a checkpoint read in row
chunks) is given as a chunked operator (:func:`chunked_gram`): each Lanczos step is
then one pass over its chunks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch

#: The choices of ``--spectral``.
METHODS = ("fast", "exact", "off")
#: The relative tolerance of ``fast`` on the largest singular value.
FAST_RTOL = 0.01
#: ``fast`` factorises a matrix whose smaller side is at most this (exact and cheaper).
EXACT_SIDE = 256
#: Above this many elements ``exact`` works in float32 (a float64 SVD of a 4096 x 14336
#: matrix takes minutes on a CPU).
EXACT_F64_MAX = 4_000_000
#: The most Lanczos steps (a matrix that has not converged by then is reported as such).
MAX_STEPS = 300
#: The Lanczos start vector's seed: the same matrix always gives the same estimate.
SEED = 0
#: The stop rule must hold at this many consecutive steps, and not before step
#: :data:`MIN_STEPS`: in a cluster of nearly equal singular values the Ritz value can
#: stall near the second before it finds the first. Chosen on 440 matrices (random, and
#: trained-like with 4 or 16 top values 0.05-1% apart; the traces of
#: ``benchmarks/spectral_rule.py``): with one step and no minimum 9 ended 1.1-2.7% low;
#: with 3 steps from step 12, one stalled 1.04% low on the second of 16 values 1% apart
#: until step 19; from step 20 the worst is 0.61%, at 21.8 steps on average.
CONSECUTIVE = 3
MIN_STEPS = 20

#: v -> G v for a symmetric positive semi-definite G (float64 vectors in, out).
GramOp = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Estimate:
    """A largest singular value and how it was found."""

    value: float
    method: str  # "exact", "lanczos", "off"; "" for what has none (not a finite matrix)
    steps: int = 0  # Lanczos steps (products with G)
    converged: bool = True  # the stop rule met (False: MAX_STEPS reached, the value a lower bound)


NONE = Estimate(math.nan, "", 0, True)
#: A matrix holding a NaN or an infinity has no spectral norm (the value is flagged).
NOT_FINITE = Estimate(math.nan, "not finite", 0, True)


def lanczos_top(op: GramOp, n: int, rtol: float = FAST_RTOL, max_steps: int = MAX_STEPS,
                seed: int = SEED) -> tuple[float, int, bool]:  # fmt: skip
    """The largest eigenvalue of the n x n symmetric positive semi-definite operator
    ``op`` by Lanczos with full reorthogonalisation: (λ₁ estimate, steps, converged).

    Stops when the estimated relative error of sqrt(λ₁) (half that of λ₁) has been
    below ``rtol / 5`` at :data:`CONSECUTIVE` steps in a row, from step
    :data:`MIN_STEPS` on: with θ_k the largest Ritz value after k steps, the error of
    θ_k is estimated as (k/2)(θ_k - θ_{k-1}) (the gap-free rate, see the module
    docstring); or when the Krylov space is exhausted (an invariant subspace: θ is
    exact)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n, generator=gen, dtype=torch.float64)
    q /= torch.linalg.vector_norm(q)
    limit = min(n, max_steps)
    # (grown by doubling: a matrix that converges in 20 steps never holds 300 vectors)
    basis = torch.empty(min(limit, 32) + 1, n, dtype=torch.float64)
    basis[0] = q
    alphas: list[float] = []
    betas: list[float] = []
    theta_prev = math.nan
    theta = 0.0
    calm = 0  # consecutive steps meeting the rule
    for k in range(1, limit + 1):
        w = op(basis[k - 1])
        alpha = float(basis[k - 1] @ w)
        alphas.append(alpha)
        # full reorthogonalisation, twice (Gram-Schmidt loses orthogonality in one pass)
        for _ in range(2):
            w -= basis[:k].T @ (basis[:k] @ w)
        beta = float(torch.linalg.vector_norm(w))
        theta = float(_top_ritz(alphas, betas))
        if k >= 2 and theta > 0:
            err = 0.5 * k * (theta - theta_prev) / theta  # the error of theta, relative
            calm = calm + 1 if 0.5 * err <= rtol / 5 else 0  # sigma = sqrt(theta): half of it
            if calm >= CONSECUTIVE and k >= MIN_STEPS:
                return theta, k, True
        if theta > 0 and beta <= 1e-12 * theta:  # an invariant subspace: theta is exact
            return theta, k, True
        if theta == 0 and beta == 0:  # a zero operator
            return 0.0, k, True
        theta_prev = theta
        betas.append(beta)
        if k >= basis.shape[0]:
            grown = torch.empty(min(2 * basis.shape[0], limit + 1), n, dtype=torch.float64)
            grown[:k] = basis[:k]
            basis = grown
        basis[k] = w / beta
    return theta, limit, n <= max_steps


def _top_ritz(alphas: list[float], betas: list[float]) -> float:
    """The largest eigenvalue of the tridiagonal matrix (alphas on the diagonal, betas
    beside it)."""
    t = np.diag(alphas)
    if betas:
        off = np.asarray(betas[: len(alphas) - 1])
        t += np.diag(off, 1) + np.diag(off, -1)
    return float(np.linalg.eigvalsh(t)[-1])


#: Rows of a tall matrix per block of the fused Gram product (512 x 2048 floats: 4 MiB,
#: the block used twice while in cache): 20-23% less time a step than two full passes on
#: an 8192 x 2048 or 14336 x 4096 matrix, one core (a wide matrix's column blocks are
#: strided: slower than two passes there, which it keeps).
FUSED_ROWS = 512


def matrix_gram(w: torch.Tensor) -> tuple[GramOp, int]:
    """The Gram operator of a resident matrix on its smaller side, and that side."""
    m, n = w.shape
    dt = w.dtype

    if n <= m:
        blocks = w.split(FUSED_ROWS) if w.device.type == "cpu" and m >= 4 * FUSED_ROWS else None

        def op(v: torch.Tensor) -> torch.Tensor:  # Aᵀ(A v)
            x = v.to(device=w.device, dtype=dt)
            if blocks is None:  # as (A v)ᵀ A: row-major products
                return ((w @ x) @ w).to(device="cpu", dtype=torch.float64)
            out = torch.zeros(n, dtype=dt)
            for r in blocks:  # each row block read once from memory, used twice from cache
                out.addmv_(r.T, r @ x)
            return out.to(torch.float64)

        return op, n

    def op_t(v: torch.Tensor) -> torch.Tensor:  # A(Aᵀ v)
        u = v.to(device=w.device, dtype=dt) @ w
        return (w @ u).to(device="cpu", dtype=torch.float64)

    return op_t, m


#: Rows of a table's chunk converted at a time in :func:`chunked_gram` (256 x 2048 floats:
#: 2 MiB, used twice while in cache): the stored chunk is read once from memory, where
#: converting the whole chunk first wrote it out and read it back twice.
SUB_ROWS = 256


def chunked_gram(chunks: Callable[[], Iterable[torch.Tensor]], n: int, device="cpu",
                 dtype: torch.dtype = torch.float32) -> GramOp:  # fmt: skip
    """The Gram operator AᵀA of a matrix given as row chunks (n columns, any dtype, on
    the CPU): each call passes over ``chunks()`` once, Σ Cᵀ(C v), each chunk converted
    to ``dtype`` on ``device`` :data:`SUB_ROWS` rows at a time (on a GPU: whole)."""
    device = torch.device(device)
    rows = SUB_ROWS if device.type == "cpu" else None
    small: dict = {}

    def op(v: torch.Tensor) -> torch.Tensor:
        x = v.to(device=device, dtype=dtype)
        out = torch.zeros(n, dtype=dtype, device=device)
        for c in chunks():
            for part in c.split(rows) if rows else (c,):
                r = part.shape[0]
                buf = small.get(r)
                if buf is None:
                    buf = small[r] = torch.empty(r, n, dtype=dtype, device=device)
                buf.copy_(part)
                out.addmv_(buf.T, buf @ x)
        return out.to(device="cpu", dtype=torch.float64)

    return op


def exact_top(w: torch.Tensor) -> float:
    """``svdvals``' largest value (float64 up to :data:`EXACT_F64_MAX` elements)."""
    dt = torch.float64 if w.numel() <= EXACT_F64_MAX else torch.float32
    if w.device.type == "mps":  # (no float64 there)
        dt = torch.float32
    return float(torch.linalg.svdvals(w.to(dt))[0])


def largest_singular_value(w: torch.Tensor, method: str = "fast", rtol: float = FAST_RTOL,
                           finite: bool | None = None) -> Estimate:  # fmt: skip
    """The spectral norm of a resident matrix by ``method`` (:data:`METHODS`); the empty
    :data:`NONE` for a tensor that is not a matrix, :data:`NOT_FINITE` for a matrix that
    is not finite, whatever ``method`` (``finite``: the caller has checked that already)."""
    if w.dim() != 2 or w.numel() == 0:
        return NONE
    if finite is False:
        return NOT_FINITE
    if method == "off":
        return Estimate(math.nan, "off", 0, True)
    if finite is None and not bool(torch.isfinite(w).all()):
        return NOT_FINITE
    if method == "exact" or min(w.shape) <= EXACT_SIDE:
        return Estimate(exact_top(w), "exact")
    if method != "fast":
        raise ValueError(f"spectral method {method!r} is not one of {', '.join(METHODS)}")
    work = w if w.is_floating_point() and w.dtype in (torch.float32, torch.float64) else w.float()
    op, side = matrix_gram(work)
    lam, steps, ok = lanczos_top(op, side, rtol)
    return Estimate(math.sqrt(max(lam, 0.0)), "lanczos", steps, ok)


def largest_singular_value_chunked(chunks: Callable[[], Iterable[torch.Tensor]], shape: tuple[int, int],
                                   method: str = "fast", rtol: float = FAST_RTOL, finite: bool = True,
                                   device="cpu") -> Estimate:  # fmt: skip
    """The spectral norm of a matrix too large to hold, given as row chunks (a fresh
    iterator per call; each is one pass over the matrix). ``exact`` forms AᵀA once (n x n,
    n the columns) and takes its largest eigenvalue; ``fast`` runs :func:`lanczos_top`
    over the chunks. ``finite``: the caller's check that every element is finite (as
    :func:`largest_singular_value`: an empty matrix has none, a non-finite one is flagged
    whatever ``method``)."""
    m, n = shape
    if m == 0 or n == 0:
        return NONE
    if not finite:
        return NOT_FINITE
    if method == "off":
        return Estimate(math.nan, "off", 0, True)
    if method == "exact" or n <= EXACT_SIDE:
        g = torch.zeros(n, n, dtype=torch.float64)
        for c in chunks():
            c64 = c.to(device="cpu", dtype=torch.float64)
            g += c64.T @ c64
        return Estimate(math.sqrt(max(float(torch.linalg.eigvalsh(g)[-1]), 0.0)), "exact")
    lam, steps, ok = lanczos_top(chunked_gram(chunks, n, device), n, rtol)
    return Estimate(math.sqrt(max(lam, 0.0)), "lanczos", steps, ok)
