"""`tinit train --save-steps` and `tinit audit --checkpoint` end to end (issue 32): the
checkpoints in the run folder, listed in config.json and sized on the terminal; the
audit's files; bad input one line, exit 2, no run folder."""

import json

import pandas as pd
import pytest
from helpers import assert_one_line_error, figures_built_not_saved
from typer.testing import CliRunner

from tinit.cli import app

runner = CliRunner()  # (its click command built once: conftest)
TINY = ["--layers", "2", "--d-model", "16", "--heads", "2", "--seq-len", "8", "--batch", "2", "--vocab", "16",
        "--eval-batches", "1", "--init", "naive", "--pre-norm"]  # fmt: skip


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "train"
    with pytest.MonkeyPatch.context() as mp:  # (the checkpoints are tested here, not the figures)
        figures_built_not_saved(mp)
        args = ["train", *TINY, "--steps", "4", "--save-steps", "0,final", "--out", str(out)]
        res = runner.invoke(app, args)
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


def test_a_sequence_too_long_names_the_checkpoint_and_what_to_give(run_folder, tmp_path):
    out = tmp_path / "x"
    res = runner.invoke(app, ["audit", "--checkpoint", str(run_folder), "--seq-len", "9", "--out", str(out)])
    assert_one_line_error(res, "--seq-len", out)
    json_file = next((run_folder / "checkpoints").rglob("step-000000.json"))
    want = (f"9 tokens do not fit the tinit model of {json_file}: it has 8 positions (max_seq_len); "
            "give --seq-len 8 or less")  # fmt: skip
    assert res.stderr.strip().endswith(want), res.stderr


def test_every_run_measured_on_the_tokens_of_seed_said_in_config_json(tmp_path, monkeypatch):
    """Two runs trained with --seed 5, audited with the default --seed 0: both are measured
    on the tokens of seed 0 (their v0 is the variance of their own embedding's rows at
    those ids, read here from the safetensors file, and not at seed 5's), and config.json
    and the terminal say so: the seed, and that it is the same for every run."""
    import numpy as np
    from safetensors.numpy import load_file

    from tinit.experiments.audit.trained import random_tokens

    figures_built_not_saved(monkeypatch)
    train = tmp_path / "train"
    args = ["train", *TINY[:-3], "--init", "naive,gpt2", "--pre-norm", "--seed", "5", "--steps", "2",
            "--save-steps", "0", "--out", str(train)]  # fmt: skip
    assert runner.invoke(app, args).exit_code == 0
    out = tmp_path / "audit"
    res = runner.invoke(app, ["audit", "--checkpoint", str(train), "--seq-len", "8", "--batch", "2", "--out",
                              str(out)], env={"COLUMNS": "200"})  # fmt: skip
    assert res.exit_code == 0, res.output
    config = json.loads((out / "config.json").read_text())
    assert config["tokens_seed"] == {"seed": 0, "option": "--seed", "same_for_every_run": True}
    assert "drawn by --seed 0, the same for every run (not each run's own training seed)" in res.output
    variance = pd.read_csv(out / "variance.csv")
    runs = sorted(variance["run"].unique())
    assert len(runs) == 2 and all("seed5" in r for r in runs)
    for run in runs:
        table = load_file(str(train / "checkpoints" / run / "step-000000.safetensors"))["embed.weight"]
        at = {s: float(np.var(table[random_tokens(16, 8, 2, s, "cpu").numpy()].astype(np.float64)))
              for s in (0, 5)}  # fmt: skip
        v0 = variance[(variance["run"] == run) & (variance["k"] == 0)]["stream_var"].item()
        assert v0 == pytest.approx(at[0], rel=1e-5) and v0 != pytest.approx(at[5], rel=1e-3)


