"""Guards ``tinit check`` (tinit.experiments.measure.check): the statistics its pass criteria
rest on (the exact covariance standard error, the t quantile, the depth prediction),
that its measurement pass reproduces ``tinit variance``'s numbers, that the criteria
can fail, and the command's files, report, exit codes and bad-input errors."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import figures_built_not_saved
from typer.testing import CliRunner

from tinit.cli import app
from tinit.experiments.configs import configure
from tinit.experiments.device import make_tokens
from tinit.experiments.measure.check import (
    CHECK_COLUMNS,
    ITEMS,
    CovarianceProbe,
    measure_additions,
    run_check,
    z_quantile,
)
from tinit.experiments.measure.variance import run_variance
from tinit.experiments.measure.verdicts import depth_prediction, gradient_rows, params_rows, t_quantile
from tinit.model.config import ConfigError, InitConfig, ModelConfig, RunConfig

runner = CliRunner()
TINY = ["--layers", "2", "--deep-layers", "4", "--d-model", "32", "--heads", "2", "--batch", "2",
        "--seq-len", "16", "--vocab", "64", "--head-dims", "8,16"]  # fmt: skip


def test_quantiles():
    assert z_quantile(0.05) == pytest.approx(1.959964, abs=1e-6)
    assert z_quantile(0.01, 24) == pytest.approx(3.5293, abs=1e-4)  # Bonferroni over 24
    # Student t, two-sided (tables: t_{0.995,15} = 2.946713, t_{0.975,10} = 2.228139, t_{0.995,1} = 63.65674)
    assert t_quantile(0.01, 15) == pytest.approx(2.946713, abs=1e-5)
    assert t_quantile(0.05, 10) == pytest.approx(2.228139, abs=1e-5)
    assert t_quantile(0.01, 1) == pytest.approx(63.65674, abs=1e-3)


def test_covariance_se_is_the_spread_over_weight_draws():
    """Fix the stream x and the branch input h; draw the branch's last matrix W many
    times: the covariance's standard deviation over draws must equal the probe's se."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, 8, generator=gen, dtype=torch.float64) + 0.3
    # h correlated with x (as a real branch input is), so the naive 1/sqrt(N) would be wrong
    h = torch.cat([x, torch.randn(2, 16, 4, generator=gen, dtype=torch.float64)], dim=-1).tanh()
    std, draws = 0.7, 4000
    # one probe records every draw as an addition of its own (k = draw), as a forward records
    # each block's; its frame, built once, has a row per draw (a frame per draw: 2 of 3 s)
    probe = CovarianceProbe(torch.float64, {"attn": std})
    for k in range(draws):
        w = torch.randn(8, 12, generator=gen, dtype=torch.float64) * std
        probe.capture(None, (h,))
        probe(k, 0, "attn", x, h @ w.T, x + h @ w.T)
    frame = probe.frame()
    assert list(frame["k"]) == list(range(draws))
    covs, ses = frame["cov"].to_numpy(), frame["cov_se"].to_numpy()
    assert np.ptp(ses) < 1e-12  # the se does not depend on W
    # the sample SD of `draws` Gaussian values has relative SE 1/sqrt(2 (draws - 1)); allow 4 of them
    assert np.std(covs, ddof=1) / ses[0] == pytest.approx(1.0, abs=4 / math.sqrt(2 * (draws - 1)))
    assert abs(np.mean(covs)) / (ses[0] / math.sqrt(draws)) < 4


def test_measure_additions_reproduces_tinit_variance():
    model, init, run = ModelConfig(n_layers=3, d_model=32, n_heads=2, vocab_size=64), InitConfig(seed=2), \
        RunConfig(batch=2, seq_len=16, device="cpu")  # fmt: skip
    ref = run_variance(model, init, run, inits=("scaled",), norm_positions=("pre",))["variance"]
    cfg, ini = configure(model, init, run, "scaled", "pre")
    tokens = make_tokens(model, run, init.seed, torch.device("cpu"))
    df = measure_additions(cfg, ini, tokens, torch.device("cpu"), torch.float32, stream=False)
    for col in ("k", "stream_var", "branch_var", "cross_corr", "pred_cumulative", "pred_closed"):
        np.testing.assert_allclose(df[col].to_numpy(), ref[col].to_numpy(), rtol=1e-6, equal_nan=True)
    # the covariance itself agrees with the correlation the variance probe records
    adds = df[df["k"] > 0]
    stream_in = np.concatenate([[df["stream_var"].iloc[0]], adds["stream_var"].to_numpy()[:-1]])
    np.testing.assert_allclose(
        adds["cov"], adds["cross_corr"] * np.sqrt(stream_in * adds["branch_var"]), rtol=1e-4, atol=1e-12
    )
    streamed = measure_additions(cfg, ini, tokens, torch.device("cpu"), torch.float32, stream=True)
    np.testing.assert_allclose(streamed["cov_z"], df["cov_z"], rtol=1e-6, equal_nan=True)


