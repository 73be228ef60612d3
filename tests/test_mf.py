"""The large-width prediction (tinit.mf), each mechanism against an independent computation:
the norm step exactly (against torch's own norms on explicit vectors), a linear map and
the FFN's activation kernels against sampling, the attention average against the real
softmax of the model's own Attention module on Gaussian inputs (many weight draws), and
the whole recursion against the measured forward at a small shape."""

import dataclasses
import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tinit.experiments.measure.variance import run_variance
from tinit.mf import kernels as kn
from tinit.mf.attention import attention_gram, factor, scaled, uniform_weights
from tinit.mf.stack import predict
from tinit.model.config import InitConfig, ModelConfig, RunConfig
from tinit.model.layers import ACTIVATIONS, Attention, rope_cache

DT = torch.float64


def gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def random_gram(T: int, seed: int, scales=None) -> torch.Tensor:
    """A Gram matrix of T tokens with correlations of both signs and, with ``scales``,
    unequal diagonals."""
    A = torch.randn(T, T + 2, generator=gen(seed), dtype=DT)
    A = A + 0.8 * torch.randn(1, T + 2, generator=gen(seed + 1), dtype=DT)  # a shared direction
    K = A @ A.T / (T + 2)
    d = torch.diagonal(K).rsqrt()
    K = K * d[:, None] * d[None, :]
    if scales is not None:
        s = torch.as_tensor(scales, dtype=DT).sqrt()
        K = K * s[:, None] * s[None, :]
    return K


