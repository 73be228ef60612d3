"""Guards the training loop: the schedule against hand values, one step against a
bare PyTorch AdamW step (update ratio and gradient norm recomputed here), the
divergence stop, bit-identical train.csv for the same seed on the CPU, and the
acceptance run: a 4-layer model at the CPU defaults ends within 10 % of the
Markov language's entropy floor, from well above it (about 5 s on an idle core)."""

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tinit.experiments.training.data import load_data
from tinit.experiments.training.grid import TrainGrid
from tinit.experiments.training.train import run_train
from tinit.experiments.training.trainer import (
    RATIO_COLUMNS,
    TrainConfig,
    Trainer,
    flops_per_token,
    lr_factor,
    probe_steps,
)
from tinit.model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from tinit.model.transformer import Transformer
from tinit.results.rundir import write_csvs

CPU = RunConfig(device="cpu")


def test_flops_per_token_by_hand():
    # 6N + 12 L d T: N = 1000, L = 2, d = 8, T = 16 -> 6000 + 3072
    assert flops_per_token(1000, ModelConfig(n_layers=2, d_model=8, n_heads=2), 16) == 9072


def test_lr_factor_by_hand():
    # 10 warmup steps: 0.1, 0.2, ..., 1.0; then cosine over the remaining 89 steps down to 0.1
    assert [lr_factor(s, 10, 100, 0.1) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert lr_factor(10, 10, 100, 0.1) == pytest.approx(1.0)
    assert lr_factor(99, 10, 100, 0.1) == pytest.approx(0.1)
    mid = 10 + 89 / 2
    assert lr_factor(int(mid), 10, 100, 0.1) == pytest.approx(
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 44 / 89))
    )
    assert lr_factor(0, 0, 100, 0.0) == pytest.approx(1.0)
    assert probe_steps(300, 3) == [0, 150, 300] and probe_steps(10, 0) == [] and probe_steps(10, 1) == [10]


def test_bad_train_config_names_the_field():
    for kw, field in (
        ({"steps": 0}, "steps"),
        ({"lr": -1.0}, "lr"),
        ({"min_lr_ratio": 2.0}, "min_lr_ratio"),
        ({"diverge_margin": 0.0}, "diverge_margin"),
        ({"warmup": -1}, "warmup"),
    ):
        with pytest.raises(ConfigError) as e:
            TrainConfig(**kw)
        assert e.value.field == field


def _tiny(**kw):
    return ModelConfig(n_layers=2, d_model=32, n_heads=2, vocab_size=32, max_seq_len=16, **kw)


def test_step_matches_a_bare_adamw_step():
    cfg, init = _tiny(), InitConfig(seed=2)
    train = TrainConfig(steps=5, lr=1e-2, warmup=2, grad_clip=0.5, weight_decay=0.1)
    ours = Transformer(cfg, init)
    bare = Transformer(cfg, init)
    trainer = Trainer(ours, train, torch.device("cpu"), train.lr, train.warmup)
    decay = [p for p in bare.parameters() if p.dim() >= 2]
    rest = [p for p in bare.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=1e-2 * 0.5,
        betas=(0.9, 0.95),
    )
    batch = torch.randint(32, (3, 9), generator=torch.Generator().manual_seed(0))
    o0 = bare.blocks[1].attn.o.weight.detach().clone()
    lr, loss, grad_norm, ratios = trainer.step(batch)
    logits = bare(batch[:, :-1])
    ref_loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
    ref_loss.backward()
    ref_norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in bare.parameters()))
    torch.nn.utils.clip_grad_norm_(list(bare.parameters()), 0.5)
    opt.step()
    assert lr == pytest.approx(5e-3)  # first warmup step: lr / 2
    assert loss == pytest.approx(float(ref_loss.detach()), rel=1e-6)
    assert grad_norm == pytest.approx(ref_norm, rel=1e-5)  # recorded before clipping
    assert grad_norm > 0.5
    for p, q in zip(ours.parameters(), bare.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)
    o1 = bare.blocks[1].attn.o.weight.detach()
    # tracked order: (layer 0, o), (layer 0, down), (layer 1, o), ...
    assert ratios[2] == pytest.approx(float((o1 - o0).norm() / o0.norm()), rel=1e-4)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2)  # second warmup step


