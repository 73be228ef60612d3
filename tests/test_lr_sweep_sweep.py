"""Guards `tinit sweep lr-sweep`: one point per training run (scheme, depth, width, lr,
warmup, seed); the points' frames gather into the single-process run's CSVs byte for
byte (runs.csv and summary.csv less their wall-clock columns, which no two runs share),
on the local pool and on a real one-node SLURM cluster."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tinit.cli import app

runner = CliRunner()
ARGS = ["lr-sweep", "--init", "gpt2,mup", "--pre-norm", "--base-width", "16", "--d-model", "16,32",
        "--heads", "2", "--vocab", "16", "--seq-len", "8", "--batch", "2", "--layers", "1,2", "--steps", "3",
        "--seeds", "2", "--lr", "3e-3,1e-2,3e-2", "--probe-points", "2", "--eval-every", "3",
        "--device", "cpu"]  # fmt: skip
EXACT = ("train", "update_ratios", "variance_during_training", "lr_optimum", "lr_optimum_seeds", "lr_drift",
         "lr_drift_compare")  # fmt: skip
#: measured wall-clock: differs between any two runs of the same grid
TIMED = ("train_seconds", "tokens_per_s", "model_flops_per_s")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """`tinit lr-sweep` in this process (one thread, conftest): the CSVs to match."""
    out = tmp_path_factory.mktemp("ref") / "run"
    res = runner.invoke(app, [*ARGS, "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    return out


def _untimed(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    keep = [i for i, c in enumerate(header) if c not in TIMED]
    return [",".join(row.split(",")[i] for i in keep) for row in lines]


def same_csvs(a: Path, b: Path) -> None:
    for stem in EXACT:
        assert (a / f"{stem}.csv").read_bytes() == (b / f"{stem}.csv").read_bytes(), stem
    for stem in ("runs", "summary"):
        assert _untimed(a / f"{stem}.csv") == _untimed(b / f"{stem}.csv"), stem


def test_local_pool_gives_the_single_process_csvs(tmp_path, reference, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the workers' threads, as the reference's
    out = tmp_path / "run"
    res = runner.invoke(app, ["sweep", *ARGS, "--workers", "2", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    same_csvs(out, reference)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["complete"] is True and cfg["sweep"]["counts"]["done"] == 2 * 2 * 2 * 3 * 2
    assert "L1-d16-lr0.003-warmup3-seed0-gpt2-pre" in cfg["sweep"]["points"]  # default warmup cut to --steps
    for stem in ("lr_sweep", "lr_transfer", "loss_curves"):
        assert (out / f"{stem}.png").is_file(), stem


def test_slurm_gives_the_single_process_csvs(tmp_path, reference, slurm_cluster, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "run"
    args = ["sweep", *ARGS, "--executor", "slurm", "--points-per-job", "24", "--time", "5", "--out", str(out)]
    res = runner.invoke(app, [*args, "-q"])
    assert res.exit_code == 0, res.output
    same_csvs(out, reference)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["complete"] is True and cfg["sweep"]["counts"]["done"] == 48
    assert cfg["sweep"]["executor"] == "slurm" and len(cfg["sweep"]["job_ids"]) == 1
