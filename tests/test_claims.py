"""Guards the verdict machinery of the training claims (superiority and
non-inferiority against 2 standard errors), the lr-sweep optimum and its drift fit
on losses built by hand, and the three training commands end to end at tiny sizes
(run folder, files, one-line errors)."""

import json
import math
import re

import numpy as np
import pandas as pd
import pytest
from helpers import assert_one_line_error, figures_built_not_saved, final_result_only
from typer.testing import CliRunner

from tinit.cli import app
from tinit.experiments.training.claims import ClaimsConfig, evaluate_claims, non_inferiority, superiority
from tinit.experiments.training.lr_sweep import lr_drift, lr_optima
from tinit.model.config import ConfigError

runner = CliRunner()


def test_superiority_verdicts():
    # a = 1.0 +- 0.01, b = 1.5 +- 0.01: advantage 0.5 >> 2 SE
    a, b = np.array([0.99, 1.0, 1.01]), np.array([1.49, 1.5, 1.51])
    d, se, v = superiority(a, b, tol=0.02)
    assert (
        d == pytest.approx(0.5) and se == pytest.approx(math.sqrt(2) * 0.01 / math.sqrt(3)) and v == "holds"
    )
    assert superiority(b, a, tol=0.02)[2] == "fails"  # a significantly worse
    # equal means, tiny spread: the advantage is surely below tol -> fails
    assert superiority(a, a + 1e-4, tol=0.02)[2] == "fails"
    # equal means, spread wider than tol: cannot tell
    wide = np.array([0.8, 1.0, 1.2])
    assert superiority(wide, wide + 0.01, tol=0.02)[2] == "inconclusive"


def test_non_inferiority_verdicts():
    a = np.array([0.99, 1.0, 1.01])
    assert non_inferiority(a, a + 0.005, tol=0.02)[2] == "holds"
    assert non_inferiority(a + 0.2, a, tol=0.02)[2] == "fails"
    wide = np.array([0.8, 1.0, 1.2])
    assert non_inferiority(wide, wide, tol=0.02)[2] == "inconclusive"


def test_claims_config_validation():
    with pytest.raises(ConfigError) as e:
        ClaimsConfig(seeds=1)
    assert e.value.field == "seeds"
    with pytest.raises(ConfigError):
        ClaimsConfig(tol=0.0)


def _runs(names, finals, diverged, initial=4.0):
    rows = []
    for n, f, dv in zip(names, finals, diverged, strict=True):
        for x, di in zip(f, dv, strict=True):
            rows.append(
                {
                    "configuration": n,
                    "final_eval_loss": math.nan if di else x,
                    "diverged": di,
                    "initial_eval_loss": initial,
                    "params": 100,
                }
            )
    return pd.DataFrame(rows)


def test_diverged_runs_score_their_initial_loss_in_the_warmup_claim():
    names = [
        "post-norm deep, high lr, no warmup",
        "post-norm deep, high lr, warmup",
        "pre-norm deep, high lr, no warmup",
        "naive pre-norm deep",
        "scaled pre-norm deep",
        "scaled pre-norm shallow (baseline)",
        "LayerNorm shallow",
        "GELU FFN 4d shallow",
        "untied shallow",
    ]
    ok = [1.0, 1.01, 0.99]
    finals = [[0, 0, 0], ok, ok, [1.3, 1.31, 1.29], ok, ok, ok, [1.2, 1.21, 1.19], [1.1, 1.11, 1.09]]
    diverged = [[True] * 3] + [[False] * 3] * 8
    runs = _runs(names, finals, diverged)
    claims = evaluate_claims(
        runs, names, 3, floor=0.9, claims=ClaimsConfig(), params=dict.fromkeys(names, 100)
    )
    v = dict(zip(claims["claim"], claims["verdict"], strict=True))
    warm = claims.iloc[0]
    assert warm["a_diverged"] == 0 and warm["b_diverged"] == 3 and warm["b_mean"] == 4.0
    assert warm["difference"] == pytest.approx(3.0) and v["post-norm needs warmup"] == "holds"
    assert "initial loss" in warm["criterion"]
    # pre-norm: (4 - 1) / (4 - 0.9) closed, every seed
    assert v["pre-norm trains deep stacks"] == "holds"
    assert v["naive init fails with depth"] == "holds"
    assert v["depth-scaled init transfers"] == "holds"
    assert v["RMSNorm loses nothing"] == "holds"
    assert v["SwiGLU beats GELU at equal parameters"] == "holds"
    assert v["tying regularises small models"] == "holds"


