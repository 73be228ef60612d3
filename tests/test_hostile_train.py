"""Issue 22, training commands: each case reproduced. Case 1: a repeated --lr or
--warmup was run twice and counted as seeds. Case 11: every run diverging broke a plot;
hostile --data files and sizes were numpy tracebacks or "out of memory". Case 12:
claims --deep 2 --shallow 2. Case 15: --vocab silently 256 for text data, no
claims.csv / lr_optimum.csv for what finished before a SIGTERM, entropy_floor written
nan for file data, claims offering --init-file it ignored."""

import json
import os
import signal

import numpy as np
import pandas as pd
import pytest
from helpers import TINY, assert_one_line_error, figures_built_not_saved
from typer.testing import CliRunner

from tinit.cli import app
from tinit.experiments.result import IncompleteRun, Stopped
from tinit.experiments.training.data import load_data
from tinit.experiments.training.grid import TrainGrid
from tinit.experiments.training.lr_sweep import run_lr_sweep
from tinit.experiments.training.train import run_specs
from tinit.experiments.training.trainer import RunSpec, TrainConfig
from tinit.model.config import ConfigError, InitConfig, ModelConfig, RunConfig

runner = CliRunner()
M = TINY  # the tiny model
QUICK = ["--steps", "3", "--eval-batches", "1", "--probe-points", "0"]


@pytest.fixture
def no_png(monkeypatch):
    """For the runs asserted on their CSVs and config.json: figures built, not rendered
    (test_every_run_diverging_still_draws_every_figure renders; test_reader_rules draws
    every command's figures)."""
    figures_built_not_saved(monkeypatch)


def config(out) -> dict:
    return json.loads((out / "config.json").read_text())


# --- case 1: repeated values are not seeds ----------------------------------------------


@pytest.mark.parametrize(
    ("args", "option"),
    [(["--lr", "1e-2,1e-2"], "--lr"), (["--lr", "1e-2,0.01"], "--lr"), (["--warmup", "3,3"], "--warmup")],
)
@pytest.mark.parametrize("command", ["train", "lr-sweep"])
def test_a_repeated_lr_or_warmup_is_refused(tmp_path, command, args, option):
    """`train --lr 1e-2,1e-2` ran the run twice and summarised it as "seeds 2", s.e. 0."""
    out = tmp_path / "run"
    res = runner.invoke(app, [command, *M, "--layers", "1", *QUICK, *args, "--out", str(out)])
    assert_one_line_error(res, option, out)
    assert "twice" in res.stderr


def test_run_specs_refuses_a_repeated_run():
    data = load_data("markov", vocab=32, seq_len=8, batch=2, seed=0, eval_batches=1)
    spec = RunSpec(ModelConfig(n_layers=1, d_model=16, n_heads=2, vocab_size=32), InitConfig(), 1e-2, 0)
    with pytest.raises(ConfigError, match="twice"):
        run_specs([spec, spec], TrainConfig(steps=1), data, RunConfig(device="cpu"))


# --- case 11: divergence, hostile data and sizes ----------------------------------------


