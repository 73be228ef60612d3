"""`tinit train --save-steps` and `tinit audit --checkpoint` end to end (issue 32): the
checkpoints in the run folder, listed in config.json and sized on the terminal; the
audit's files; bad input one line, exit 2, no run folder."""

import json

import pandas as pd
import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from tinit.cli import app

runner = CliRunner()
TINY = ["--layers", "2", "--d-model", "16", "--heads", "2", "--seq-len", "8", "--batch", "2", "--vocab", "16",
        "--eval-batches", "1", "--init", "naive", "--pre-norm"]  # fmt: skip


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "train"
    res = runner.invoke(app, ["train", *TINY, "--steps", "4", "--save-steps", "0,final", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "Checkpoints: 2 (1 run x steps 0,4)" in res.output
    return out


def test_train_writes_and_lists_checkpoints(run_folder):
    config = json.loads((run_folder / "config.json").read_text())
    assert config["complete"] and config["save_steps"] == [0, 4]
    files = sorted(
        p.relative_to(run_folder).as_posix() for p in (run_folder / "checkpoints").rglob("*") if p.is_file()
    )
    listed = sorted(x for e in config["checkpoints"] for x in (e["file"], e["json"]))
    assert files == listed and len(files) == 4


def test_audit_checkpoint_writes_its_files(run_folder, tmp_path):
    out = tmp_path / "audit"
    res = runner.invoke(app, ["audit", "--checkpoint", str(run_folder), "--seq-len", "8", "--batch", "2",
                              "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    config = json.loads((out / "config.json").read_text())
    assert config["complete"] and config["init_source"] == {"naive-pre-L2-d16-lr0.01-w4-seed0": "checkpoint"}
    for name in ("variance.csv", "summary.csv", "drift.csv", "checkpoints.csv", "stream_over_steps.png",
                 "drift.png", "spectral_norm.png"):  # fmt: skip
        assert (out / name).is_file(), name
    variance = pd.read_csv(out / "variance.csv")
    assert sorted(variance["step"].unique()) == [0, 4] and len(variance) == 2 * (2 * 2 + 1)
    drift = pd.read_csv(out / "drift.csv")
    assert (drift.loc[drift["step"] == 0, "rel_change"] == 0).all()
    assert (drift.loc[(drift["step"] == 4) & (drift["role"] == "down"), "rel_change"] > 0).all()


def test_bad_input_one_line(run_folder, tmp_path):
    out = tmp_path / "x"
    res = runner.invoke(app, ["train", *TINY, "--steps", "4", "--save-steps", "0,5", "--out", str(out)])
    assert_one_line_error(res, "--save-steps", out)
    res = runner.invoke(app, ["audit", "--checkpoint", str(tmp_path / "none"), "--out", str(out)])
    assert_one_line_error(res, "--checkpoint", out)
    broken = tmp_path / "broken"
    broken.mkdir()
    for p in (run_folder / "checkpoints").rglob("step-000004.*"):
        data = p.read_bytes()
        (broken / p.name).write_bytes(data[: len(data) // 2] if p.suffix == ".safetensors" else data)
    res = runner.invoke(app, ["audit", "--checkpoint", str(broken), "--out", str(out)])
    assert_one_line_error(res, "--checkpoint", out)
    assert "step-000004.safetensors" in res.stderr and "truncated or corrupt" in res.stderr
    res = runner.invoke(
        app, ["audit", "--checkpoint", str(run_folder), "--sites", "a:b:c", "--out", str(out)]
    )
    assert_one_line_error(res, "--sites", out)
    res = runner.invoke(app, ["audit", "--hf", "llama", "--data", "stdlib", "--out", str(out)])
    assert_one_line_error(res, "--data", out)