def test_covariance_z_scores_are_standard_normal_across_seeds():
    """The independence assumption holds by construction in expectation, so the z-scores of
    many independent (seed) draws must look N(0, 1): mean and SD within 4 standard errors."""
    model, run = ModelConfig(n_layers=3, d_model=32, n_heads=2, vocab_size=64), RunConfig(batch=2, seq_len=16)
    zs = []
    for seed in range(20):
        cfg, ini = configure(model, InitConfig(seed=seed), run, "naive", "pre")
        tokens = make_tokens(model, run, seed, torch.device("cpu"))
        df = measure_additions(cfg, ini, tokens, torch.device("cpu"), torch.float32, stream=False)
        zs.append(df.loc[df["k"] > 0, "cov_z"].to_numpy())
    z = np.concatenate(zs)
    n = len(z)
    assert abs(z.mean()) < 4 / math.sqrt(n)
    assert abs(z.std(ddof=1) - 1) < 4 / math.sqrt(2 * (n - 1))


def _synthetic(scheme: str, L: int, u_attn: np.ndarray, u_ffn: np.ndarray, v0: float = 1.0) -> pd.DataFrame:
    """A variance frame whose branch variances (in unscaled units) are given."""
    scale = 1.0 / (2 * L) if scheme == "scaled" else 1.0
    k = np.arange(2 * L + 1)
    s2 = np.empty(2 * L)
    s2[0::2], s2[1::2] = u_attn * scale, u_ffn * scale
    stream = v0 + np.concatenate([[0.0], np.cumsum(s2)])
    return pd.DataFrame({
        "k": k, "sublayer": ["embed"] + ["attn", "ffn"] * L, "n_layers": L, "stream_var": stream,
        "branch_var": np.concatenate([[np.nan], s2]),
        "cov_se": np.concatenate([[np.nan], np.full(2 * L, 1e-6)]),
    })  # fmt: skip


def test_depth_prediction_equal_branches():
    rng = np.random.default_rng(0)
    short = _synthetic("scaled", 4, 1 + 0.01 * rng.standard_normal(4), 2 + 0.01 * rng.standard_normal(4))
    long = _synthetic("scaled", 20, 1 + 0.01 * rng.standard_normal(20), 2 + 0.01 * rng.standard_normal(20))
    p = depth_prediction(short, long, "scaled")
    assert p["ratio_theory"] == pytest.approx(1.0)
    assert abs(p["ratio"] / p["ratio_theory"] - 1) < 2.58 * p["se_rel"]
    naive = depth_prediction(_synthetic("naive", 4, np.ones(4), np.ones(4)),
                             _synthetic("naive", 20, np.ones(20), np.ones(20)), "naive")  # fmt: skip
    assert naive["ratio"] == pytest.approx((1 + 40) / (1 + 8)) == pytest.approx(naive["ratio_theory"])


def test_depth_prediction_fails_on_a_drift():
    rng = np.random.default_rng(1)
    short = _synthetic("scaled", 4, 1 + 0.01 * rng.standard_normal(4), np.ones(4))
    long = _synthetic("scaled", 20, 1.5 + 0.01 * rng.standard_normal(20), np.ones(20))  # attention +50%
    p = depth_prediction(short, long, "scaled")
    assert p["drift"]["attn"] == pytest.approx(0.5, abs=0.02)
    assert abs(p["ratio"] / p["ratio_theory"] - 1) > 2.58 * p["se_rel"]


def test_gradient_criteria_can_fail():
    """Pre-norm falling below the top fails; post-norm is judged from k = 1 on and at the
    first norm separately, so a first norm that matches its x50 cannot carry a depth
    profile that does not match the norms' product (here halved where 1 is predicted)."""
    pre = pd.DataFrame({"norm_position": "pre", "k": [0, 1, 2], "stream_grad_rel": [0.5, 0.9, 1.0]})
    first = 50 * (64 / 62) ** 0.5  # each token divided by its own rms (see post_norm_rows)
    post = pd.DataFrame({"norm_position": "post", "k": [0, 1, 2], "stream_grad_rel": [0.5 * first, 0.5, 1.0],
                         "pred_identity_gain": [50.0, 1.0, 1.0]})  # fmt: skip
    rows = gradient_rows(pd.DataFrame(), pd.concat([pre, post]), n_tokens=256, alpha=0.01, d_model=64)
    assert [r["passed"] for r in rows] == [False, False, True]
    assert "k = 1..2" in rows[1]["claim"] and rows[1]["measured"] == 0.5
    assert rows[2]["theory"] == pytest.approx(first)


