"""Guards `tinit variance` end to end through the CLI: the files and CSV columns a
run writes, the run-folder rules (new folder, never overwrite), config.json, and
bad input as a one-line error with exit code 2 and no traceback."""

import json

import pandas as pd
import pytest
import torch
from helpers import assert_one_line_error, figures_built_not_saved, tiny, validation_only
from typer.testing import CliRunner

from tinit.cli import app
from tinit.experiments.measure.variance import RUN_SUMMARY_COLUMNS, RUN_VARIANCE_COLUMNS

runner = CliRunner()
TINY = tiny(2)  # the tiny model at 2 layers


def invoke(*args):
    return runner.invoke(app, ["variance", *TINY, *args])


@pytest.fixture
def no_png(monkeypatch):
    """For the tests that read a run's CSVs and config.json: its figure built, not rendered
    (test_writes_csvs_plot_and_config renders variance's PNG and SVG)."""
    figures_built_not_saved(monkeypatch)


def test_writes_csvs_plot_and_config(tmp_path):
    out = tmp_path / "run"
    res = invoke("--out", str(out), "--format", "png,svg")
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().splitlines()[-1] == str(out)  # the folder is printed last
    for name in ("variance.csv", "summary.csv", "variance.png", "variance.svg", "config.json"):
        assert (out / name).is_file(), name
    v = pd.read_csv(out / "variance.csv")
    assert list(v.columns) == RUN_VARIANCE_COLUMNS
    assert len(v) == 4 * 5
    assert list(pd.read_csv(out / "summary.csv").columns) == RUN_SUMMARY_COLUMNS
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["complete"] is True
    assert cfg["model"]["n_layers"] == 2 and cfg["model"]["d_ff"] == 64
    assert cfg["torch_version"] == torch.__version__
    assert cfg["run"]["dtype"] == "float32" and cfg["device"] == "cpu"
    assert {"tinit_version", "device_name", "git_commit", "sigma_resolved", "seconds"} <= set(cfg)


def test_default_run_folder_is_new_each_time(tmp_path, monkeypatch, no_png):
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as mp:  # the first run claims its folder and stops there
        validation_only(mp)
        a = invoke("-q")
    assert a.exit_code == 0, a.output
    (first,) = (tmp_path / "results" / "variance").iterdir()
    assert (first / "config.json").is_file()  # claimed, and kept
    b = invoke("-q")
    assert b.exit_code == 0, b.output
    pb = b.stdout.strip()
    assert pb.startswith("results/variance/") and tmp_path / pb != first
    assert (tmp_path / pb / "variance.csv").is_file()


def test_out_never_overwrites(tmp_path, no_png):
    out = tmp_path / "run"
    assert invoke("--out", str(out)).exit_code == 0
    before = (out / "variance.csv").read_bytes()
    res = invoke("--out", str(out), "--seed", "9")
    assert res.exit_code == 2
    assert "--out" in res.stderr and "already exists" in res.stderr
    assert (out / "variance.csv").read_bytes() == before


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--pre-norm"], None),
        (["--post-norm", "--init", "scaled"], None),
    ],
)
def test_restricting_flags(tmp_path, no_png, args, option):
    out = tmp_path / "r"
    res = invoke("--out", str(out), *args)
    assert res.exit_code == 0, res.output
    v = pd.read_csv(out / "variance.csv")
    want_pos = {"pre"} if "--pre-norm" in args else {"post"}
    assert set(v["norm_position"]) == want_pos
    assert set(v["init"]) == ({"scaled"} if "scaled" in args else {"naive", "scaled"})


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--layers", "0"], "--layers"),
        (["--layers", "-3"], "--layers"),
        (["--heads", "3"], "--heads"),
        (["--norm", "batchnorm"], "--norm"),
        (["--ffn", "tanh"], "--ffn"),
        (["--init", "deepnorm"], "--init"),
        (["--sigma", "-1"], "--sigma"),
        (["--sigma", "big"], "--sigma"),
        (["--format", "jpg"], "--format"),
        (["--dtype", "float16"], "--dtype"),
        (["--batch", "0"], "--batch"),
        (["--mf-draws", "-1"], "--mf-draws"),
        (["--mf-draws", "10001"], "--mf-draws"),
        (["--theory-only", "--mf-draws", "0"], "--mf-draws"),
        # the prediction's 16 T x T Grams per sequence: 2 x 16 x 1e10 x 8 bytes, refused before
        (["--theory-only", "--seq-len", "100000"], "--seq-len"),
        (["--seq-len", "100000", "--batch", "1", "--layers", "1"], "--seq-len"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, args, option):
    res = invoke("--out", str(tmp_path / "x"), *args)
    assert_one_line_error(res, option, tmp_path / "x")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_one_line_exit_2(tmp_path):
    res = invoke("--device", "cuda", "--out", str(tmp_path / "x"))
    assert res.exit_code == 2
    assert res.stderr.strip().count("\n") == 0 and "--device" in res.stderr and "CUDA" in res.stderr