def test_every_run_diverging_still_draws_every_figure(tmp_path):
    """--lr 3 diverges every run: final_vs_depth.png had no finite point and matplotlib
    failed on its log axis (no plot, config.json error null, a traceback)."""
    out = tmp_path / "run"
    res = runner.invoke(
        app,
        [
            "train",
            *M,
            "--layers",
            "2,4",  # two depths: final_vs_depth.png is drawn only then (lr 1 left L=4 converging)
            "--steps",
            "20",
            "--lr",
            "3",
            "--init",
            "naive",
            "--pre-norm",
            "--eval-batches",
            "1",
            "--out",
            str(out),
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    runs = pd.read_csv(out / "runs.csv")
    assert runs["diverged"].all()
    assert (out / "final_vs_depth.png").stat().st_size > 0 and (out / "loss_curves.png").is_file()
    assert config(out)["complete"] is True


def _npy(path, values, dtype=np.int64):
    np.save(path, np.asarray(values, dtype=dtype))
    return path


def _raw(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda d: _raw(d / "empty.txt", b""), "is empty"),
        (lambda d: _npy(d / "neg.npy", [-1, 3, 5, 2] * 100), "must be >= 0"),
        (lambda d: _npy(d / "obj.npy", ["a", "b"] * 100, object), "not a .npy array"),
        (lambda d: _raw(d / "fake.npy", b"hello world " * 100), "not a .npy array"),
        (lambda d: _npy(d / "words.npy", ["a", "b"] * 100, str), "1-D integer array"),
        (lambda d: _npy(d / "big.npy", [2**40, 3, 4] * 100), "parameters"),
    ],
)
def test_hostile_data_files_are_one_line_errors(tmp_path, make, words):
    """Each was a numpy traceback, an IndexError mid-run (negative ids, folder left with
    error null), or, for a token id of 2^40, "out of memory" after the run started."""
    path = make(tmp_path)
    out = tmp_path / "run"
    args = ["train", "--d-model", "16", "--heads", "2", "--seq-len", "8", "--batch", "2", "--layers", "1"]
    res = runner.invoke(app, [*args, *QUICK, "--data", str(path), "--out", str(out)])
    assert_one_line_error(res, "--data", out)
    assert words in res.stderr


@pytest.mark.parametrize(
    ("option", "value"),
    [("--vocab", "1000000000000"), ("--seq-len", "100000000000"), ("--batch", "100000000000")],
)
def test_sizes_whose_data_cannot_fit_are_one_line_errors(tmp_path, option, value):
    """numpy's ArrayMemoryError (29 TiB for the chain's tables, 60 GiB and 507 GiB of
    held-out windows) was a traceback; the need is computed before anything is allocated."""
    args = dict(zip(M[::2], M[1::2], strict=True))
    args[option] = value
    out = tmp_path / "run"
    flat = [x for kv in args.items() for x in kv]
    res = runner.invoke(app, ["train", *flat, "--layers", "1", *QUICK, "--out", str(out)])
    assert_one_line_error(res, option, out)
    assert "GiB" in res.stderr and "free" in res.stderr


# --- case 12: claims whose two sides are one configuration -------------------------------


@pytest.mark.parametrize(
    ("args", "option"), [(["--deep", "2", "--shallow", "2"], "--deep"), (["--warmup", "0"], "--warmup")]
)
def test_claims_with_equal_sides_are_refused(tmp_path, args, option):
    """--deep 2 --shallow 2 trained the same configuration twice and failed drawing
    (IndexError) after every run had finished; --warmup 0 compares a run with itself."""
    out = tmp_path / "run"
    res = runner.invoke(app, ["claims", *M, "--seeds", "2", *QUICK, *args, "--out", str(out)])
    assert_one_line_error(res, option, out)


# --- case 15 --------------------------------------------------------------------------


def _text(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 60)
    return path


def test_vocab_given_with_text_data_is_honoured_or_refused(tmp_path, no_png):
    """--vocab silently became 256 for text --data."""
    base = [
        "train",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--seq-len",
        "8",
        "--batch",
        "2",
        "--layers",
        "1",
        *QUICK,
        "--data",
        str(_text(tmp_path)),
    ]
    out = tmp_path / "small"
    assert_one_line_error(runner.invoke(app, [*base, "--vocab", "64", "--out", str(out)]), "--vocab", out)
    res = runner.invoke(app, [*base, "--vocab", "300", "--out", str(tmp_path / "big"), "-q"])
    assert res.exit_code == 0, res.output
    assert config(tmp_path / "big")["model"]["vocab_size"] == 300
    res = runner.invoke(app, [*base, "--out", str(tmp_path / "own"), "-q"])
    assert res.exit_code == 0, res.output
    assert config(tmp_path / "own")["model"]["vocab_size"] == 256