def vectors_with_gram(K: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """T vectors of n coordinates whose Gram x_i . x_j / n is exactly K."""
    T = K.shape[0]
    Q, _ = torch.linalg.qr(torch.randn(n, T, generator=gen(seed), dtype=DT))  # n x T, orthonormal columns
    return factor(K) @ Q.T * math.sqrt(n)


# --- the norm step: exact ---------------------------------------------------------------


def test_rmsnorm_step_is_exact():
    n = 96
    X = (
        torch.randn(6, n, generator=gen(0), dtype=DT)
        * torch.tensor([0.1, 1, 3, 0.5, 2, 7], dtype=DT)[:, None]
    )
    K = X @ X.T / n
    eps, g = 1e-3, 1.7
    Y = F.rms_norm(X, (n,), eps=eps) * g
    got = kn.norm(K, "rmsnorm", eps, g * g, n)
    torch.testing.assert_close(got, Y @ Y.T / n, rtol=1e-12, atol=1e-12)


def test_layernorm_step_is_exact_for_tokens_of_zero_mean():
    """LayerNorm removes each token's mean over its features: for tokens whose mean is 0
    it is RMSNorm with eps on the variance; the step's (1 - 1/n) scaling cancels exactly."""
    n = 64
    X = torch.randn(5, n, generator=gen(1), dtype=DT) * 2.5
    X = X - X.mean(-1, keepdim=True)
    K = X @ X.T / n
    Y = F.layer_norm(X, (n,), eps=0.0)
    torch.testing.assert_close(kn.norm(K, "layernorm", 0.0, 1.0, n), Y @ Y.T / n, rtol=1e-12, atol=1e-12)


def test_layernorm_step_removes_the_features_mean():
    """Features of nonzero mean (an activation's output, before a sub-LN): LayerNorm
    removes each token's mean, which the step takes as given (``mean``); with eps 0 exact."""
    n = 80
    X = (
        torch.randn(5, n, generator=gen(2), dtype=DT)
        + torch.tensor([0.5, -1.0, 2.0, 0.0, 3.0], dtype=DT)[:, None]
    )
    K = X @ X.T / n
    Y = F.layer_norm(X, (n,), eps=0.0)
    got = kn.norm(K, "layernorm", 0.0, 1.0, n, mean=X.mean(-1))
    torch.testing.assert_close(got, Y @ Y.T / n, rtol=1e-12, atol=1e-12)
    assert (kn.norm(K, "layernorm", 0.0, 1.0, n) - Y @ Y.T / n).abs().max() > 0.1  # (without it: far off)


def test_norm_factor_maps_cross_grams():
    n = 128
    X, Z = (torch.randn(4, n, generator=gen(s), dtype=DT) for s in (3, 4))
    K, C = X @ X.T / n, X @ Z.T / n
    f = kn.norm_factor(torch.diagonal(K), "rmsnorm", 1e-6, 2.0, n)
    Y = F.rms_norm(X, (n,), eps=1e-6) * 2.0
    torch.testing.assert_close(f[:, None] * C, Y @ Z.T / n, rtol=1e-12, atol=1e-12)


def test_cosine_is_the_mean_pairwise_cosine():
    X = torch.randn(2, 5, 32, generator=gen(5), dtype=DT)
    U = X / X.norm(dim=-1, keepdim=True)
    C = U @ U.transpose(-2, -1)
    want = ((C.sum((-2, -1)) - 5) / 20).mean()
    torch.testing.assert_close(kn.cosine(X @ X.transpose(-2, -1) / 32), want)


# --- a linear map and the activation kernels: against sampling ---------------------------


def test_linear_step_against_a_drawn_matrix():
    n, out, T = 48, 40000, 4
    X = torch.randn(T, n, generator=gen(6), dtype=DT)
    W = torch.randn(out, n, generator=gen(7), dtype=DT) * 0.3
    b = torch.randn(out, generator=gen(8), dtype=DT) * 0.5
    Y = X @ W.T + b
    got = kn.linear(X @ X.T / n, 0.3**2 * n, 0.5**2)
    torch.testing.assert_close(got, Y @ Y.T / out, rtol=0.03, atol=0.03)


@pytest.mark.parametrize("kind", ["swiglu", "geglu", "gelu", "relu", "relu2"])
def test_activation_kernel_against_sampling(kind):
    """E[phi(u_i) phi(u_j)] for u ~ N(0, K) with unequal scales, correlations near 1 and
    negative, against 400,000 samples: every entry within 4.5 standard errors."""
    A = torch.randn(5, 8, generator=gen(9), dtype=DT)
    A[2] = -0.7 * A[0] + 0.5 * A[2]  # negatively correlated with token 0
    A[4] = A[1] + 0.05 * A[4]  # nearly the same token as 1
    A = A / A.norm(dim=1, keepdim=True) * torch.tensor([0.3, 1.0, 2.5, 4.0, 1.0], dtype=DT).sqrt()[:, None]
    K = A @ A.T
    assert K[1, 4] / (K[1, 1] * K[4, 4]).sqrt() > 0.99 and K[0, 2] < 0, K
    got, err = kn.act_kernel(K, kind)
    phi = ACTIVATIONS[kind]
    n, chunks = 400_000, 8
    s1 = torch.zeros(5, 5, dtype=DT)
    s2 = torch.zeros(5, 5, dtype=DT)
    m1, m2 = torch.zeros(5, dtype=DT), torch.zeros(5, dtype=DT)
    for c in range(chunks):
        u = torch.randn(n // chunks, 5, generator=gen(20 + c), dtype=DT) @ factor(K).T
        p = phi(u)
        m1 += p.sum(0)
        m2 += (p * p).sum(0)
        prod = p[:, :, None] * p[:, None, :]
        s1 += prod.sum(0)
        s2 += (prod * prod).sum(0)
    mean = s1 / n
    se = ((s2 / n - mean**2) / n).sqrt()
    z = (got - mean) / se
    assert z.abs().max() < 4.5, (kind, z)
    if kind not in ("swiglu", "geglu"):  # a plain FFN's features' mean (what a sub-LN removes)
        mu = m1 / n
        z_mean = (kn.activation_mean(K, kind) - mu) / ((m2 / n - mu**2) / n).sqrt()
        assert z_mean.abs().max() < 4.5, z_mean
    assert err < 1e-6  # Mehler's series to 48 terms at input variances up to 4 (GELU-tanh: 1.5e-7)


@settings(max_examples=40, deadline=None, database=None)
@given(
    kind=st.sampled_from(["swiglu", "geglu", "gelu", "relu", "relu2"]),
    seed=st.integers(0, 10_000),
    scale=st.floats(0.05, 4.0),
    rank=st.integers(1, 5),
)
def test_activation_kernel_is_a_gram(kind, seed, scale, rank):
    """Whatever the input Gram (any rank: repeated tokens make it singular), the kernel is
    the Gram of the activations' features: symmetric, positive semi-definite, its diagonal
    E[phi(u_i)^2] >= E[phi(u_i)]^2, and by Cauchy-Schwarz |M_ij| <= sqrt(M_ii M_jj)."""
    A = torch.randn(5, rank, generator=gen(seed), dtype=DT) * math.sqrt(scale)
    K = A @ A.T
    M, _ = kn.act_kernel(K, kind)
    torch.testing.assert_close(M, M.T, rtol=0, atol=0)
    top = float(torch.diagonal(M).max())
    assert float(torch.linalg.eigvalsh(M).min()) >= -1e-9 * max(top, 1e-300)
    mu = kn.activation_mean(K, kind)
    assert (torch.diagonal(M) >= mu * mu - 1e-12 * top).all()
    bound = torch.sqrt(torch.diagonal(M)[:, None] * torch.diagonal(M)[None, :])
    assert (M.abs() <= bound * (1 + 1e-9) + 1e-15).all()


def test_arccos_kernels_at_the_diagonal_and_at_zero_correlation():
    """relu: E[relu(u)^2] = a/2, E[relu(u)] E[relu(v)] = sqrt(ab)/(2 pi) at rho 0; relu^2:
    E[relu(u)^4] = 3a^2/2, at rho 0 (a/2)(b/2)."""
    K = torch.tensor([[2.0, 0.0], [0.0, 0.5]], dtype=DT)
    r1, _ = kn.act_kernel(K, "relu")
    r2, _ = kn.act_kernel(K, "relu2")
    torch.testing.assert_close(torch.diagonal(r1), torch.tensor([1.0, 0.25], dtype=DT))
    torch.testing.assert_close(r1[0, 1], torch.tensor(1.0 / (2 * math.pi), dtype=DT))
    torch.testing.assert_close(torch.diagonal(r2), torch.tensor([6.0, 0.375], dtype=DT))
    torch.testing.assert_close(r2[0, 1], torch.tensor(0.25, dtype=DT))


# --- attention: against the real softmax on Gaussian inputs -------------------------------


def real_attention_gram(K, *, d, heads, kv_heads, sigma, causal, rope_base, softcap, forwards, seed):
    """The model's own Attention (W_O the identity, so its output is the heads' outputs
    side by side) on T tokens of Gram exactly K, over ``forwards`` independent draws of
    W_Q, W_K, W_V ~ N(0, sigma^2): the Gram of the output averaged over the draws, and
    its standard error."""
    T = K.shape[0]
    cfg = ModelConfig(d_model=d, n_heads=heads, n_kv_heads=kv_heads, max_seq_len=T,
                      attention="causal" if causal else "bidirectional",
                      positions="rope" if rope_base else "none", rope_base=rope_base or 10000.0)  # fmt: skip
    att = Attention(cfg, dtype=DT, softcap=softcap)
    x = vectors_with_gram(K, d, seed)[None]
    rope = rope_cache(T, cfg.head_dim, cfg.rope_base, dtype=DT) if rope_base else None
    g = gen(seed + 1)
    s1 = torch.zeros(T, T, dtype=DT)
    s2 = torch.zeros(T, T, dtype=DT)
    with torch.no_grad():
        att.o.weight.copy_(torch.eye(d, dtype=DT))
        for _ in range(forwards):
            for lin in (att.q, att.k, att.v):
                lin.weight.normal_(0.0, sigma, generator=g)
            u = att(x, rope)[0]
            G = u @ u.T / d
            s1 += G
            s2 += G * G
    mean = s1 / forwards
    return mean, ((s2 / forwards - mean**2) / forwards).sqrt()


@pytest.mark.parametrize(
    "case",
    [
        {"causal": True, "rope_base": None, "softcap": None, "kv_heads": None},
        {"causal": True, "rope_base": 10.0, "softcap": None, "kv_heads": None},
        {"causal": False, "rope_base": 10.0, "softcap": None, "kv_heads": None},
        {"causal": True, "rope_base": None, "softcap": 1.5, "kv_heads": None},
        {"causal": True, "rope_base": 10.0, "softcap": None, "kv_heads": 2},
    ],
    ids=["causal", "rope", "bidirectional-rope", "softcap", "gqa"],
)
def test_attention_average_against_the_real_softmax(case):
    """At logit variance 4 (q.k / sqrt(d_h) with q, k components of variance 2): the
    prediction's Monte Carlo over the logits (2,400 heads) against the real attention
    of Gaussian inputs (300 draws of 8 heads), every entry within 4.5 standard errors of
    their difference. RoPE at base 10, where it turns every frequency within 8 positions
    (at 10,000 the prediction without it is within 4 s.e. too: the test could not tell)."""
    T, d, heads = 8, 128, 8
    K = random_gram(T, 11)
    sigma2_d = 2.0  # s^2 n of W_Q, W_K, W_V
    sigma = math.sqrt(sigma2_d / d)
    real, real_se = real_attention_gram(K, d=d, heads=heads, kv_heads=case["kv_heads"], sigma=sigma,
                                        causal=case["causal"], rope_base=case["rope_base"],
                                        softcap=case["softcap"], forwards=300, seed=12)  # fmt: skip
    F_ = scaled(factor(K)[None], sigma2_d)
    dh = d // heads
    rope = rope_cache(T, dh, case["rope_base"], dtype=DT) if case["rope_base"] else None
    runs = [attention_gram(F_, F_, F_, dh, 1 / math.sqrt(dh), case["causal"], rope, case["softcap"], 600,
                           gen(40 + i))[0] for i in range(4)]  # fmt: skip
    mf = torch.stack(runs).mean(0)
    mf_se = torch.stack(runs).std(0) / 2
    z = (mf - real) / (real_se**2 + mf_se**2).sqrt()
    assert z.abs().max() < 4.5, z
    # and the logits mattered: uniform attention would be far off; so did RoPE
    U = uniform_weights(T, case["causal"])
    assert ((U @ (sigma2_d * K) @ U.T - real).abs() / real_se).max() > 20
    if rope is not None:
        norope = attention_gram(F_, F_, F_, dh, 1 / math.sqrt(dh), case["causal"], None, None, 2400, gen(50))[
            0
        ]
        assert ((norope - real) / (real_se**2 + mf_se**2).sqrt()).abs().max() > 5  # (beyond the 4.5 above)


def test_attention_of_zero_logits_is_the_uniform_average():
    """A query of zero variance (muP's zero W_Q): every logit is 0, the weights uniform
    over the keys each query sees; exactly U K_v U^T, computed here by explicit sums."""
    T = 6
    K = random_gram(T, 13)
    Fv = factor(K)[None]
    zero = torch.zeros_like(Fv)
    got = attention_gram(zero, Fv, Fv, 8, 0.35, True, None, None, 3, gen(0))[0]
    want = torch.empty(T, T, dtype=DT)
    for i in range(T):
        for j in range(T):
            want[i, j] = K[: i + 1, : j + 1].sum() / ((i + 1) * (j + 1))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# --- the whole recursion ---------------------------------------------------------------


def test_same_arguments_same_numbers():
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2, max_seq_len=8)
    tokens = torch.randint(64, (2, 8), generator=gen(0))
    a = predict(cfg, InitConfig(seed=1), tokens, 3).frame
    b = predict(cfg, InitConfig(seed=1), tokens, 3).frame
    assert a.equals(b)
    c = predict(cfg, InitConfig(seed=2), tokens, 3).frame  # another seed: other draws
    assert not c["mf_stream_var"].equals(a["mf_stream_var"])


def test_cost_and_numbers_do_not_depend_on_d_beyond_the_fan_ins():
    """At sigma = 1/sqrt(d) the variances a width sees are those of any other: the
    prediction at d 64 and d 8192 (same heads' size) agrees to rounding and the
    Monte Carlo (the same draws: same head size, same seed)."""
    tokens = torch.randint(1024, (1, 16), generator=gen(1))
    out = []
    for d, heads in ((64, 2), (8192, 256)):
        cfg = ModelConfig(n_layers=3, d_model=d, n_heads=heads, d_ff=4 * d, max_seq_len=16)
        out.append(predict(cfg, InitConfig(sigma="inv-sqrt-d", embed_std=1.0, seed=0), tokens, 2).frame)
    a, b = (torch.tensor(o["mf_stream_var"].to_numpy()) for o in out)
    torch.testing.assert_close(a, b, rtol=1e-9, atol=0)


def measured_and_predicted(model: ModelConfig, init: InitConfig, seeds: int, inits, placements=None):
    """Per (init, norm_position, k): the mean over ``seeds`` weight draws (one batch of
    tokens) of the measured columns and of the prediction, and the measured standard error."""
    run = RunConfig(batch=4, seq_len=16, data_seed=0, device="cpu")
    frames = [run_variance(model, dataclasses.replace(init, seed=s), run, inits, placements)["variance"]
              for s in range(seeds)]  # fmt: skip
    g = pd.concat(frames).groupby(["init", "norm_position", "k"], sort=False)
    return g.mean(numeric_only=True), g.std(numeric_only=True) / math.sqrt(seeds)


def test_end_to_end_against_the_measured_forward():
    """d 512, 4 heads, logit variance 1 (sigma = 1/sqrt(d)), v0 = 1, 2 layers, naive and
    scaled, pre and post, 6 weight draws of one batch: the stream variance within 2% at
    every addition (finite-width bias and seed noise are ~1% here), each branch variance
    within 3.5 standard errors of the seeds' mean, the tokens' cosine within 0.01."""
    model = ModelConfig(n_layers=2, d_model=512, n_heads=4, vocab_size=256, max_seq_len=16)
    m, se = measured_and_predicted(
        model, InitConfig(sigma="inv-sqrt-d", embed_std=1.0), 6, ("naive", "scaled")
    )
    assert (m["stream_var"] / m["mf_stream_var"] - 1).abs().max() < 0.02
    adds = m.index.get_level_values("k") > 0
    z = ((m["branch_var"] - m["mf_branch_var"]) / se["branch_var"])[adds]
    assert z.abs().max() < 3.5, z
    assert (m["cos_sim"] - m["mf_cos_sim"]).abs().max() < 0.01
    # the branches added what the prediction says: v_2L is 1.25 to 3.7 times v0 here
    assert m["mf_stream_var"].max() > 3


@pytest.mark.parametrize(
    "scheme",
    [
        "gemma2",
        "gemma3",
        "olmo2",
        "deepnet",
        "t-fixup",
        "magneto",
        "mup",
        "completep",
        "nanochat",
        "rezero",
        "depth-init",
    ],
)
def test_end_to_end_every_kind_of_scheme(scheme):
    """A scheme of each kind in its own placement and architecture (sandwich with soft-cap,
    GeGLU and sqrt(d) embedding, and with QK-norm per head; reordered with full-width
    QK-norm; post-norm with DeepNet's alpha; no norm with random biases; sub-LN LayerNorm
    with GELU; muP's 1/d_h logits and zero W_Q; CompleteP's branch multiplier; nanochat's
    x0 mix, backout and relu^2; ReZero's zero gate; a per-layer depth scaling), d 256,
    2 layers, 4 draws: v_2L within 5% and the last cosine within 0.03 of the measured means."""
    model = ModelConfig(n_layers=2, d_model=256, n_heads=4, vocab_size=256, max_seq_len=16)
    m, _ = measured_and_predicted(model, InitConfig(), 4, (scheme,))
    last = m.groupby(level=["init", "norm_position"]).tail(1)
    assert ((last["stream_var"] / last["mf_stream_var"] - 1).abs() < 0.05).all(), last
    assert ((last["cos_sim"] - last["mf_cos_sim"]).abs() < 0.03).all(), last


@pytest.mark.parametrize("layers", [2, 3], ids=["backout-of-the-last-block", "backout-of-x-mid"])
def test_x0_mix_and_backout_with_live_branches(layers):
    """nanochat's x0 mix and backout with branches that are not zero (its own W_O and
    W_down are): gpt2 with lambda_l = 1.1 - 0.1 l, mu = 0.5 and beta 0.4, so the cross Grams
    of the stream with x0 and x_mid carry real weight; at L = 2 the middle block is the last
    ((1 - beta) x), at L = 3 it is not (x - beta x_mid). d 512, 4 draws: every v_k within
    2%, the cosine within 0.01."""
    from tinit.model.catalogue import get_scheme
    from tinit.model.formula import Formula

    s = dataclasses.replace(get_scheme("gpt2"), name="mixed", aliases=(), backout=Formula("0.4"),
                            x0_mix=(Formula("1.1 - 0.1 * l"), Formula("0.5")))  # fmt: skip
    model = ModelConfig(n_layers=layers, d_model=512, n_heads=4, vocab_size=256, max_seq_len=16)
    init = InitConfig(scheme="mixed", schemes=(s,), sigma="inv-sqrt-d", embed_std=1.0)
    m, _ = measured_and_predicted(model, init, 4, ("mixed",), ("pre",))
    assert (m["stream_var"] / m["mf_stream_var"] - 1).abs().max() < 0.02
    assert (m["cos_sim"] - m["mf_cos_sim"]).abs().max() < 0.01
    # the backout moved the last addition's stream: below the one before it
    assert m["mf_stream_var"].iloc[-1] < 0.5 * m["mf_stream_var"].iloc[-2]


def test_gaussian_branches_are_the_laws_exact_case():
    """Branches of independent N(0, S2) noise (--branch gaussian): v_2L = v0 + 2L S2 with
    no norm on the branch (pre, none), v0 + 2L with one (sandwich, reordered: the noise
    normalised, gain 1), and post-norm's sum 1 + S2 after the first norm; the noise has no
    token structure, so the tokens stay orthogonal."""
    S2, L = 0.5, 3
    tokens = torch.arange(16).reshape(2, 8)  # distinct tokens: K_0 = v0 I
    for place, want in (("pre", 2 * L * S2), ("none", 2 * L * S2), ("sandwich", 2 * L), ("reordered", 2 * L)):
        cfg = ModelConfig(
            n_layers=L, d_model=32, n_heads=2, branch="gaussian", branch_var=S2, norm_position=place
        )
        f = predict(cfg, InitConfig(), tokens, 1).frame
        v0 = 0.02**2
        assert f["mf_stream_var"].iloc[-1] == pytest.approx(v0 + want, rel=1e-5), place
        assert f["mf_cos_sim"].abs().max() == 0
    cfg = ModelConfig(
        n_layers=L, d_model=32, n_heads=2, branch="gaussian", branch_var=S2, norm_position="post"
    )
    f = predict(cfg, InitConfig(), tokens, 1).frame
    assert f["mf_stream_var"].iloc[2:].to_numpy() == pytest.approx(1 + S2, rel=1e-5)


def test_end_to_end_the_model_options():
    """The options of the model itself: LayerNorm, learned positions (K_0 + sigma_pos^2 I),
    the GELU FFN, zero biases, grouped-query attention (2 K/V heads for 4), QK-norm,
    bidirectional attention, in pre and post placements; d 256, 4 draws: v_2L within 5%,
    the last cosine within 0.03."""
    model = ModelConfig(n_layers=2, d_model=256, n_heads=4, n_kv_heads=2, vocab_size=256, max_seq_len=16,
                        norm="layernorm", positions="learned", ffn="gelu", bias=True, qk_norm=True,
                        attention="bidirectional")  # fmt: skip
    m, _ = measured_and_predicted(model, InitConfig(sigma="inv-sqrt-d", embed_std=1.0), 4, ("naive", "gpt2"))
    last = m.groupby(level=["init", "norm_position"]).tail(1)
    assert ((last["stream_var"] / last["mf_stream_var"] - 1).abs() < 0.05).all(), last
    assert ((last["cos_sim"] - last["mf_cos_sim"]).abs() < 0.03).all(), last