def _run(data, steps=12, seeds=(0,), inits=("naive", "scaled"), positions=("pre", "post"), **kw):
    model = _tiny()
    train = TrainConfig(steps=steps, lr=kw.pop("lr", 3e-3), warmup=2, eval_every=4, probe_points=2, **kw)
    return run_train(
        TrainGrid(model, InitConfig(), CPU, train, data, list(inits), list(positions), [2], list(seeds))
    )


def test_same_seed_same_train_csv_and_records_are_complete(tmp_path):
    data = load_data("markov", vocab=32, seq_len=8, batch=4, seed=0, eval_batches=1)
    a, b = _run(data), _run(data)
    write_csvs(tmp_path / "a" if (tmp_path / "a").mkdir() is None else None, a.frames)
    write_csvs(tmp_path / "b" if (tmp_path / "b").mkdir() is None else None, b.frames)
    for name in ("train", "update_ratios", "variance_during_training", "runs"):
        if name == "runs":  # wall-clock columns differ; everything else is the same
            timed = ("train_seconds", "tokens_per_s", "model_flops_per_s")
            cols = [c for c in a[name].columns if c not in timed]
            assert a[name][cols].equals(b[name][cols])
        else:
            assert (tmp_path / "a" / f"{name}.csv").read_bytes() == (
                tmp_path / "b" / f"{name}.csv"
            ).read_bytes()
    tr = a["train"]
    assert len(tr) == 4 * 13  # 4 configurations x (step 0 + 12 steps)
    assert tr.groupby(["init", "norm_position"]).size().eq(13).all()
    ev = tr[np.isfinite(tr["eval_loss"])]
    assert sorted(set(ev["step"])) == [0, 4, 8, 12]
    assert (tr.loc[tr["step"] > 0, "tokens"] == tr.loc[tr["step"] > 0, "step"] * 32).all()
    # lr follows the schedule: warmup 2 of 12 steps
    lr = tr[(tr["init"] == "naive") & (tr["norm_position"] == "pre") & (tr["step"] > 0)]["lr"].to_numpy()
    np.testing.assert_allclose(lr, [3e-3 * lr_factor(s, 2, 12, 0.1) for s in range(12)], rtol=1e-12)
    ratios = a["update_ratios"]
    assert list(ratios.columns) == RATIO_COLUMNS and len(ratios) == 4 * 12 * 2 * 2
    assert (ratios["update_ratio"] > 0).all()
    var = a["variance_during_training"]
    assert sorted(set(var["step"])) == [0, 12] and len(var) == 4 * 2 * 5  # 2 probe steps x (2L + 1) rows
    # seeds differ: another seed gives another curve
    # (the first configuration's: naive, pre-norm)
    c = _run(data, seeds=(1,), inits=("naive",), positions=("pre",))
    assert (tr.iloc[:13][["init", "norm_position"]] == ["naive", "pre"]).all().all()
    assert not np.allclose(c["train"]["train_loss"].to_numpy()[1:13], tr["train_loss"].to_numpy()[1:13])


def test_tokens_per_s_counts_the_time_spent_drawing_data(monkeypatch):
    """A step costs its batch too: with every batch taking 30 ms to draw, 3 steps take
    at least 0.09 s of train_seconds, and tokens/s is at most 32 tokens / 30 ms (one
    run: each run's time is its own)."""
    import time

    from tinit.experiments.training.data import TrainData

    draw = TrainData.next_batch

    def slow(self):
        time.sleep(0.03)
        return draw(self)

    monkeypatch.setattr(TrainData, "next_batch", slow)
    data = load_data("markov", vocab=32, seq_len=8, batch=4, seed=0, eval_batches=1)
    runs = _run(data, steps=3, inits=("naive",), positions=("pre",))["runs"]
    assert len(runs) == 1
    assert (runs["train_seconds"] >= 3 * 0.03).all()
    assert (runs["tokens_per_s"] <= 32 / 0.03).all()