def test_post_norm_pass_says_what_it_rests_on():
    """With small branches the norms' product from k = 1 is ~1: the row passes on the
    mechanism and its caveat says that nothing attenuates at this sigma."""
    post = pd.DataFrame({"norm_position": "post", "k": [0, 1, 2], "stream_grad_rel": [50.5, 0.995, 1.0],
                         "pred_identity_gain": [50.0, 1.001, 1.0]})  # fmt: skip
    rows = gradient_rows(pd.DataFrame(), post, n_tokens=256, alpha=0.01, d_model=64)
    assert rows[0]["passed"] and "attenuates nothing" in rows[0]["caveat"]


def test_params_rows_exact():
    rows, frames = params_rows(ModelConfig(d_model=32, n_heads=2, vocab_size=100, bias=True))
    assert all(r["passed"] for r in rows)
    assert rows[0]["measured"] == 262_144_000
    assert rows[2]["theory"] == 100 * 32 + 100  # untied head biases go too
    assert set(frames) == {"params", "params_summary", "ffn"}


def test_run_check_frames():
    res = run_check(
        ModelConfig(n_layers=2, d_model=32, n_heads=2, vocab_size=64), InitConfig(seed=1),
        RunConfig(batch=2, seq_len=16, device="cpu"), deep_layers=4, head_dims=(8, 16),
    )  # fmt: skip
    check = res["check"]
    assert list(check.columns) == CHECK_COLUMNS
    assert list(dict.fromkeys(check["item"])) == list(ITEMS)
    # (a) at both depths; (c) post-norm from k = 1 and at its first norm
    assert len(check) == 4 + 2 + 3 + 3 + 2 * 2
    assert check["passed"].dtype == bool
    var = res["variance"]
    assert set(zip(var["branch"], var["init"], var["n_layers"], strict=True)) == {
        ("model", "naive", 2), ("gaussian", "naive", 2), ("model", "scaled", 2),
        ("model", "naive", 4), ("model", "scaled", 4),
    }  # fmt: skip
    assert {"stream_grads", "grad_summary", "params", "params_summary", "ffn", "attention_scale"} <= set(
        res.frames
    )


def test_cli_writes_everything(tmp_path):
    out = tmp_path / "check"
    result = runner.invoke(app, ["check", *TINY, "--out", str(out)])
    check = pd.read_csv(out / "check.csv")
    assert list(check.columns) == CHECK_COLUMNS
    # exit code follows the verdict, whatever it is
    assert result.exit_code == (0 if check["passed"].all() else 1), result.output
    for name in ("check.md", "config.json", "variance.csv", "stream_grads.csv", "attention_scale.csv",
                 "check_variance.png", "stream_grads.png", "params.png", "attention_scale.png"):  # fmt: skip
        assert (out / name).exists(), name
    md = (out / "check.md").read_text()
    for item in ITEMS:
        assert f"## ({item})" in md
    for link in ("check_variance.png", "stream_grads.png", "params.png", "attention_scale.png"):
        assert f"]({link})" in md
    assert "claims pass" in result.output or "claims FAIL" in result.output


def test_cli_failing_claims_exit_1_after_writing(tmp_path, monkeypatch):
    figures_built_not_saved(monkeypatch)  # (test_cli_writes_everything renders check's PNGs)
    # alpha 0.999: every tolerance shrinks to ~0.001 SE, so measured claims fail
    out = tmp_path / "strict"
    result = runner.invoke(app, ["check", *TINY, "--alpha", "0.999", "--out", str(out)])
    assert result.exit_code == 1
    check = pd.read_csv(out / "check.csv")
    assert not check["passed"].all()
    assert check.loc[check["item"] == "d", "passed"].all()  # exact counts pass at any level
    assert (out / "check.md").exists() and "FAIL" in (out / "check.md").read_text()