def test_file_data_has_no_entropy_floor_and_flags_nothing(tmp_path, no_png):
    """entropy_floor and gap_to_floor were written nan (and counted as non-finite) for
    data whose entropy rate nobody knows: they are not applicable, written empty."""
    out = tmp_path / "run"
    res = runner.invoke(
        app,
        [
            "train",
            "--d-model",
            "16",
            "--heads",
            "2",
            "--seq-len",
            "8",
            "--batch",
            "2",
            "--layers",
            "1",
            *QUICK,
            "--data",
            str(_text(tmp_path)),
            "--out",
            str(out),
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    header, row = (out / "summary.csv").read_text().splitlines()[:2]
    cells = dict(zip(header.split(","), row.split(","), strict=True))
    assert cells["entropy_floor"] == "" and cells["gap_to_floor"] == ""
    assert config(out)["non_finite_total"] == 0 and "Warning" not in res.stderr


@pytest.mark.parametrize("option", ["--init-file", "--norm-position", "--base-width", "--base-depth"])
def test_claims_does_not_offer_what_it_chooses_itself(tmp_path, option):
    """claims picks every scheme, placement and base size per claim: --init-file was
    accepted and ignored."""
    res = runner.invoke(app, ["claims", *M, option, "x", "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and f"No such option: {option}" in res.stderr
    assert option not in runner.invoke(app, ["claims", "--help"]).stdout


def test_sigterm_to_claims_writes_claims_csv_for_what_finished(tmp_path, monkeypatch):
    """After a SIGTERM, claims wrote its runs but no claims.csv: the claims whose runs
    all finished are judged and written, the run says it is incomplete, exit 1. The real
    command in process, the signal sent to this process as the fifth of its 18 runs
    starts (the two configurations of "post-norm needs warmup" done, two seeds each); a
    SIGTERM to a real `tinit` process is tests/test_run_promises.py's
    (test_sigterm_keeps_the_measured_depth_sweep_points) and test_checkpoint_cli.py's."""
    from tinit.experiments.training import train

    real, started = train.train_run, []

    def train_run(*args, **kwargs):
        started.append(1)
        if len(started) == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(train, "train_run", train_run)
    out = tmp_path / "run"
    args = ["claims", *M, "--seeds", "2", "--deep", "3", "--shallow", "1", "--steps", "3",
            "--eval-batches", "1", "--probe-points", "0", "-q", "--out", str(out)]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 1 and "stopped by SIGTERM" in res.stderr, res.output
    assert "Traceback" not in res.output and len(started) == 5
    doc = config(out)
    assert doc["complete"] is False and "stopped by SIGTERM" in doc["error"] and "plots" not in doc["error"]
    assert (out / "claims.png").is_file() and (out / "claims_deep_curves.png").is_file()
    claims = pd.read_csv(out / "claims.csv")
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 4 and list(claims["claim"]) == ["post-norm needs warmup"]
    judged = set(runs["configuration"])
    assert all(
        a in judged and (b in judged or pd.isna(b)) for a, b in zip(claims["a"], claims["b"], strict=True)
    )


def test_a_stopped_lr_sweep_keeps_the_optimum_of_each_finished_depth():
    """The depths whose every lr finished get their optimum (and the drift through them)
    in the partial result that a stop writes; the depth stopped part-way has none."""
    data = load_data("markov", vocab=32, seq_len=8, batch=2, seed=0, eval_batches=1)
    steps, calls = 3, []

    def progress(done, total):
        calls.append(done)
        if done == 4 * steps + 1:  # the 5th run's first step: depth 1 (4 lrs) is done
            raise Stopped("SIGTERM")

    model = ModelConfig(n_layers=2, d_model=16, n_heads=2, vocab_size=32)
    with pytest.raises(IncompleteRun) as info:
        train = TrainConfig(steps=steps, probe_points=0)
        grid = TrainGrid(model, InitConfig(), RunConfig(device="cpu"), train, data, ["scaled"], ["pre"],
                         [1, 2], [0], [1e-3, 3e-3, 1e-2, 3e-2])  # fmt: skip
        run_lr_sweep(grid, progress=progress)
    res = info.value.result
    assert res.complete is False and len(res["runs"]) == 4
    optimum = res["lr_optimum"]
    assert list(optimum["n_layers"]) == [1]
    best = res["summary"].sort_values("final_eval_loss_mean").iloc[0]
    assert optimum["best_lr_grid"].iloc[0] == pytest.approx(best["peak_lr"])