def test_lr_optimum_is_the_parabola_vertex_and_drift_is_fitted():
    rows = []
    for L, c in ((2, -6.0), (4, -6.5), (8, -7.0)):  # log2 lr* = -5 - log2 L / 2
        for x in (-9.0, -8.0, -7.0, -6.0, -5.0, -4.0):
            rows.append(
                {
                    "init": "scaled",
                    "norm_position": "pre",
                    "n_layers": L,
                    "warmup": 10,
                    "peak_lr": 2**x,
                    "final_eval_loss_mean": 1.0 + (x - c) ** 2,
                    "diverged": 0,
                    "seeds": 1,
                }
            )
    opt = lr_optima(pd.DataFrame(rows))
    np.testing.assert_allclose(opt["log2_lr_opt"], [-6.0, -6.5, -7.0], atol=1e-9)
    assert opt["interior"].all()
    drift = lr_drift(opt)
    assert drift["slope"].iloc[0] == pytest.approx(-0.5) and drift["slope_se"].iloc[0] == pytest.approx(
        0, abs=1e-9
    )


TINY = [
    "--d-model",
    "16",
    "--heads",
    "2",
    "--vocab",
    "16",
    "--seq-len",
    "8",
    "--batch",
    "2",
    "--eval-batches",
    "1",
]


def test_train_command_writes_its_run_folder(tmp_path, monkeypatch):
    figures_built_not_saved(monkeypatch)  # (the figures are drawn by tests/test_reader_rules.py)
    final_result_only(monkeypatch)  # (what a finished run leaves: the partial results' tests are elsewhere)
    out = tmp_path / "run"
    res = runner.invoke(
        app,
        [
            "train",
            *TINY,
            "--layers",
            "1,2",
            "--steps",
            "4",
            "--eval-every",
            "2",
            "--init",
            "scaled",
            "--lr",
            "1e-3,1e-2",
            "--out",
            str(out),
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    for f in (
        "train.csv",
        "update_ratios.csv",
        "variance_during_training.csv",
        "runs.csv",
        "summary.csv",
        "loss_curves.png",
        "final_vs_depth.png",
        "config.json",
    ):
        assert (out / f).is_file(), f
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 2 * 2 * 2  # 2 norm positions x 2 depths x 2 lrs
    assert (out / "variance_during_training.png").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["data"]["source"] == "markov" and config["entropy_floor"] > 0
    # a run that trained normally: every empty cell is a declared not-applicable one, no nan
    assert config["non_finite_total"] == 0, config["non_finite"]
    assert not re.search(r"(^|,)nan(,|$)", (out / "train.csv").read_text(), re.M)


def test_lr_sweep_and_claims_commands(tmp_path, monkeypatch):
    figures_built_not_saved(monkeypatch)  # (the figures are drawn by tests/test_reader_rules.py)
    final_result_only(monkeypatch)  # (what a finished run leaves: the partial results' tests are elsewhere)
    out = tmp_path / "sweep"
    res = runner.invoke(
        app,
        [
            "lr-sweep",
            *TINY,
            "--layers",
            "1,2",
            "--steps",
            "3",
            "--pre-norm",
            "--lr",
            "1e-3,1e-2,1e-1",
            "--probe-points",
            "0",
            "--out",
            str(out),
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    files = {p.name for p in out.iterdir()}
    assert {"lr_optimum.csv", "lr_drift.csv", "lr_sweep.png", "loss_curves.png"} <= files
    assert "variance_during_training.csv" not in files  # --probe-points 0: no empty CSV
    out = tmp_path / "claims"
    res = runner.invoke(
        app,
        [
            "claims",
            *TINY,
            "--shallow",
            "1",
            "--deep",
            "2",
            "--seeds",
            "2",
            "--steps",
            "3",
            "--out",
            str(out),
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    claims = pd.read_csv(out / "claims.csv")
    assert len(claims) == 7 and set(claims["verdict"]) <= {"holds", "fails", "inconclusive"}
    md = (out / "claims.md").read_text()
    assert "claims.png" in md and all(c in md for c in claims["claim"])


@pytest.mark.parametrize(
    "args, option",
    [
        (["--lr", "x"], "--lr"),
        (["--warmup", "-1"], "--warmup"),
        (["--data", "/no/such/file"], "--data"),
        (["--vocab", "2", "--markov-k", "5"], "--markov-k"),
        (["--layers", "0"], "--layers"),
    ],
)
def test_bad_training_options_are_one_line_errors(tmp_path, args, option):
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", *TINY, "--steps", "1", *args, "--out", str(out)])
    assert_one_line_error(res, option, out)