def test_an_overflowing_model_run_fails_the_exact_case_without_running_it(tmp_path, monkeypatch):
    """Found by the run fuzz: at --sigma 1e30 with LayerNorm the model run's mean s^2 is
    NaN, and the Gaussian control was then configured with it, which ended the check in
    a one-line error about --branch-var, an option `check` does not take. The control
    cannot run; its claim is written, not passed, and says why; everything else is kept."""
    figures_built_not_saved(monkeypatch)
    out = tmp_path / "run"
    result = runner.invoke(app, ["check", *TINY, "--norm", "layernorm", "--sigma", "1e30", "--out", str(out)])
    assert result.exit_code == 1, result.output  # claims fail; not a usage error (2)
    assert "--branch-var" not in result.output
    check = pd.read_csv(out / "check.csv")
    exact = check[check["claim"].str.startswith("Gaussian branches")]
    assert len(exact) == 1 and not exact["passed"].iloc[0]
    assert math.isnan(exact["measured"].iloc[0]) and "not run" in exact["detail"].iloc[0]
    variance = pd.read_csv(out / "variance.csv")
    assert "gaussian" not in set(variance["branch"])  # (only the runs that were made)
    assert set(variance["n_layers"]) == {2, 4}
    # its figure's panels are empty: the notes under it say why
    from tinit.results.report_check import plot_check_variance

    fig = plot_check_variance(variance, 0.01)
    notes = "".join(t.get_text() for t in fig.texts if t.get_gid() == "footnote")
    assert "Gaussian branches (the law's exact case): not run" in notes
    assert "naive init, L=4: no finite v_k / v0" in notes and "no finite z" in notes


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--alpha", "0"], "--alpha"),
        (["--alpha", "1.5"], "--alpha"),
        (["--head-dims", "0,8"], "--head-dims"),
        (["--head-dims", "x"], "--head-dims"),
        (["--head-dims", "7"], "--head-dims"),  # RoPE needs even head sizes
        (["--deep-layers", "0"], "--deep-layers"),
        (["--heads", "3"], "--heads"),
    ],
)
def test_cli_bad_input(tmp_path, args, option):
    out = tmp_path / "bad"
    result = runner.invoke(app, ["check", *TINY, *args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and option in lines[0]


def test_check_options_chosen_by_the_check_are_not_offered():
    result = runner.invoke(app, ["check", "--post-norm"])
    assert result.exit_code == 2
    assert "No such option: --post-norm" in result.output


def test_background_shape_is_fresh():
    # item (d) must not inherit a d_ff resolved for another width
    _, frames = params_rows(ModelConfig(d_model=64, n_heads=4))
    ffn = frames["ffn"].set_index("variant")
    assert ffn.loc["this model's FFN", "d_ff"] == 5504  # 8 * 2048 / 3 rounded up to 64


def test_cli_and_library_check_the_same_defaults(monkeypatch):
    """`tinit check` with no options calls run_check with exactly the library's defaults
    (one place: CHECK_MODEL, CHECK_RUN, ...), so both give the same verdicts."""
    import inspect

    import tinit.experiments.measure.check as exp_check
    from tinit.experiments.measure.check import CHECK_MODEL, CHECK_RUN

    seen = {}

    def fake(model, init, run, deep_layers, head_dims, alpha, progress=None, on_partial=None):
        seen.update(model=model, init=init, run=run, deep_layers=deep_layers, head_dims=head_dims,
                    alpha=alpha)  # fmt: skip
        raise ConfigError("seed", "stop here")

    monkeypatch.setattr(exp_check, "run_check", fake)  # the command imports it when it runs
    CliRunner().invoke(app, ["check", "--device", "cpu"])
    defaults = {k: p.default for k, p in inspect.signature(run_check).parameters.items()}
    assert seen["model"] == ModelConfig(**CHECK_MODEL) and seen["init"] == InitConfig()
    assert (seen["run"].batch, seen["run"].seq_len) == (CHECK_RUN["batch"], CHECK_RUN["seq_len"])
    assert seen["deep_layers"] == defaults["deep_layers"] and seen["alpha"] == defaults["alpha"]
    assert tuple(seen["head_dims"]) == tuple(defaults["head_dims"])


def test_every_claim_passes_at_the_shipped_defaults():
    """run_check() at its defaults (seed 0): every claim passes. The naive row of (b)
    is the known drift (docs/reference/check.md): its error is positive, the attention branch growing with
    depth, but within tolerance at this seed."""
    from tinit.experiments.measure.check import CHECK_RUN

    res = run_check(run=RunConfig(device="cpu", **CHECK_RUN))
    check = res["check"]
    assert check["passed"].all(), check.loc[~check["passed"], ["item", "claim", "detail"]].to_string()
    naive_b = check[(check["item"] == "b") & check["claim"].str.startswith("naive")]
    assert len(naive_b) == 1 and naive_b["rel_err"].item() > 0
    # (a) is tested at both depths the check runs; at L=80 the law is 19% above the
    # measured v_2L (the figure shows it), a pass only because the standard error is wide,
    # which its caveat says
    law = check[(check["item"] == "a") & check["claim"].str.startswith("v_2L")]
    assert list(law["claim"].str.extract(r"L=(\d+)")[0]) == ["12", "80"]
    deep = law.iloc[1]
    assert deep["rel_err"] < -0.1 and "not rejected" in deep["caveat"]
