"""Guards `tinit norms`: the behaviour checks (both norms invariant to x -> a x, only
LayerNorm to x -> x + c, equal on zero-mean input) pass for every implementation and
dtype and can fail; the saved-for-backward measurement counts what autograd keeps; the
timing tables have the right rows, columns and positive finite times (speeds are not
asserted: machines are noisy); a compile failure is recorded, not raised; and the CLI's
files, columns and bad-input errors."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import assert_one_line_error, reference_page
from typer.testing import CliRunner

from tinit import theory
from tinit.cli import app
from tinit.experiments.bench import norms as norms_mod
from tinit.experiments.bench.norms import (
    BEHAVIOUR_COLUMNS,
    RATIO_COLUMNS,
    TIMING_COLUMNS,
    TOL_ULPS,
    behaviour_checks,
    implementations,
    run_norms,
    saved_for_backward,
)
from tinit.model.config import ConfigError, RunConfig

CPU = RunConfig(device="cpu")
FAST = {"repeats": 2, "warmup": 1, "min_sample_s": 1e-4}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_behaviour_checks_pass_for_every_implementation(dtype):
    rows = behaviour_checks(implementations(compile=False), 16, 128, "cpu", dtype, seed=0)
    df = pd.DataFrame(rows, columns=BEHAVIOUR_COLUMNS)
    assert df["passed"].all(), df[~df["passed"]]
    eps = torch.finfo(dtype).eps
    assert (df["tolerance"] < 8 * TOL_ULPS * eps).all()  # tied to the dtype: |y| is a few units
    keyed = df.set_index(["check", "norm", "impl"])
    for impl in ("eager", "functional"):
        for norm in ("rmsnorm", "layernorm"):
            assert keyed.loc[("scale", norm, impl), "expected"] == "invariant"
        assert keyed.loc[("shift", "layernorm", impl), "expected"] == "invariant"
        # the shift moves RMSNorm's output by order one, far beyond rounding
        assert keyed.loc[("shift", "rmsnorm", impl), "max_abs_dev"] > 0.3
        assert keyed.loc[("nonzero_mean", "both", impl), "max_abs_dev"] > 0.3
        assert keyed.loc[("zero_mean", "both", impl), "expected"] == "agree"


def test_behaviour_checks_can_fail():
    """An implementation that is not scale invariant, and a LayerNorm that does not
    centre, are caught."""

    def not_normalised(x, w, b, eps):
        return x * w

    def uncentred_ln(x, w, b, eps):
        return norms_mod.eager_rms_norm(x, w, None, eps) + b

    impls = {("rmsnorm", "bad"): not_normalised, ("layernorm", "bad"): uncentred_ln}
    df = pd.DataFrame(behaviour_checks(impls, 16, 64, "cpu", torch.float32, 0))
    failed = set(df.loc[~df["passed"], ["check", "norm"]].itertuples(index=False, name=None))
    assert failed == {("scale", "rmsnorm"), ("shift", "layernorm"), ("zero_mean", "both")}


def test_saved_for_backward_counts_what_autograd_keeps():
    x = torch.randn(8, 16, requires_grad=True)
    w = torch.randn(16, requires_grad=True)
    # x * w saves its two inputs: nothing beyond them
    s = saved_for_backward(lambda x, w, b, eps: x * w, x, w, None, 0.0)
    assert s == {"saved_bytes": 8 * 16 * 4 + 16 * 4, "saved_bytes_extra": 0, "saved_tensors": 2}
    # exp saves its output, a new (8, 16) float32 tensor
    s = saved_for_backward(lambda x, w, b, eps: torch.exp(x), x, w, None, 0.0)
    assert s["saved_bytes_extra"] == 8 * 16 * 4
    # F.layer_norm keeps x, gain, bias and the per-row mean and 1/std
    b = torch.zeros(16, requires_grad=True)
    s = saved_for_backward(norms_mod.functional_layer_norm, x, w, b, 1e-6)
    assert s["saved_bytes_extra"] == 2 * 8 * 4


def test_timing_tables_have_every_row_and_positive_times():
    res = run_norms(CPU, rows=(8, 32), d_models=(16, 64), **FAST)
    t, r = res["norms_timing"], res["norms_ratio"]
    assert list(t.columns) == TIMING_COLUMNS and list(r.columns) == RATIO_COLUMNS
    assert list(res["norms_behaviour"].columns) == BEHAVIOUR_COLUMNS
    assert len(t) == 4 * 2 * 2 * 2  # sizes x norms x impls (no compile on the CPU) x passes
    assert set(t["impl"]) == {"eager", "functional"} and t["available"].all()
    for col in ("time_ms", "time_ms_min", "time_ms_max"):
        assert np.isfinite(t[col]).all() and (t[col] > 0).all()
    assert (t["time_ms_min"] <= t["time_ms"]).all() and (t["time_ms"] <= t["time_ms_max"]).all()
    assert (t["calls_per_sample"] >= 1).all() and (t["repeats"] == 2).all()
    assert (t["params"] == np.where(t["norm"] == "rmsnorm", t["d_model"], 2 * t["d_model"])).all()
    fb, fw = t[t["pass"] == "forward_backward"], t[t["pass"] == "forward"]
    assert (fb["saved_bytes"] >= fb["input_bytes"]).all() and fw["saved_bytes"].isna().all()
    # eager LayerNorm keeps the centred input as well as the normalised one
    eager = fb[fb["impl"] == "eager"].set_index(["norm", "rows", "d_model"])["saved_bytes_extra"]
    assert (eager.loc["layernorm"] > eager.loc["rmsnorm"]).all()
    assert len(r) == 4 * 2 * 2
    key = ["impl", "pass", "rows", "d_model"]
    ms = t.set_index([*key, "norm"])["time_ms"]
    for row in r.itertuples(index=False):
        k = (row.impl, row[1], row.rows, row.d_model)
        assert row.time_ratio == pytest.approx(ms[(*k, "layernorm")] / ms[(*k, "rmsnorm")])
        assert row.params_saved == row.d_model == theory.norm_params("layernorm", row.d_model) / 2
    assert res.meta["compile"] is False and res.meta["timer"] == "time.perf_counter"


def test_compile_failure_is_recorded_as_unavailable(monkeypatch):
    def broken_compile(fn, **kw):
        def call(*a, **k):
            raise RuntimeError("inductor exploded\nsecond line")

        return call

    monkeypatch.setattr(torch, "compile", broken_compile)
    res = run_norms(CPU, rows=(8,), d_models=(16, 32), compile=True, **FAST)
    t = res["norms_timing"]
    comp = t[t["impl"] == "compiled"]
    assert len(comp) == 2 * 2 * 2 and not comp["available"].any()
    assert (comp["error"] == "RuntimeError: inductor exploded").all() and comp["time_ms"].isna().all()
    assert t.loc[t["impl"] != "compiled", "available"].all()
    assert set(res["norms_ratio"]["impl"]) == {"eager", "functional"}
    assert "compiled" not in set(res["norms_behaviour"]["impl"])
    assert res.meta["unavailable"] == {"compiled": "RuntimeError: inductor exploded"}


def test_threads_are_restored_and_bad_arguments_rejected():
    before = torch.get_num_threads()
    run_norms(CPU, rows=(4,), d_models=(8,), threads=1, **FAST)
    assert torch.get_num_threads() == before
    for kw in ({"rows": ()}, {"rows": (0,)}, {"d_models": (8, -1)}, {"repeats": 0}, {"threads": 0}):
        with pytest.raises(ConfigError):
            run_norms(CPU, **{"rows": (4,), "d_models": (8,), **FAST, **kw})


def test_norm_params():
    assert theory.norm_params("rmsnorm", 4096) == 4096 and theory.norm_params("layernorm", 4096) == 8192


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_timing_with_events_and_compile():
    res = run_norms(RunConfig(device="cuda"), rows=(256,), d_models=(256,), repeats=3)
    t = res["norms_timing"]
    assert res.meta["timer"] == "cuda events" and res.meta["compile"] is True
    ok = t[t["available"]]
    assert set(ok["impl"]) >= {"eager", "functional"} and (ok["time_ms"] > 0).all()
    assert res["norms_behaviour"]["passed"].all()


# --- CLI ---

runner = CliRunner()
TINY = ["--rows", "8", "--d-model", "16,32", "--repeats", "2", "--warmup", "0"]


def invoke(*args):
    return runner.invoke(app, ["norms", *TINY, *args])


def test_cli_writes_csvs_plot_and_config(tmp_path):
    out = tmp_path / "run"
    res = invoke("--out", str(out), "--format", "png,pdf")
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().splitlines()[-1] == str(out)
    names = (
        "norms_behaviour.csv",
        "norms_timing.csv",
        "norms_ratio.csv",
        "norms.png",
        "norms.pdf",
        "config.json",
    )
    for name in names:
        assert (out / name).is_file(), name
    t = pd.read_csv(out / "norms_timing.csv")
    assert list(t.columns) == TIMING_COLUMNS and len(t) == 2 * 2 * 2 * 2
    assert list(pd.read_csv(out / "norms_ratio.csv").columns) == RATIO_COLUMNS
    b = pd.read_csv(out / "norms_behaviour.csv")
    assert list(b.columns) == BEHAVIOUR_COLUMNS and b["passed"].all()
    assert math.isfinite(t["time_ms"].sum())


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--rows", "0"], "--rows"),
        (["--rows", "8,a"], "--rows"),
        (["--d-model", "-4"], "--d-model"),
        (["--d-model", ""], "--d-model"),
        (["--repeats", "0"], "--repeats"),
        (["--threads", "0"], "--threads"),
        (["--dtype", "float16"], "--dtype"),
        (["--layers", "4"], "--layers"),  # model options do not apply
        (["--heads", "4"], "--heads"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(tmp_path, args, option):
    res = invoke("--out", str(tmp_path / "x"), *args)
    assert_one_line_error(res, option, tmp_path / "x")


def test_readme_documents_every_column():
    section = reference_page("norms")
    for col in {*BEHAVIOUR_COLUMNS, *TIMING_COLUMNS, *RATIO_COLUMNS}:
        assert f"`{col}`" in section, col
