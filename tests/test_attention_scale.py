"""Guards `tinit attention-scale`: the logit variance against d_h and 1 (unit q, k) and
against d_h (d sigma^2)^2 (the model's own W_Q, W_K at init), within Z standard errors
estimated from independent units; that the model path uses the block's real weights,
mask and softmax; the softmax statistics against a brute-force reference; and the CLI's
files, columns and bad-input errors."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import assert_one_line_error, figures_built_not_saved, reference_page
from typer.testing import CliRunner

from tinit import theory
from tinit.cli import app
from tinit.experiments.device import make_tokens
from tinit.experiments.measure.attention_scale import (
    COLUMNS,
    attention_weights,
    logit_stats,
    model_qk,
    run_attention_scale,
    visible_mask,
)
from tinit.model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from tinit.model.transformer import Transformer, build_block

#: Two-sided tolerance in standard errors: a fixed-seed test that fails by chance
#: with probability < 1e-6 per comparison.
Z = 5.0
RUN = RunConfig(batch=4, seq_len=32, device="cpu")


def frame(model: ModelConfig, init: InitConfig | None = None, dims=(8, 32), run=RUN, **kw) -> pd.DataFrame:
    return run_attention_scale(model, init or InitConfig(seed=1), run, head_dims=dims, **kw)[
        "attention_scale"
    ]


def within_se(df: pd.DataFrame) -> None:
    for r in df.itertuples(index=False):
        # the check is only meaningful when the standard error is small against the value
        assert 0 < r.logit_var_se < 0.1 * r.pred_logit_var, r
        z = (r.logit_var - r.pred_logit_var) / r.logit_var_se
        assert abs(z) < Z, (
            f"{r.input} d_h={r.head_dim} scaled={r.scaled}: {r.logit_var} vs {r.pred_logit_var}"
        )


def test_unit_inputs_have_variance_d_h_unscaled_and_1_scaled():
    df = frame(ModelConfig(n_heads=4), inputs=("unit",))
    assert list(df.columns) == COLUMNS
    assert len(df) == 2 * 2
    within_se(df)
    unscaled = df[~df["scaled"]]
    assert np.allclose(unscaled["pred_logit_var"], unscaled["head_dim"])
    assert np.allclose(df.loc[df["scaled"], "pred_logit_var"], 1.0)
    # the measured unscaled variance grows with d_h: 32 vs 8 is a 4x effect
    v = unscaled.set_index("head_dim")["logit_var"]
    assert 3.0 < v[32] / v[8] < 5.0


@pytest.mark.parametrize("sigma", [0.02, 0.05, "inv-sqrt-d"])
def test_model_inputs_follow_d_h_times_d_sigma2_squared(sigma):
    # 16 independent heads per d_h: the standard error comes from their spread, so z is
    # Student-t with 15 degrees of freedom (P(|t| > 5) ~ 2e-4; over 40 seeds x 3 sigmas
    # the largest |z| seen was 4.5)
    model = ModelConfig(n_heads=16, vocab_size=256)
    df = frame(model, InitConfig(sigma=sigma, seed=2), dims=(8, 16), inputs=("model",))
    within_se(df)
    for r in df.itertuples(index=False):
        d = 16 * r.head_dim
        assert r.d_model == d
        s = 1 / math.sqrt(d) if sigma == "inv-sqrt-d" else sigma
        want = r.head_dim * (d * s**2) ** 2 / (r.head_dim if r.scaled else 1)
        assert r.pred_logit_var == pytest.approx(want)
        assert r.pred_qk_var == pytest.approx(d * s**2)
        # RMSNorm'd stream: mean square 1 up to eps / mean(x^2) of the embedding
        assert abs(r.input_ms - 1) < 1e-6 / s**2 * 2 + 1e-5
    if sigma == "inv-sqrt-d":  # d sigma^2 = 1: the textbook case
        assert np.allclose(df["pred_logit_var"], np.where(df["scaled"], 1.0, df["head_dim"]))


def test_norm_eps_lowers_the_input_and_the_corrected_theory_follows():
    """eps = mean(x0^2) halves the normalised stream's mean square: the logit variance
    drops 4x below d_h (d sigma^2)^2, and theory x input_ms^2 accounts for it."""
    model = ModelConfig(n_heads=16, vocab_size=256, norm_eps=0.02**2)
    df = frame(model, InitConfig(sigma=0.02, seed=4), dims=(8,), inputs=("model",))
    for r in df.itertuples(index=False):
        assert abs(r.input_ms - 0.5) < 0.05  # the embedding's mean square is 0.02^2 +- sampling
        assert r.pred_logit_var_ms == pytest.approx(r.pred_logit_var * r.input_ms**2)
        assert r.rel_err < -0.6
        assert abs(r.logit_var - r.pred_logit_var_ms) < Z * r.logit_var_se


def test_scaled_is_unscaled_over_d_h_and_sharper_without_scale():
    df = frame(ModelConfig(n_heads=4), inputs=("unit",), dims=(4, 16, 64))
    for _, g in df.groupby(["input", "head_dim"]):
        u, s = g[~g["scaled"]].iloc[0], g[g["scaled"]].iloc[0]
        assert s["logit_var"] == pytest.approx(u["logit_var"] / u["head_dim"], rel=1e-6)
        assert s["entropy_rel"] > u["entropy_rel"] and s["max_weight"] < u["max_weight"]
    u = df[~df["scaled"]].sort_values("head_dim")
    assert np.all(np.diff(u["entropy_rel"]) < 0) and np.all(np.diff(u["max_weight"]) > 0)
    assert ((df["entropy_rel"] > 0) & (df["entropy_rel"] <= 1)).all()
    assert ((df["max_weight"] >= df["max_weight_uniform"]) & (df["max_weight"] <= 1)).all()


def test_softmax_statistics_match_a_brute_force_reference():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 7, 5, generator=gen), torch.randn(2, 3, 7, 5, generator=gen)
    for causal in (True, False):
        s = logit_stats(q, k, 0.7, causal, torch.float64)
        ents, maxes, visible = [], [], {}
        for b in range(2):
            for h in range(3):
                z = (q[b, h] @ k[b, h].T).double().numpy() * 0.7
                vis = [z[i, : i + 1] if causal else z[i] for i in range(7)]
                visible[b, h] = np.concatenate(vis)
                for row in vis:
                    if len(row) < 2:
                        continue
                    p = np.exp(row - row.max())
                    p /= p.sum()
                    ents.append(-(p * np.log(p)).sum() / np.log(len(row)))
                    maxes.append(p.max())
        pooled = np.concatenate(list(visible.values()))
        ms = np.array([[((visible[b, h] - pooled.mean()) ** 2).mean() for h in range(3)] for b in range(2)])
        assert np.allclose(s["var_bh"].numpy(), ms)
        assert float(s["var_bh"].mean()) == pytest.approx(pooled.var())
        assert float(s["entropy_rel"]) == pytest.approx(np.mean(ents))
        assert float(s["max_weight"]) == pytest.approx(np.mean(maxes))
        n = np.arange(2, 8) if causal else np.full(7, 7)
        assert float(s["max_weight_uniform"]) == pytest.approx(np.mean(1 / n))


@pytest.mark.parametrize("positions", ["rope", "none", "learned"])
def test_model_path_uses_the_blocks_weights_mask_and_softmax(positions):
    """q, k of the model input, softmaxed with our mask and 1/sqrt(d_h), reproduce the
    block's own attention output: the statistics are about the real model."""
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, vocab_size=64, max_seq_len=16, positions=positions)
    init, run = InitConfig(seed=5), RunConfig(batch=2, seq_len=16, device="cpu")
    q, k, _ = model_qk(cfg, init, run, seed=5, device="cpu", dtype=torch.float32)
    net = Transformer(cfg, init)
    block = build_block(cfg, init, 0)
    with torch.no_grad():
        x = block.norm1(net.embed_tokens(make_tokens(cfg, run, 5, "cpu")))
        want = block.attn(x, net.rope)
        p, _ = attention_weights(
            q @ k.transpose(-1, -2) / math.sqrt(cfg.head_dim), visible_mask(16, True, "cpu")
        )
        v = block.attn.v(x).view(2, 16, 4, 8).transpose(1, 2)
        got = block.attn.o((p @ v).transpose(1, 2).reshape(2, 16, 32))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_bidirectional_mask_sees_every_key():
    df = frame(ModelConfig(n_heads=2, attention="bidirectional"), dims=(8,), inputs=("unit",))
    assert np.allclose(df["max_weight_uniform"], 1 / RUN.seq_len)