def test_lr_sweep_saves_checkpoints(tmp_path, monkeypatch):
    """`tinit lr-sweep --save-steps`: each run's checkpoints in its run folder, listed in
    config.json and sized on the terminal; each run's step-0 checkpoint audited gives
    `tinit variance`'s numbers (test_checkpoints' check). Under `tinit sweep`: refused."""
    from test_checkpoints import assert_step0_is_variance

    import tinit.cli.runner
    from tinit.experiments.audit.sources import find_checkpoints
    from tinit.model.config import RunConfig

    real = tinit.cli.runner.write_result  # (the figures are not what is tested here)
    monkeypatch.setattr(tinit.cli.runner, "write_result",
                        lambda d, c, r, f, *a, **k: real(d, c, r, lambda _: {}, *a, **k))  # fmt: skip
    out = tmp_path / "lr"
    args = [*TINY, "--steps", "3", "--lr", "1e-3,1e-2", "--save-steps", "0,final"]
    res = runner.invoke(app, ["lr-sweep", *args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "Checkpoints: 4 (2 runs x steps 0,3)" in res.output
    config = json.loads((out / "config.json").read_text())
    assert config["complete"] and config["save_steps"] == [0, 3]
    files = sorted(p.relative_to(out).as_posix() for p in (out / "checkpoints").rglob("*") if p.is_file())
    assert files == sorted(x for e in config["checkpoints"] for x in (e["file"], e["json"]))
    runs = {e["run"] for e in config["checkpoints"]}
    assert runs == {"naive-pre-L2-d16-lr0.001-w3-seed0", "naive-pre-L2-d16-lr0.01-w3-seed0"}
    found = find_checkpoints(out)
    for ck in (c for c in found.checkpoints if c.step == 0):
        assert_step0_is_variance(found, ck, RunConfig(batch=2, seq_len=8))
    res = runner.invoke(app, ["sweep", "lr-sweep", *args, "--out", str(tmp_path / "sw")])
    assert_one_line_error(res, "--save-steps", tmp_path / "sw")


def test_claims_runs_get_folders_of_their_own(monkeypatch):
    """claims: every run its own checkpoint folder (its runs differ in norm, FFN and head
    too), even two runs of one configuration (--high-lr = --lr, no warmup); run_claims
    hands the writer and the steps to the trainer, and names each folder's claim."""
    import dataclasses

    from tinit.experiments.training import claims
    from tinit.experiments.training.trainer import TrainConfig, checkpoint_labels
    from tinit.model.config import InitConfig, ModelConfig

    model, ccfg = ModelConfig(d_model=16, n_heads=2), claims.ClaimsConfig(shallow=1, deep=2, seeds=2)
    specs = [s for v in claims.claim_specs(model, InitConfig(), TrainConfig(), ccfg).values() for s in v]
    labels = checkpoint_labels(specs)
    assert len(set(labels)) == len(specs) == 18
    assert {
        "scaled-pre-L1-d16-lr0.01-w30-seed0-layernorm",
        "scaled-pre-L1-d16-lr0.01-w30-seed0-gelu",
        "scaled-pre-L1-d16-lr0.01-w30-seed0-untied",
        "scaled-pre-L1-d16-lr0.01-w30-seed0",
    } <= set(labels)
    same = dataclasses.replace(ccfg, high_lr=1e-2)
    twins = [
        s for v in claims.claim_specs(model, InitConfig(), TrainConfig(warmup=0), same).values() for s in v
    ]
    labels = checkpoint_labels(twins)
    assert len(set(labels)) == 18 and "naive-pre-L2-d16-lr0.01-w0-seed0-run7" in labels
    got = {}
    monkeypatch.setattr(claims, "run_specs", lambda *a, **k: got.update(k, meta=a[5]))
    monkeypatch.setattr(claims, "extended", lambda run, judged, partial: run(None))
    writer = object()
    claims.run_claims(model, InitConfig(), None, TrainConfig(steps=4), None, ccfg, on_checkpoint=writer,
                      save_steps="0,final")  # fmt: skip
    assert got["on_checkpoint"] is writer and got["save_steps"] == [0, 4]
    named = got["meta"]["checkpoint_configurations"]
    assert named["scaled-pre-L1-d16-lr0.01-w30-seed1-gelu"] == "GELU FFN 4d shallow" and len(named) == 18


def test_sigterm_while_saving_keeps_the_checkpoints_written(tmp_path, monkeypatch):
    """A `tinit train` saving at every step, sent SIGTERM as its fourth checkpoint's write
    returns, before the run lists it (an event of the run, not a poller's guess at its
    pace): exit 1, config.json incomplete and naming the signal; every checkpoint it lists
    and every one complete on disk (its JSON present) loads whole with its step; at most
    the last written is complete but not yet listed; no temporary file left, and weights
    without their JSON whole and skipped. In process (the handler runs in the main
    thread); a real process stopped by a signal is tests/test_run_promises.py's (SIGTERM)
    and test_hostile_bombs.py's (SIGHUP)."""
    import os
    import signal

    from safetensors import safe_open

    from tinit.experiments.audit.sources import find_checkpoints

    out = tmp_path / "run"
    steps = 3000
    args = ["train", *TINY, "--steps", str(steps), "--eval-every", str(steps), "--save-steps",
            ",".join(map(str, range(steps + 1))), "--threads", "1", "--quiet", "--out", str(out)]  # fmt: skip
    from tinit.results.checkpoints import CheckpointWriter

    real = CheckpointWriter.__call__

    def save(self, *args, **kw):  # the signal once the fourth checkpoint is on disk
        entry = real(self, *args, **kw)
        if len(self.written) == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        return entry

    monkeypatch.setattr(CheckpointWriter, "__call__", save)
    res = runner.invoke(app, args)
    code, err = res.exit_code, res.stderr
    assert code == 1, err
    assert "stopped by SIGTERM" in err and "Traceback" not in err
    config = json.loads((out / "config.json").read_text())
    assert config["complete"] is False and "SIGTERM" in config["error"]
    assert config["error"].count("SIGTERM") == 1, config["error"]  # (issue 41: it was said twice)
    files = [p for p in (out / "checkpoints").rglob("*") if p.is_file()]
    assert not [p for p in files if p.name.startswith(".") or p.name.endswith(".tmp")]
    complete = {p.with_suffix(".safetensors") for p in files if p.suffix == ".json"}
    listed = {out / e["file"] for e in config["checkpoints"]}
    # four JSONs were on disk at the signal: the fourth is not listed yet
    assert len(complete) >= 4 and 3 <= len(listed) < steps + 1
    assert listed <= complete and len(complete - listed) <= 1
    for f in complete:
        step = json.loads(f.with_suffix(".json").read_text())["step"]
        assert f.name == f"step-{step:06d}.safetensors"
        with safe_open(str(f), framework="pt") as h:
            assert json.loads(h.metadata()["tinit"])["step"] == step
            assert all(h.get_tensor(k).isfinite().all() for k in h.keys())
    # weights without their JSON (the checkpoint being written) are whole or absent, and skipped
    for f in {p for p in files if p.suffix == ".safetensors"} - complete:
        with safe_open(str(f), framework="pt") as h:
            assert len(list(h.keys())) == len(safe_open(str(min(complete)), framework="pt").keys())
    found = find_checkpoints(out)
    assert {c.path for c in found.checkpoints} == complete


def test_the_memory_line_of_a_run_stopped_before_its_first_checkpoint_was_measured():
    """A SIGTERM inside the first checkpoint left no plan and no measured span: the line
    said "resident ()" and "measured in 0.0 s"; it says what it knows and no more."""
    from tinit.cli.audit_checkpoint import memory_line

    stopped = memory_line({"peak_rss_mib": 829.0, "bytes_read": 1.28 * 2**30})
    assert stopped == "Memory: peak 0.81 GiB resident; read 1.28 GiB"
    whole = memory_line({"peak_rss_mib": 1024.0, "bytes_read": 2**30, "seconds": {"a": 2.0},
                         "memory": {"arena_gib": 0.5, "predicted_gib": 0.9}})  # fmt: skip
    assert whole == ("Memory: peak 1.00 GiB resident (one block converted 0.50 GiB; planned 0.90 GiB); "
                     "read 1.00 GiB, measured in 2.0 s (0.50 GiB/s)")  # fmt: skip
