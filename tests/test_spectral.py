"""The largest singular value by Lanczos (`--spectral fast`, issue 45) against numpy's
full SVD (``np.linalg.norm(a, 2)``, computed independently of tinit): random matrices
with no spectral gap (the Marchenko-Pastur edge of a matrix at init), trained-like ones
with a small gap (a low-rank part over noise, its top values 0.05-0.5% apart), heavy
tails, wide and tall; within the stated 1%. The chunked operator (a table read in row
chunks) gives what the resident one gives; `exact` is the SVD; `off` measures nothing."""

import math

import numpy as np
import pytest
import torch

from tinit.experiments.audit.spectral import (
    EXACT_SIDE,
    FAST_RTOL,
    MIN_STEPS,
    lanczos_top,
    largest_singular_value,
    largest_singular_value_chunked,
    matrix_gram,
)


def _trained(m: int, n: int, gap: float, rank: int, gen: torch.Generator) -> torch.Tensor:
    """Noise plus a rank-``rank`` part whose singular values fall by ``gap`` (relative)
    each, the top one 5-50% above the noise's edge."""
    a = torch.randn(m, n, generator=gen, dtype=torch.float64) * 0.02
    u, _ = torch.linalg.qr(torch.randn(m, rank, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n, rank, generator=gen, dtype=torch.float64))
    edge = 0.02 * (math.sqrt(m) + math.sqrt(n))
    top = edge * (1.05 + 0.45 * float(torch.rand(1, generator=gen)))
    s = torch.tensor([top * (1 - gap) ** i for i in range(rank)], dtype=torch.float64)
    return (a + u @ torch.diag(s) @ v.T).float()


def _exact(w: torch.Tensor) -> float:
    return float(np.linalg.norm(w.double().numpy(), 2))


SHAPES = [(700, 300), (300, 700), (512, 512), (1200, 400)]


@pytest.mark.parametrize("shape", SHAPES)
def test_random_matrices_without_a_gap(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    for i in range(3):
        w = torch.randn(shape, generator=gen) * 0.02 * (i + 1)
        est = largest_singular_value(w, "fast")
        assert est.method == "lanczos" and est.converged and est.steps >= MIN_STEPS
        exact = _exact(w)
        assert est.value <= exact * (1 + 1e-6)  # a Ritz value never exceeds the largest
        assert (exact - est.value) / exact < FAST_RTOL


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("gap", [0.0005, 0.002, 0.005])
def test_trained_like_matrices_with_a_small_gap(shape, gap):
    gen = torch.Generator().manual_seed(int(gap * 1e5) + shape[0])
    for rank in (4, 16):
        w = _trained(*shape, gap, rank, gen)
        est = largest_singular_value(w, "fast")
        exact = _exact(w)
        assert (exact - est.value) / exact < FAST_RTOL, (rank, est)


def test_heavy_tails_and_a_large_gap():
    gen = torch.Generator().manual_seed(5)
    heavy = torch.randn(600, 400, generator=gen) ** 3
    spike = torch.randn(600, 400, generator=gen) * 0.01
    spike[0, 0] = 10.0  # one huge entry: a gap of ~x40, converged at once
    for w in (heavy, spike):
        est = largest_singular_value(w, "fast")
        assert abs(est.value - _exact(w)) / _exact(w) < FAST_RTOL


def test_exact_off_small_and_not_finite():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(300, 280, generator=gen)
    exact = largest_singular_value(w, "exact")
    assert exact.method == "exact" and exact.value == pytest.approx(_exact(w), rel=1e-12)
    small = torch.randn(EXACT_SIDE, 4000, generator=gen)  # a side <= EXACT_SIDE: the SVD, exact
    assert largest_singular_value(small, "fast").method == "exact"
    off = largest_singular_value(w, "off")
    assert off.method == "off" and math.isnan(off.value)
    bad = w.clone()
    bad[3, 4] = float("nan")
    assert largest_singular_value(bad, "fast").method == "not finite"
    assert math.isnan(largest_singular_value(torch.ones(5), "fast").value)  # not a matrix
    with pytest.raises(ValueError, match="not one of"):
        largest_singular_value(w, "lanczos")


def test_same_matrix_same_estimate_and_zero():
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(500, 300, generator=gen)
    assert largest_singular_value(w).value == largest_singular_value(w.clone()).value
    assert largest_singular_value(torch.zeros(500, 300)).value == 0.0


def test_an_invariant_subspace_stops_early():
    """A rank-2 Gram matrix: the Krylov space is exhausted after 2 steps, the value exact."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(400, 2, generator=gen, dtype=torch.float64) @ torch.randn(2, 300, generator=gen,
                                                                             dtype=torch.float64)  # fmt: skip
    op, side = matrix_gram(w)
    lam, steps, ok = lanczos_top(op, side)
    assert ok and steps <= 3 and math.sqrt(lam) == pytest.approx(_exact(w), rel=1e-9)


@pytest.mark.parametrize("method", ["fast", "exact"])
def test_chunked_equals_resident(method):
    """A table given as row chunks (each call a fresh pass) gives the resident estimate
    (the same Lanczos steps, the sums in another order) and the SVD's value."""
    gen = torch.Generator().manual_seed(4)
    w = _trained(2000, 300, 0.002, 4, gen)
    passes = []

    def chunks():
        passes.append(1)
        return iter(w.split(170))

    chunked = largest_singular_value_chunked(chunks, tuple(w.shape), method)
    resident = largest_singular_value(w, method)
    assert chunked.value == pytest.approx(resident.value, rel=1e-5)
    assert abs(chunked.value - _exact(w)) / _exact(w) < (FAST_RTOL if method == "fast" else 1e-9)
    # fast: one pass over the chunks per Lanczos step; exact: one pass forming the Gram matrix
    assert len(passes) == (chunked.steps if method == "fast" else 1)