def test_library_rejects_bad_head_dims():
    with pytest.raises(ConfigError):
        run_attention_scale(ModelConfig(), head_dims=(15,), run=RUN)  # odd with RoPE
    with pytest.raises(ConfigError):
        run_attention_scale(ModelConfig(), head_dims=(), run=RUN)
    with pytest.raises(ConfigError):
        run_attention_scale(ModelConfig(), head_dims=(8,), run=RUN, inputs=("gaussian",))


def test_theory_closed_forms():
    assert theory.logit_var_unit(64, scaled=False) == 64 and theory.logit_var_unit(64, scaled=True) == 1
    assert theory.logit_var_model(64, 256, 0.02, scaled=False) == pytest.approx(64 * (256 * 4e-4) ** 2)
    assert theory.logit_var_model(64, 4096, 1 / 64, scaled=False) == pytest.approx(64)


# --- CLI ---

runner = CliRunner()
TINY = ["--heads", "2", "--seq-len", "16", "--batch", "2", "--vocab", "64", "--head-dims", "8,16"]


def invoke(*args):
    return runner.invoke(app, ["attention-scale", *TINY, *args])


def test_cli_writes_csv_plot_and_config(tmp_path):
    out = tmp_path / "run"
    res = invoke("--out", str(out), "--format", "png,svg")
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().splitlines()[-1] == str(out)
    for name in ("attention_scale.csv", "attention_scale.png", "attention_scale.svg", "config.json"):
        assert (out / name).is_file(), name
    df = pd.read_csv(out / "attention_scale.csv")
    assert list(df.columns) == COLUMNS
    assert len(df) == 2 * 2 * 2  # inputs x head dims x scaled
    assert set(df.loc[df["input"] == "model", "d_model"]) == {16, 32}
    assert '"head_dims": [\n    8,\n    16\n  ]' in (out / "config.json").read_text()


