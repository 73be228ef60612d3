"""lr-sweep's width and depth transfer: per-seed optima, the drift's mean and standard
error over seeds, the verdict's criterion and the comparison of schemes, on synthetic
loss curves whose optimum is known in closed form."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from tinit.criteria import LR_DRIFT_TOL
from tinit.experiments.training.lr_sweep import analyse, drift_compare, lr_drift, lr_optima, verdict

LOG2_LRS = (-9.0, -8.0, -7.0, -6.0, -5.0, -4.0, -3.0)


def runs_frame(drift_width: dict[str, list[float]], depth_drift: float = 0.0) -> pd.DataFrame:
    """Runs whose loss is 1 + (log2 lr - c)^2 with c = -6 + s_seed log2(d/32) +
    depth_drift log2(L/2): each seed's width drift is exactly s_seed."""
    rows = []
    for init, slopes in drift_width.items():
        for seed, s in enumerate(slopes):
            for L in (2, 4):
                for d in (32, 64, 128):
                    c = -6.0 + s * math.log2(d / 32) + depth_drift * math.log2(L / 2)
                    for x in LOG2_LRS:
                        rows.append({"init": init, "norm_position": "pre", "n_layers": L, "d_model": d,
                                     "warmup": 10, "seed": seed, "peak_lr": 2**x,
                                     "final_eval_loss": 1.0 + (x - c) ** 2})  # fmt: skip
    return pd.DataFrame(rows)


def test_per_seed_optimum_is_the_vertex():
    opt = lr_optima(runs_frame({"a": [-0.5, -0.7]}), "final_eval_loss", seed=True)
    # seed 1 at d = 128: c = -6 - 0.7 * 2 = -7.4
    row = opt[(opt["seed"] == 1) & (opt["d_model"] == 128) & (opt["n_layers"] == 2)].iloc[0]
    assert row["log2_lr_opt"] == pytest.approx(-7.4) and row["interior"]


def test_width_drift_is_the_mean_of_seed_slopes_with_their_se():
    slopes = [-0.9, -1.1, -1.0]
    drift = lr_drift(lr_optima(runs_frame({"sp": slopes}), "final_eval_loss", seed=True))
    w = drift[(drift["axis"] == "width") & (drift["n_layers"] == 2)].iloc[0]
    assert w["slope"] == pytest.approx(-1.0)
    assert w["slope_se"] == pytest.approx(np.std(slopes, ddof=1) / math.sqrt(3))
    assert w["se_method"] == "seeds" and w["dof"] == 2
    # t(0.975, 2) = 4.303 (tables)
    assert w["ci_high"] - w["slope"] == pytest.approx(4.303 * w["slope_se"], rel=1e-3)
    assert w["verdict"] == "drifts"
    d = drift[(drift["axis"] == "depth") & (drift["d_model"] == 64)].iloc[0]
    assert d["slope"] == pytest.approx(0.0, abs=1e-9) and d["verdict"] == "transfers"


def test_verdict_criterion():
    assert verdict(0.1, -0.2, 0.4) == "transfers"
    assert verdict(0.1, -0.2, 0.6) == "not resolved"  # too wide to tell
    assert verdict(-0.6, -0.9, -0.3) == "drifts"
    assert verdict(-0.6, -1.3, 0.1) == "not resolved"  # interval includes 0
    assert verdict(LR_DRIFT_TOL - 0.01, 0.1, 0.4) == "transfers"
    assert verdict(0.0, math.nan, math.nan) == "not resolved"


def test_edge_optimum_is_not_resolved():
    """An optimum at the grid's edge (not bracketed) may lie beyond it: no verdict."""
    frame = runs_frame({"a": [-2.0, -2.1]})  # c = -10.x at d = 128: below the grid
    drift = lr_drift(lr_optima(frame, "final_eval_loss", seed=True))
    w = drift[drift["axis"] == "width"].iloc[0]
    assert w["at_edge"] > 0 and w["verdict"] == "not resolved" and "bracketed" in w["note"]


def test_comparison_names_the_scheme_that_moves_less():
    frame = runs_frame({"gpt2": [-0.9, -1.1, -1.0], "mup": [0.05, -0.05, 0.0]})
    out = analyse(frame.rename(columns={"final_eval_loss": "final_eval_loss_mean"}).drop(columns="seed")
                  .drop_duplicates(["init", "n_layers", "d_model", "peak_lr"]), frame)  # fmt: skip
    cmp = out["lr_drift_compare"]
    w = cmp[(cmp["axis"] == "width") & (cmp["n_layers"] == 2)].iloc[0]
    assert (w["init_a"], w["init_b"]) == ("gpt2", "mup")
    assert w["difference"] == pytest.approx(-1.0) and w["verdict"] == "mup moves less"
    d = cmp[cmp["axis"] == "depth"].iloc[0]
    assert d["verdict"] == "not resolved"  # neither moves with depth: no difference to resolve


def test_one_seed_uses_the_regression_se():
    drift = lr_drift(lr_optima(runs_frame({"a": [-0.5]}), "final_eval_loss", seed=True))
    w = drift[drift["axis"] == "width"].iloc[0]
    assert w["seeds"] == 1 and w["se_method"] == "regression" and w["slope_se"] == pytest.approx(0, abs=1e-9)


def test_compare_without_se_is_not_resolved():
    drift = lr_drift(lr_optima(runs_frame({"a": [-0.5], "b": [0.0]}).query("d_model != 128"),
                               "final_eval_loss", seed=True))  # fmt: skip
    cmp = drift_compare(drift)
    assert (cmp["verdict"] == "not resolved").all()
