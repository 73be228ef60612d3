"""Guards `tinit sweep coord-check`: one point per training run (scheme, width, depth,
seed); the points' frames, written and read back, gather into the single-process run's
CSVs byte for byte, on the local pool and on a real one-node SLURM cluster."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tinit.cli import app
from tinit.experiments.points import coord_check_plan
from tinit.experiments.training.coord_check import CoordConfig, run_coord_check
from tinit.model.config import InitConfig, ModelConfig, RunConfig
from tinit.results.rundir import format_frame
from tinit.sweep.folder import point_dir, read_point_frames
from tinit.sweep.worker import run_one

runner = CliRunner()
SIZE = ["--heads", "2", "--seq-len", "8", "--batch", "2", "--vocab", "32", "--device", "cpu"]
ARGS = ["coord-check", "--init", "mup", "--d-model", "16,32", "--layers", "1,2", "--seeds", "2",
        "--steps", "1", *SIZE]  # fmt: skip
STEMS = ("coord_check", "coord_check_fit")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """`tinit coord-check` in this process (one thread, conftest): the CSVs to match."""
    out = tmp_path_factory.mktemp("ref") / "run"
    res = runner.invoke(app, [*ARGS, "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    return out


def same_csvs(a: Path, b: Path) -> None:
    for stem in STEMS:
        assert (a / f"{stem}.csv").read_bytes() == (b / f"{stem}.csv").read_bytes(), stem


def test_points_written_and_gathered_equal_the_run(tmp_path):
    model = ModelConfig(n_layers=2, d_model=16, n_heads=2, vocab_size=32, max_seq_len=8)
    init, run, coord = InitConfig(seed=3), RunConfig(batch=2, seq_len=8, device="cpu"), CoordConfig(steps=2)
    args = (model, init, run, coord, ("gpt2", "mup"), ("pre",), [16, 32], [1, 2])
    plan = coord_check_plan(*args, seeds=2)
    want = run_coord_check(*args, seeds=2)
    assert len(plan.points) == 2 * 2 * 2 * 2
    assert plan.points[0].name == "d16-L1-seed3-gpt2-pre"
    for p in reversed(plan.points):  # any order: each point stands alone
        run_one(p, point_dir(tmp_path, p.name), "coord-check")
    got = plan.gather({p.name: read_point_frames(tmp_path, p.name) for p in plan.points})
    assert set(got) == set(want.frames) == set(STEMS)
    for stem in STEMS:  # through the CSVs each point wrote, as the run folder writes them
        rules = plan.not_applicable.get(stem)
        a = format_frame(got[stem], rules).to_csv(index=False)
        assert a == format_frame(want.frames[stem], want.not_applicable.get(stem)).to_csv(index=False), stem


def test_local_pool_gives_the_single_process_csvs(tmp_path, reference, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the workers' threads, as the reference's
    out = tmp_path / "run"
    res = runner.invoke(app, ["sweep", *ARGS, "--workers", "2", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    same_csvs(out, reference)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["complete"] is True and cfg["sweep"]["counts"]["done"] == 8
    assert (out / "coord_check.png").is_file() and (out / "coord_check_depth.png").is_file()


def test_slurm_gives_the_single_process_csvs(tmp_path, reference, slurm_cluster, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "run"
    args = ["sweep", *ARGS, "--executor", "slurm", "--points-per-job", "4", "--time", "5", "--out", str(out)]
    res = runner.invoke(app, [*args, "-q"])
    assert res.exit_code == 0, res.output
    same_csvs(out, reference)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["complete"] is True and cfg["sweep"]["counts"]["done"] == 8
    assert cfg["sweep"]["executor"] == "slurm" and len(cfg["sweep"]["job_ids"]) == 1