def test_cli_odd_head_dims_without_rope(tmp_path, monkeypatch):
    """Odd head dims (refused with RoPE, which rotates pairs) run without it: unit inputs
    at d_h = 3 and 5 against d_h unscaled and 1 scaled, within Z standard errors (a 1/d_h
    scaling, 1/3 and 1/5 against 1, lies more than Z away)."""
    figures_built_not_saved(monkeypatch)  # (the CSV; test_cli_writes_csv_plot_and_config draws)
    out = tmp_path / "r"
    res = invoke("--out", str(out), "--head-dims", "3,5", "--positions", "none", "-q")
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out / "attention_scale.csv")
    assert sorted(set(df["head_dim"])) == [3, 5] and len(df) == 2 * 2 * 2
    unit = df[df["input"] == "unit"]
    assert np.allclose(unit["pred_logit_var"], np.where(unit["scaled"], 1.0, unit["head_dim"]))
    z = (unit["logit_var"] - unit["pred_logit_var"]) / unit["logit_var_se"]  # se ~11% at this size
    assert (z.abs() < Z).all(), unit.to_string()
    assert set(df.loc[df["input"] == "model", "d_model"]) == {6, 10}  # heads x d_h


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--head-dims", "8,x"], "--head-dims"),
        (["--head-dims", "0"], "--head-dims"),
        (["--head-dims", ""], "--head-dims"),
        (["--head-dims", "7"], "--head-dims"),  # odd with RoPE
        (["--heads", "0"], "--heads"),
        (["--sigma", "-1"], "--sigma"),
        (["--layers", "4"], "--layers"),  # does not apply here
    ],
)
def test_cli_bad_input_is_one_line_exit_2(tmp_path, args, option):
    res = invoke("--out", str(tmp_path / "x"), *args)
    assert_one_line_error(res, option, tmp_path / "x")


def test_readme_documents_every_column():
    section = reference_page("attention-scale")
    for col in COLUMNS:
        assert f"`{col}`" in section, col
