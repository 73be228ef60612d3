"""Rank-collapse metrics of the variance probe, against brute force: the mean pairwise
cosine similarity of a sequence's tokens over all T (T - 1) pairs, and Dong et al.'s
residual ratio with the composite norm sqrt(|.|_1 |.|_inf) from torch's matrix norms."""

import torch

from tinit.experiments.measure.probes import token_similarity
from tinit.experiments.measure.variance import run_variance
from tinit.model.config import InitConfig, ModelConfig, RunConfig


def _brute(x: torch.Tensor) -> tuple[float, float]:
    b, t, _ = x.shape
    cos = []
    for s in range(b):
        u = x[s] / x[s].norm(dim=-1, keepdim=True)
        pairs = [float(u[i] @ u[j]) for i in range(t) for j in range(t) if i != j]
        cos.append(sum(pairs) / len(pairs))

    def comp(m):
        return torch.sqrt(torch.linalg.matrix_norm(m, ord=1) * torch.linalg.matrix_norm(m, ord=float("inf")))

    ratio = (comp(x - x.mean(dim=1, keepdim=True)) / comp(x)).mean()
    return sum(cos) / b, float(ratio)


def test_token_similarity_matches_brute_force():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 9, 6, generator=gen, dtype=torch.float64) + 0.7  # a shared direction
    cos, ratio = token_similarity(x, torch.float64)
    want_cos, want_ratio = _brute(x)
    assert abs(float(cos) - want_cos) < 1e-12 and abs(float(ratio) - want_ratio) < 1e-12
    same = torch.randn(1, 1, 8, generator=gen, dtype=torch.float64).expand(2, 5, 8)
    cos, ratio = token_similarity(same, torch.float64)
    assert abs(float(cos) - 1) < 1e-12 and abs(float(ratio)) < 1e-12  # collapsed: every token the same


def test_variance_csv_has_rank_columns_at_every_addition():
    model = ModelConfig(n_layers=3, d_model=16, n_heads=2, vocab_size=64, max_seq_len=8)
    v = run_variance(model, InitConfig(), RunConfig(batch=2, seq_len=8, device="cpu"), inits=("naive",),
                     norm_positions=("pre", "post"))["variance"]  # fmt: skip
    assert v["cos_sim"].notna().all() and v["res_ratio"].notna().all()
    assert ((v["res_ratio"] >= 0) & (v["res_ratio"] <= 1.5) & (v["cos_sim"].abs() <= 1)).all()