def test_unwritable_out_is_one_line_exit_2(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    res = invoke("--out", str(blocker / "run"))
    assert res.exit_code == 2
    assert res.stderr.strip().count("\n") == 0 and "--out" in res.stderr


def test_help_everywhere():
    for args in (["-h"], ["variance", "-h"], ["variance", "--help"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 0 and "Usage" in res.stdout


def test_help_shows_the_default_run_folder_pattern():
    """Rich help once swallowed <placeholders> whole: the --out default read 'results//-'."""
    res = runner.invoke(app, ["variance", "--help"], env={"COLUMNS": "200"})
    assert "results/COMMAND/TIMESTAMP-ID" in res.stdout and "results//" not in res.stdout


def test_out_of_memory_keeps_what_was_measured(tmp_path, monkeypatch, no_png):
    """A failure part-way writes the finished configurations, marks the run
    incomplete, and exits 1 with a clear message."""
    import tinit.experiments.measure.variance as variance

    real = variance.measure_stream
    calls = {"n": 0}

    def flaky(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(*a, **kw)

    monkeypatch.setattr(variance, "measure_stream", flaky)
    out = tmp_path / "r"
    res = invoke("--out", str(out))
    assert res.exit_code == 1
    assert "out of memory" in res.stderr and "Traceback" not in res.output
    v = pd.read_csv(out / "variance.csv")
    assert len(v.groupby(["init", "norm_position"])) == 2
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["complete"] is False and "out of memory" in cfg["error"]


def test_theory_only_builds_no_model_and_writes_the_prediction(tmp_path, monkeypatch):
    """--theory-only: no Transformer is made, variance.csv and summary.csv have every
    measured cell empty and the prediction's filled, the figure is drawn, config.json
    records the prediction's draws."""
    import tinit.experiments.measure.variance as variance

    def refuse(*a, **k):
        raise AssertionError("--theory-only built a model")

    monkeypatch.setattr(variance, "Transformer", refuse)
    out = tmp_path / "t"
    res = invoke("--theory-only", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert "Large-width prediction" in res.stdout and "theory-only" in res.stdout
    v = pd.read_csv(out / "variance.csv")
    assert list(v.columns) == RUN_VARIANCE_COLUMNS and len(v) == 4 * 5
    assert v[["stream_var", "branch_var", "cos_sim", "pred_cumulative"]].isna().all().all()
    assert v["mf_stream_var"].notna().all() and v["mf_branch_var"].isna().sum() == 4  # (k = 0)
    s = pd.read_csv(out / "summary.csv")
    assert s["v_final"].isna().all() and s["rel_err_mf"].isna().all() and s["mf_v_final"].notna().all()
    assert (out / "variance.png").is_file()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["mf"]["draws"] == 4 and cfg["mf"]["theory_only"] is True and cfg["complete"] is True
    assert cfg["non_finite_total"] == 0  # the empty cells are not applicable, not non-finite


def test_no_prediction_leaves_its_columns_empty(tmp_path, no_png):
    out = tmp_path / "n"
    res = invoke("--mf-draws", "0", "--out", str(out))
    assert res.exit_code == 0, res.output
    v = pd.read_csv(out / "variance.csv")
    assert v[["mf_stream_var", "mf_branch_var", "mf_cos_sim"]].isna().all().all()
    assert v["stream_var"].notna().all()
    assert "Large-width prediction" not in res.stdout
    assert json.loads((out / "config.json").read_text())["non_finite_total"] == 0
