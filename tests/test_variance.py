"""Guards the variance measurement: the probe's statistics against a direct
computation, the Gaussian-branch mode against the seed's exact law to sampling
precision, the algebra tying stream, branch and correlation together, and the
depth behaviour of naive vs scaled init."""

import math

import numpy as np
import pytest
import torch

from tinit import theory
from tinit.experiments.measure.probes import VarianceProbe
from tinit.experiments.measure.variance import RUN_SUMMARY_COLUMNS, RUN_VARIANCE_COLUMNS, run_variance
from tinit.model.config import InitConfig, ModelConfig, RunConfig


def test_probe_statistics_match_numpy():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, 16, generator=g, dtype=torch.float64) * 2 + 0.5
    f = 0.3 * x + torch.randn(4, 8, 16, generator=g, dtype=torch.float64)
    probe = VarianceProbe(torch.float64)
    probe(0, -1, "embed", None, None, x)
    probe(1, 0, "attn", x, f, x + f)
    df = probe.frame()
    xa, fa = x.numpy().ravel(), f.numpy().ravel()
    assert df.loc[0, "stream_var"] == pytest.approx(xa.var())
    row = df.loc[1]
    assert row["stream_var"] == pytest.approx((xa + fa).var())
    assert row["branch_var"] == pytest.approx(fa.var())
    assert row["cross_corr"] == pytest.approx(np.corrcoef(xa, fa)[0, 1])
    assert math.isnan(row["stream_var_normed"])


def test_probe_over_many_additions_matches_numpy():
    """The statistics are derived once over all additions (VarianceProbe.frame): each row
    against numpy, along a stream that reuses the sums of the tensor that left the last
    addition, through a post-norm addition (normed stream), a branch too small for its
    variance in float32 (NaN, flagged, with its correlation) and an addition of another
    shape (so another count of elements)."""
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(2, 8, 16, generator=g) * 1.5 + 0.2
    f1 = 0.5 * x0 + torch.randn(2, 8, 16, generator=g)
    s1 = x0 + f1
    f2 = torch.randn(2, 8, 16, generator=g) * 0.7
    s2 = s1 + f2
    n2 = (s2 - s2.mean(-1, keepdim=True)) / s2.std(-1, keepdim=True)  # stands in for a norm after the sum
    tiny = torch.randn(2, 8, 16, generator=g) * 1e-30  # its squares underflow float32: variance 0
    s3 = n2 + tiny
    x4 = torch.randn(3, 5, 16, generator=g)
    f4 = torch.randn(3, 5, 16, generator=g) * 2
    probe = VarianceProbe(torch.float32)
    probe(0, -1, "embed", None, None, x0)
    probe(1, 0, "attn", x0, f1, s1)
    probe(2, 0, "ffn", s1, f2, s2, normed=n2)
    probe(3, 1, "attn", n2, tiny, s3)
    probe(4, 1, "ffn", x4, f4, x4 + f4)
    df = probe.frame()

    def a(t):
        return t.double().numpy().ravel()

    def close(got, want):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-7)

    close(df.loc[0, "stream_var"], a(x0).var())
    for k, (x, f, s) in {1: (x0, f1, s1), 2: (s1, f2, s2), 4: (x4, f4, x4 + f4)}.items():
        row = df.loc[k]
        close(row["stream_var"], a(s).var())
        close(row["branch_var"], a(f).var())
        close(row["stream_in_var"], a(x).var())
        close(row["cross_corr"], np.corrcoef(a(x), a(f))[0, 1])
    close(df.loc[2, "stream_var_normed"], a(n2).var())
    assert math.isnan(df.loc[1, "stream_var_normed"]) and math.isnan(df.loc[0, "branch_var"])
    lost = df.loc[3]
    assert math.isnan(lost["branch_var"]) and math.isnan(lost["cross_corr"])
    close(lost["stream_in_var"], a(n2).var())


