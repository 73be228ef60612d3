"""The stop rule of ``--spectral fast`` (tinit/experiments/audit/spectral.py), chosen on
traces: the largest Ritz value at every Lanczos step (up to 90) of 440 matrices against
numpy's exact largest singular value, then each candidate rule replayed on the traces.

    python benchmarks/spectral_rule.py            # ~2 min on one core

The matrices (seeded): 110 of shapes 300-4096 a side (20 random N(0, 0.02) with no
spectral gap, 90 trained-like: noise plus a rank-4 or rank-16 part whose top values fall
by 0.05-0.5% each) and 330 more (30 random, 300 trained-like with gaps 0.05-1%, shapes
600-3000). A rule stops at step k once (k/4)(θ_k - θ_{k-1})/θ_k <= tau held at
``consec`` steps in a row and k >= ``kmin`` (θ: the Ritz value of λ = σ², so the
quantity is the estimated relative error of σ). Printed per rule: the worst relative
error of σ, how many matrices ended more than 1% low, and the mean steps.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from tinit.experiments.audit.spectral import (
    CONSECUTIVE,
    FAST_RTOL,
    MIN_STEPS,
    _top_ritz,
    exact_top,
    matrix_gram,
)


def trace(w: torch.Tensor, steps: int = 90) -> np.ndarray:
    """The largest Ritz value after each of ``steps`` Lanczos steps (seed 0, as tinit)."""
    op, n = matrix_gram(w)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(n, generator=gen, dtype=torch.float64)
    basis = torch.empty(steps + 1, n, dtype=torch.float64)
    basis[0] = q / q.norm()
    alphas: list[float] = []
    betas: list[float] = []
    out = []
    for k in range(1, steps + 1):
        v = op(basis[k - 1])
        alphas.append(float(basis[k - 1] @ v))
        for _ in range(2):
            v -= basis[:k].T @ (basis[:k] @ v)
        out.append(_top_ritz(alphas, betas))
        betas.append(float(v.norm()))
        basis[k] = v / betas[-1]
    return np.array(out)


def trained(m: int, n: int, gap: float, rank: int, gen: torch.Generator) -> torch.Tensor:
    a = torch.randn(m, n, generator=gen) * 0.02
    u, _ = torch.linalg.qr(torch.randn(m, rank, generator=gen))
    v, _ = torch.linalg.qr(torch.randn(n, rank, generator=gen))
    top = float(torch.linalg.matrix_norm(a, 2)) * float(1.02 + 0.5 * torch.rand(1, generator=gen))
    s = torch.tensor([top * (1 - gap) ** i for i in range(rank)])
    return a + u @ torch.diag(s) @ v.T


def matrices():
    gen = torch.Generator().manual_seed(3)
    for m, n in [(2048, 512), (512, 2048), (1024, 1024), (4096, 1024), (1500, 3000)]:
        for _ in range(4):
            yield "random", torch.randn(m, n, generator=gen) * 0.02
        for gap in (0.0005, 0.002, 0.005):
            for rank in (4, 16):
                for _ in range(3):
                    yield "trained", trained(m, n, gap, rank, gen)
    gen = torch.Generator().manual_seed(11)
    for _ in range(6):
        for m, n in [(600, 2400), (2400, 600), (1200, 1200), (3000, 800), (800, 2000)]:
            yield "random", torch.randn(m, n, generator=gen) * 0.02
            for gap in (0.0005, 0.001, 0.002, 0.004, 0.01):
                for rank in (4, 16):
                    yield "trained", trained(m, n, gap, rank, gen)


def replay(traces, tau: float, consec: int, kmin: int) -> tuple[float, int, float, float]:
    errs, steps, random = [], [], []
    for kind, th, lam in traces:
        calm, stop = 0, len(th)
        for k in range(2, len(th) + 1):
            est = 0.25 * k * (th[k - 1] - th[k - 2]) / th[k - 1]
            calm = calm + 1 if est <= tau else 0
            if calm >= consec and k >= kmin:
                stop = k
                break
        errs.append(1 - math.sqrt(th[stop - 1] / lam))
        steps.append(stop)
        random.append(kind == "random")
    e, s, r = np.array(errs), np.array(steps), np.array(random)
    return float(e.max()), int((e > 0.01).sum()), float(s[r].mean()), float(s[~r].mean())


def main() -> None:
    torch.set_num_threads(1)
    traces = [(kind, trace(w), exact_top(w) ** 2) for kind, w in matrices()]
    print(f"{len(traces)} matrices; tinit's rule: tau {FAST_RTOL / 5:g}, {CONSECUTIVE} steps in a row, "
          f"from step {MIN_STEPS}")  # fmt: skip
    print(f"{'tau':>7} {'consec':>6} {'kmin':>4} {'worst':>7} {'>1%':>4} {'steps random':>13} {'trained':>8}")
    for tau in (1e-3, 2e-3, 5e-3):
        for consec, kmin in ((1, 3), (3, 12), (3, 16), (3, 20), (3, 24)):
            worst, fails, sr, st = replay(traces, tau, consec, kmin)
            print(f"{tau:7g} {consec:6d} {kmin:4d} {worst:7.2%} {fails:4d} {sr:13.1f} {st:8.1f}")


if __name__ == "__main__":
    main()