def test_divergence_stops_the_run_and_marks_it():
    data = load_data("markov", vocab=32, seq_len=8, batch=4, seed=0, eval_batches=1)
    res = _run(data, steps=30, lr=3.0, grad_clip=0.0, diverge_margin=0.2)
    runs = res["runs"]
    assert runs["diverged"].any()
    for _, r in runs[runs["diverged"]].iterrows():
        tr = res["train"][
            (res["train"]["init"] == r["init"]) & (res["train"]["norm_position"] == r["norm_position"])
        ]
        last = tr.iloc[-1]
        assert last["status"] == "diverged" and last["step"] == r["diverged_step"] < 30
        first = tr[tr["step"] == 1]["train_loss"].iloc[0]
        assert not math.isfinite(last["train_loss"]) or last["train_loss"] > first + 0.2
        assert (tr.iloc[1:-1]["train_loss"] <= first + 0.2).all()  # it stopped at the first bad step
        assert math.isnan(r["final_eval_loss"])
    s = res["summary"]
    assert s["diverged"].sum() == runs["diverged"].sum()


def test_four_layers_reach_the_entropy_floor_at_cpu_defaults():
    # the CPU defaults of `tinit train` (tinit/cli/train.py CPU_DEFAULTS, 300 steps, lr 1e-2, warmup 30)
    data = load_data("markov", vocab=64, seq_len=32, batch=16, seed=0, eval_batches=4)
    model = ModelConfig(n_layers=4, d_model=48, n_heads=4, vocab_size=64)
    train = TrainConfig(steps=300, lr=1e-2, warmup=30, eval_every=300, probe_points=0)
    res = run_train(TrainGrid(model, InitConfig(), CPU, train, data, ["scaled"], ["pre"], [4], [0]))
    r = res["runs"].iloc[0]
    floor = data.floor
    assert r["initial_eval_loss"] > 2 * floor  # from well above: ln 64 = 4.16 against H
    assert not r["diverged"]
    assert r["final_eval_loss"] >= floor - 0.05  # a held-out estimate cannot sit far below the floor
    assert r["final_eval_loss"] <= 1.10 * floor


def test_training_refuses_non_float32_and_a_small_vocab():
    data = load_data("markov", vocab=32, seq_len=8, batch=2, seed=0, eval_batches=1)
    with pytest.raises(ConfigError):
        run_train(
            TrainGrid(
                _tiny(), InitConfig(), dataclasses.replace(CPU, dtype="float64"), TrainConfig(steps=1), data,
                ["naive"], ["pre"], [1], [0],
            )
        )  # fmt: skip
    with pytest.raises(ConfigError) as e:
        run_train(
            TrainGrid(
                dataclasses.replace(_tiny(), vocab_size=16), InitConfig(), CPU, TrainConfig(steps=1), data,
                ["naive"], ["pre"], [1], [0],
            )
        )  # fmt: skip
    assert e.value.field == "vocab_size"


def test_each_finished_run_is_handed_over_before_the_next_starts():
    """run_train calls on_partial after every run but the last, with (a function building)
    every finished run's rows, so the CLI can write them before the next run starts."""
    data = load_data("markov", vocab=16, seq_len=8, batch=2, seed=0)
    seen = []

    def on_partial(so_far):
        result = so_far()
        seen.append((result.complete, len(result["runs"]), sorted(result["train"]["seed"].unique())))

    grid = TrainGrid(ModelConfig(n_layers=1, d_model=16, n_heads=2, vocab_size=16), InitConfig(),
                     RunConfig(device="cpu"), TrainConfig(steps=2, eval_every=1, probe_points=0),
                     data, ["naive"], ["pre"], [1], [0, 1, 2])  # fmt: skip
    res = run_train(grid, on_partial=on_partial)
    assert seen == [(False, 1, [0]), (False, 2, [0, 1])]
    assert res.complete and len(res["runs"]) == 3