def test_a_probe_past_its_first_table_rows_keeps_every_row():
    """The probe writes each addition's reductions into a table that grows by doubling
    (64 rows first): 150 additions, the stream going on through them (its sums reused)
    or, every seventh, a stream from elsewhere, every row against numpy in float64,
    and the rank-collapse pair against the brute force of tests/test_signal.py."""
    from test_signal import _brute

    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 6, 16, generator=g)
    probe = VarianceProbe(torch.float32)
    probe(0, -1, "embed", None, None, x)
    rows = {}
    for k in range(1, 151):
        if k % 7 == 0:
            x = torch.randn(2, 6, 16, generator=g) * (1 + k / 50)
        f = 0.2 * x + torch.randn(2, 6, 16, generator=g) * (k % 5 + 1)
        probe(k, (k - 1) // 2, "attn" if k % 2 else "ffn", x, f, x + f)
        rows[k] = (x, f, x + f)
        x = x + f
    df = probe.frame()
    assert list(df["k"]) == list(range(151))

    def a(t):
        return t.double().numpy().ravel()

    for k, (x_in, f, s) in rows.items():
        row = df.loc[k]
        assert row["stream_var"] == pytest.approx(a(s).var(), rel=1e-5)
        assert row["branch_var"] == pytest.approx(a(f).var(), rel=1e-5)
        assert row["stream_in_var"] == pytest.approx(a(x_in).var(), rel=1e-5)
        assert row["cross_corr"] == pytest.approx(np.corrcoef(a(x_in), a(f))[0, 1], rel=1e-4, abs=1e-6)
        cos, ratio = _brute(s.double())
        assert row["cos_sim"] == pytest.approx(cos, rel=1e-4, abs=1e-6)
        assert row["res_ratio"] == pytest.approx(ratio, rel=1e-4)


def test_columns(tiny_model, tiny_run):
    res = run_variance(tiny_model, run=tiny_run)
    assert list(res["variance"].columns) == RUN_VARIANCE_COLUMNS
    assert list(res["summary"].columns) == RUN_SUMMARY_COLUMNS
    v = res["variance"]
    assert len(v) == 4 * (2 * tiny_model.n_layers + 1)
    emb = v[v["k"] == 0]
    assert (emb["sublayer"] == "embed").all() and (emb["layer"] == -1).all()
    assert v.groupby(["init", "norm_position"]).size().to_dict() == {
        (i, p): 2 * tiny_model.n_layers + 1 for i in ("naive", "scaled") for p in ("pre", "post")
    }


@pytest.mark.parametrize("position", ["pre", "post"])
def test_variance_algebra_is_exact(position):
    """v_k = v_in + s_k^2 + 2 rho sqrt(v_in s_k^2): the measuring code is consistent."""
    cfg = ModelConfig(n_layers=4, d_model=32, n_heads=2, vocab_size=64)
    res = run_variance(cfg, InitConfig(sigma=0.1), RunConfig(batch=2, seq_len=16, dtype="float64"),
                       inits=("naive",), norm_positions=(position,))  # fmt: skip
    v = res["variance"]
    adds = v[v["k"] > 0]
    pre_in = np.concatenate([[v["stream_var"].iloc[0]], adds["stream_var"].to_numpy()[:-1]])
    if position == "post":
        normed = adds["stream_var_normed"].to_numpy()
        pre_in = np.concatenate([[v["stream_var"].iloc[0]], normed[:-1]])
    s2, rho = adds["branch_var"].to_numpy(), adds["cross_corr"].to_numpy()
    np.testing.assert_allclose(adds["stream_var"], pre_in + s2 + 2 * rho * np.sqrt(pre_in * s2), rtol=1e-10)


@pytest.mark.parametrize("position", ["pre", "post"])
def test_gaussian_branch_law(position):
    """The seed's exact model: v_2L = v0 + 2L S2 (pre-norm) to sampling precision."""
    L, S2 = 8, 0.25
    cfg = ModelConfig(n_layers=L, d_model=128, n_heads=4, vocab_size=4096, branch="gaussian", branch_var=S2)
    run = RunConfig(batch=8, seq_len=64, dtype="float64")
    res = run_variance(cfg, InitConfig(sigma=0.02, seed=5), run, inits=("naive",), norm_positions=(position,))
    v = res["variance"]
    n = run.batch * run.seq_len * cfg.d_model
    v0 = v["stream_var"].iloc[0]
    for k in (1, L, 2 * L):
        vk = v.loc[v["k"] == k, "stream_var"].item()
        if position == "pre":
            expected = theory.gaussian_branch_final(v0, k / 2, S2)
        else:  # the stream entering addition k >= 2 is normalised to variance 1
            expected = v0 + S2 if k == 1 else 1.0 + S2
        # every element is a sum of independent Gaussians: pooled-variance SE, 5 sigma
        assert abs(vk - expected) < 5 * theory.pooled_variance_se(expected, n), (k, vk, expected)
    s2 = v.loc[v["k"] > 0, "branch_var"]
    assert abs(s2.mean() - S2) < 5 * theory.pooled_variance_se(S2, n * len(s2))
    corr_se = 1 / math.sqrt(n)
    assert v.loc[v["k"] > 1, "cross_corr"].abs().max() < 5 * corr_se


def test_scaled_init_depth_independent_naive_grows():
    def v_final(L, scheme):
        cfg = ModelConfig(n_layers=L, d_model=64, n_heads=2, vocab_size=256)
        res = run_variance(cfg, run=RunConfig(batch=4, seq_len=32), inits=(scheme,), norm_positions=("pre",))
        return res["summary"]["v_final"].item()

    naive3, naive12 = v_final(3, "naive"), v_final(12, "naive")
    scaled3, scaled12 = v_final(3, "scaled"), v_final(12, "scaled")
    # naive: v_2L - v0 grows ~linearly in L (4x the layers); scaled: within a small factor
    assert naive12 / naive3 > 2.5
    assert 0.5 < scaled12 / scaled3 < 2.0


def test_post_norm_stream_is_normalised(tiny_model, tiny_run):
    res = run_variance(tiny_model, run=tiny_run, norm_positions=("post",))
    v = res["variance"]
    normed = v.loc[v["k"] > 0, "stream_var_normed"]
    # RMSNorm with unit gain: mean square 1, so variance = 1 - mean^2 <= 1
    assert (normed <= 1 + 1e-5).all() and (normed > 0.9).all()


def test_closed_form_text_is_the_placements_law(tiny_model, tiny_run):
    """summary.csv's closed_form says the law its pred_closed_final computes: on a
    post-norm row the last sum, 1 + s^2 (the normalised stream plus one branch), not
    pre-norm's v0 + 2L s^2; each text, read as a formula of the row's own v0 and
    reference branch variances, gives the row's pred_closed_final."""
    res = run_variance(
        tiny_model, run=tiny_run, inits=("naive", "gpt2", "deepnet"), norm_positions=("pre", "post")
    )
    rows = {(r.init, r.norm_position): r for r in res["summary"].itertuples(index=False)}
    L = tiny_model.n_layers
    want = {  # (text starts with, value from the row's v0 and s2_ref_ffn / s2_ref_attn)
        ("naive", "pre"): ("v0 + 2L s^2", lambda r: r.v0 + L * (r.s2_ref_attn + r.s2_ref_ffn)),
        ("gpt2", "pre"): ("v0 + s^2", lambda r: r.v0 + (r.s2_ref_attn + r.s2_ref_ffn) / 2),
        ("naive", "post"): ("1 + s^2 (post-norm: the last sum", lambda r: 1 + r.s2_ref_ffn),
        ("gpt2", "post"): ("1 + s^2 r (post-norm", lambda r: 1 + r.s2_ref_ffn / (2 * L)),
        ("deepnet", "post"): (
            "a^2 + s^2 r (post-norm",
            lambda r: (2 * L) ** 0.5 + r.s2_ref_ffn * (8 * L) ** -1.5,
        ),
    }
    for key, (text, value) in want.items():
        r = rows[key]
        assert r.closed_form.startswith(text), (key, r.closed_form)
        assert r.pred_closed_final == pytest.approx(value(r), rel=1e-5), key
    assert "r = 1 / (2 * L)" in rows[("gpt2", "post")].closed_form
    for key, r in rows.items():
        if key[1] == "post":
            assert "2L" not in r.closed_form, (key, r.closed_form)


def test_shared_draws_make_configs_comparable(tiny_model, tiny_run):
    """Embedding draws and tokens are shared: v0 is identical across configurations."""
    res = run_variance(tiny_model, run=tiny_run)
    assert res["summary"]["v0"].nunique() == 1


def test_seed_changes_the_numbers(tiny_model, tiny_run):
    a = run_variance(tiny_model, InitConfig(seed=1), tiny_run, inits=("naive",), norm_positions=("pre",))
    b = run_variance(tiny_model, InitConfig(seed=2), tiny_run, inits=("naive",), norm_positions=("pre",))
    assert a["summary"]["v_final"].item() != b["summary"]["v_final"].item()


def test_float64_and_bfloat16_runs(tiny_model, tiny_run):
    import dataclasses

    for dtype in ("float64", "bfloat16"):
        res = run_variance(tiny_model, run=dataclasses.replace(tiny_run, dtype=dtype), inits=("naive",))
        assert np.isfinite(res["variance"]["stream_var"]).all()
    assert torch.get_default_dtype() == torch.float32
