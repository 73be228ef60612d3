"""Guards `tinit depth-sweep`: the --layers grammar and its one-line errors, that every
(L, seed) row is exactly the `variance` (and `grad-norms`) measurement of that depth and
seed, the least-squares fit (against numpy, and recovering the Gaussian-branch model's
slope 2*S2 within its standard error), the seed statistics and the transfer check, and
the CLI's files, columns (as documented in docs/reference/depth-sweep.md) and plot."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import TINY, assert_one_line_error, figures_built_not_saved
from typer.testing import CliRunner

from tinit import run_depth_sweep
from tinit.cli import app
from tinit.experiments.configs import parse_layers
from tinit.experiments.measure.depth_fits import fit_line
from tinit.experiments.measure.depth_sweep import (
    FIT_COLUMNS,
    SUMMARY_COLUMNS,
    SWEEP_COLUMNS,
)
from tinit.experiments.measure.grad_norms import run_grad_norms
from tinit.experiments.measure.variance import run_variance
from tinit.experiments.result import IncompleteRun
from tinit.model.config import ConfigError, InitConfig, ModelConfig, RunConfig

runner = CliRunner()
PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "depth-sweep.md"


# --- the --layers grammar ---------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("1,2,4,12,80", [1, 2, 4, 12, 80]),
        (" 80, 12 ,4", [4, 12, 80]),  # whitespace ignored, sorted
        ("12:96:12", [12, 24, 36, 48, 60, 72, 84, 96]),  # stop included
        ("12:100:12", [12, 24, 36, 48, 60, 72, 84, 96]),  # stop not on the grid
        ("3:6", [3, 4, 5, 6]),
        ("4:128:x2", [4, 8, 16, 32, 64, 128]),
        ("1:100:x3", [1, 3, 9, 27, 81]),
        ("1,2,4:64:x4", [1, 2, 4, 16, 64]),
        ("7", [7]),
        ("5:5", [5]),
    ],
)
def test_parse_layers(spec, want):
    assert parse_layers(spec) == want


def test_parse_layers_accepts_ints():
    assert parse_layers([8, 2]) == [2, 8]
    assert parse_layers(3) == [3]


@pytest.mark.parametrize(
    "spec",
    ["0", "-3", "a,b", "", " ", "1,,2", "2.5", "1,2,2", "1:4,4", "8:4", "0:4", "1:8:x1", "1:8:0", "1:8:x",
     "1:2:3:4", "x2"],
)  # fmt: skip
def test_parse_layers_rejects(spec):
    with pytest.raises(ConfigError) as info:
        parse_layers(spec)
    assert info.value.field == "n_layers"


@pytest.mark.parametrize("spec", [[], [0], [2, -1], [1.5]])
def test_parse_layers_rejects_bad_lists(spec):
    with pytest.raises(ConfigError):
        parse_layers(spec)


@pytest.mark.parametrize(
    "args",
    [["--layers", "0"], ["--layers", "-3"], ["--layers=-3"], ["--layers", "a,b"], ["--layers", ""],
     ["--layers", "1,2,2"], ["--layers", "8:4"], ["--seeds", "0"]],
)  # fmt: skip
def test_cli_bad_input_is_one_line_exit_2(tmp_path, args):
    res = runner.invoke(app, ["depth-sweep", *TINY, "--out", str(tmp_path / "x"), *args])
    assert_one_line_error(res, args[0].split("=")[0], tmp_path / "x")


# --- the sweep is the variance measurement, point by point ---------------------------


def test_rows_equal_separate_variance_runs(tiny_model, tiny_run):
    init = InitConfig(seed=5)
    res = run_depth_sweep(tiny_model, init, tiny_run, layers="1,3", seeds=2, grads=False)
    sweep = res["depth_sweep"]
    assert list(sweep.columns) == SWEEP_COLUMNS
    assert len(sweep) == 4 * 2 * 2  # configurations x depths x seeds
    assert sorted(sweep["seed"].unique()) == [5, 6]
    cols = [c for c in SWEEP_COLUMNS if c != "grad_ratio"]
    for L in (1, 3):
        for seed in (5, 6):
            alone = run_variance(
                ModelConfig(**{**tiny_model.to_dict(), "n_layers": L}), InitConfig(seed=seed), tiny_run
            )["summary"]
            got = sweep[(sweep["n_layers"] == L) & (sweep["seed"] == seed)]
            merged = got.merge(alone, on=["init", "norm_position"], suffixes=("", "_alone"))
            assert len(merged) == 4
            for c in cols[4:]:
                assert (merged[c].to_numpy() == merged[f"{c}_alone"].to_numpy()).all(), c
    assert sweep["grad_ratio"].isna().all()


def test_seeds_redraw_tokens_too(tiny_model, tiny_run):
    """With a data seed set, seed i draws its tokens from data_seed + i."""
    run = RunConfig(**{**tiny_run.to_dict(), "data_seed": 40})
    res = run_depth_sweep(tiny_model, InitConfig(seed=2), run, layers=[2], seeds=2, inits=("naive",),
                          norm_positions=("pre",), grads=False)  # fmt: skip
    alone = run_variance(
        ModelConfig(**{**tiny_model.to_dict(), "n_layers": 2}),
        InitConfig(seed=3),
        RunConfig(**{**tiny_run.to_dict(), "data_seed": 41}),
        ("naive",),
        ("pre",),
    )["summary"]
    row = res["depth_sweep"].iloc[1]
    assert row["seed"] == 3
    assert row["v_final"] == alone["v_final"].iloc[0] and row["v0"] == alone["v0"].iloc[0]


def test_grad_ratio_is_the_grad_norms_measurement(tiny_model, tiny_run):
    res = run_depth_sweep(tiny_model, InitConfig(seed=1), tiny_run, layers="1,3", seeds=1)
    sweep = res["depth_sweep"]
    assert (sweep.loc[sweep["n_layers"] == 1, "grad_ratio"] == 1.0).all()  # first layer is the last
    g = run_grad_norms(ModelConfig(**{**tiny_model.to_dict(), "n_layers": 3}), InitConfig(seed=1), tiny_run)
    merged = sweep[sweep["n_layers"] == 3].merge(g["summary"], on=["init", "norm_position"])
    assert len(merged) == 4
    assert (merged["grad_ratio"].to_numpy() == merged["down_ratio_first_last"].to_numpy()).all()


def test_incomplete_run_keeps_finished_points(tiny_model, tiny_run, monkeypatch):
    import tinit.experiments.measure.depth_sweep as ds

    real, calls = ds.run_variance, {"n": 0}

    def flaky(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 9:  # the first point at L = 3 (a point per depth, scheme and placement)
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(ds, "run_variance", flaky)
    with pytest.raises(IncompleteRun) as info:
        run_depth_sweep(tiny_model, None, tiny_run, layers="1,2,3", seeds=1, grads=False)
    res = info.value.result
    assert not res.complete and "L=3" in str(info.value)
    assert sorted(res["depth_sweep"]["n_layers"].unique()) == [1, 2]
    assert len(res["depth_sweep_fit"]) == 4


# --- statistics ----------------------------------------------------------------


def test_fit_line_matches_numpy():
    rng = np.random.default_rng(0)
    x = np.repeat([1.0, 2, 4, 8, 12], 3)
    y = 0.3 + 0.05 * x + rng.normal(0, 0.02, x.size)
    fit = fit_line(x, y)
    (slope, intercept), cov = np.polyfit(x, y, 1, cov=True)
    assert fit["slope"] == pytest.approx(slope, rel=1e-12)
    assert fit["intercept"] == pytest.approx(intercept, rel=1e-12)
    assert fit["slope_se"] == pytest.approx(math.sqrt(cov[0, 0]), rel=1e-9)
    assert fit["intercept_se"] == pytest.approx(math.sqrt(cov[1, 1]), rel=1e-9)
    assert fit["r2"] == pytest.approx(np.corrcoef(x, y)[0, 1] ** 2, rel=1e-12)
    exact = fit_line([1, 2, 3], [1, 3, 5])
    assert exact["slope"] == pytest.approx(2) and exact["r2"] == pytest.approx(1)
    assert exact["slope_se"] < 1e-12
    assert math.isnan(fit_line([2, 2], [1, 3])["slope"]) and math.isnan(fit_line([1, 2], [1, 3])["slope_se"])


def test_summary_is_mean_and_standard_error_over_seeds(tiny_model, tiny_run):
    res = run_depth_sweep(tiny_model, None, tiny_run, layers="1,2", seeds=3, grads=False)
    sweep, summary = res["depth_sweep"], res["depth_sweep_summary"]
    assert list(summary.columns) == SUMMARY_COLUMNS
    assert len(summary) == 4 * 2 and (summary["n_seeds"] == 3).all()
    for r in summary.itertuples(index=False):
        d = sweep[(sweep["init"] == r.init) & (sweep["norm_position"] == r.norm_position)
                  & (sweep["n_layers"] == r.n_layers)]  # fmt: skip
        v = d["v_final"].to_numpy()
        assert r.v_final_mean == pytest.approx(v.mean(), rel=1e-12)
        assert r.v_final_se == pytest.approx(v.std(ddof=1) / math.sqrt(3), rel=1e-9)


def test_transfer_check_and_theory_columns(tiny_model, tiny_run):
    res = run_depth_sweep(tiny_model, None, tiny_run, layers="1,2,4", seeds=2, inits=("naive", "scaled"),
                          norm_positions=("pre",), grads=False)  # fmt: skip
    fit, summary = res["depth_sweep_fit"], res["depth_sweep_summary"]
    assert list(fit.columns) == FIT_COLUMNS
    for r in fit.itertuples(index=False):
        s = summary[summary["init"] == r.init].set_index("n_layers")
        assert r.ratio_max_min == pytest.approx(s.loc[4, "v_final_mean"] / s.loc[1, "v_final_mean"])
        limit = 2 * math.hypot(s.loc[4, "v_final_se"], s.loc[1, "v_final_se"])
        assert r.within_spread == (abs(s.loc[4, "v_final_mean"] - s.loc[1, "v_final_mean"]) <= limit)
    naive, scaled = fit.set_index("init").loc["naive"], fit.set_index("init").loc["scaled"]
    sweep = res["depth_sweep"]
    s2 = sweep.loc[sweep["init"] == "naive", "branch_var_mean"].mean()
    assert naive["theory_slope"] == pytest.approx(2 * s2, rel=1e-9)  # 2 mean(s^2)
    assert abs(scaled["theory_slope"]) < 1e-12 * scaled["theory_intercept"]  # depth-independent
    eq = (sweep.loc[sweep["init"] == "scaled", "branch_var_mean"] * 2 * sweep["n_layers"]).mean()
    assert scaled["theory_branch_var"] == pytest.approx(eq, rel=1e-9)  # the unscaled-equivalent s^2
    one = run_depth_sweep(tiny_model, None, tiny_run, layers="1,2", seeds=1, inits=("naive",),
                          norm_positions=("pre",), grads=False)["depth_sweep_fit"]  # fmt: skip
    assert one["within_spread"].iloc[0] is None and math.isnan(one["slope_se_seeds"].iloc[0])


def test_a_result_so_far_takes_a_transfer_reference_some_configurations_have_not_passed(tiny_model, tiny_run):
    """Points run in (L, seed, configuration) order, so the result written so far after
    naive/pre's deepest point holds scaled/pre only up to the reference depth: that
    configuration's transfer check takes the default rule on its own depths (the
    shallowest here), where building it raised the --transfer-from usage error and ended
    `tinit depth-sweep` at its defaults (reference 12, depths to 80) after 58 s, exit 2."""
    partial_fits = []

    def on_partial(build):
        partial_fits.append(build().frames["depth_sweep_fit"].set_index("init"))

    res = run_depth_sweep(tiny_model, None, tiny_run, layers="1,2,3", seeds=1, inits=("naive", "scaled"),
                          norm_positions=("pre",), grads=False, on_partial=on_partial,
                          transfer_from=2)  # fmt: skip
    assert len(partial_fits) == 6  # one result so far after each point
    part = partial_fits[4]  # naive at L 1, 2, 3; scaled at L 1, 2
    assert part.loc["naive", "transfer_from"] == 2 and part.loc["naive", "transfer_to"] == 3
    assert part.loc["scaled", "transfer_from"] == 1 and part.loc["scaled", "transfer_to"] == 2
    final = res["depth_sweep_fit"].set_index("init")
    assert (final["transfer_from"] == 2).all() and (final["transfer_to"] == 3).all()


def test_fit_recovers_gaussian_branch_slope():
    """Gaussian branches (the seed's exact law): E[v_2L] = v0 + 2L*S2, so the fitted
    slope must be 2*S2 within its standard error. The standard error is the spread of
    the 12 independent seeds' slopes (depths of one seed share their draws, so the OLS
    residuals are correlated and the OLS error understates it); with 11 degrees of
    freedom |t| > 3 has probability ~1.2% for a correct measurement."""
    S2, n_seeds = 0.5, 12
    cfg = ModelConfig(d_model=32, n_heads=2, vocab_size=64, max_seq_len=16, branch="gaussian", branch_var=S2)
    run = RunConfig(batch=2, seq_len=16, device="cpu")
    res = run_depth_sweep(cfg, InitConfig(seed=100), run, layers="1:6", seeds=n_seeds,
                          inits=("naive", "scaled"), norm_positions=("pre",), grads=False)  # fmt: skip
    for r in res["depth_sweep_fit"].itertuples(index=False):
        se = r.slope_se_seeds
        assert 0 < se < 0.03 * 2 * S2  # the test can tell a wrong law (e.g. L*S2) apart
        assert abs(r.slope - 2 * S2) < 3 * se, (r.slope, se)
        assert not r.depth_scaled  # Gaussian branches ignore the scheme: scaled grows too
        assert r.theory_slope == pytest.approx(2 * S2, rel=0.02)  # 2 mean(s^2), measured s^2


# --- the command -----------------------------------------------------------------


def test_cli_writes_documented_files(tmp_path, monkeypatch):
    # built, not rendered (the files are created empty): tests/test_reader_rules.py draws
    # depth-sweep's figure and holds it to the reader's rules; --format png,svg is written
    # for real by test_cli_variance.py::test_writes_csvs_plot_and_config and
    # test_attention_scale.py::test_cli_writes_csv_plot_and_config
    figures_built_not_saved(monkeypatch)
    out = tmp_path / "run"
    res = runner.invoke(app, ["depth-sweep", *TINY, "--layers", "1:4:x2", "--seeds", "2", "--pre-norm",
                              "--out", str(out), "--format", "png,svg"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().splitlines()[-1] == str(out)
    for name in ("depth_sweep.csv", "depth_sweep_summary.csv", "depth_sweep_fit.csv", "depth_sweep.png",
                 "depth_sweep.svg", "config.json"):  # fmt: skip
        assert (out / name).is_file(), name
    sweep = pd.read_csv(out / "depth_sweep.csv")
    assert list(sweep.columns) == SWEEP_COLUMNS and len(sweep) == 2 * 3 * 2
    assert set(sweep["norm_position"]) == {"pre"} and sorted(sweep["n_layers"].unique()) == [1, 2, 4]
    assert sweep["grad_ratio"].notna().all()
    assert list(pd.read_csv(out / "depth_sweep_summary.csv").columns) == SUMMARY_COLUMNS
    assert list(pd.read_csv(out / "depth_sweep_fit.csv").columns) == FIT_COLUMNS
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["complete"] is True and cfg["layers"] == [1, 2, 4]
    assert cfg["seeds"] == 2 and cfg["grads"] is True
    assert cfg["seed_values"] == [0, 1] and cfg["run"]["extra"]["layers"] == "1:4:x2"
    assert "transfers" in res.stdout and "naive/pre" in res.stdout


def test_cli_no_grads(tmp_path, monkeypatch):
    figures_built_not_saved(monkeypatch)  # (built, not rendered, as above)
    out = tmp_path / "run"
    res = runner.invoke(app, ["depth-sweep", *TINY, "--layers", "1,2", "--seeds", "1", "--no-grads",
                              "--init", "scaled", "--post-norm", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    sweep = pd.read_csv(out / "depth_sweep.csv")
    assert sweep["grad_ratio"].isna().all() and set(sweep["init"]) == {"scaled"}
    assert (out / "depth_sweep.png").is_file()


def test_reference_documents_every_column():
    section = PAGE.read_text()
    keys = {"init", "norm_position", "n_layers", "seed"}
    for col in {*SWEEP_COLUMNS, *SUMMARY_COLUMNS, *FIT_COLUMNS} - keys:
        if col.endswith(("_mean", "_se")) and not col.startswith(("v_final_min", "v_final_max")):
            continue  # documented as <q>_mean / <q>_se
        assert f"`{col}`" in section, col
    assert "<q>_mean" in section and "4:128:x2" in section and "12:96:12" in section
