"""Optimizer rules of the parametrizations, against closed forms written from each
upstream file (not from tinit's formulas): microsoft/mup MuAdamW, nanoGPT-mup's
CompleteP configure_optimizers, Megatron-LM's get_mup_config_overrides."""

from __future__ import annotations

import pickle

import pytest
import torch

from tinit.model import InitConfig, ModelConfig, Transformer
from tinit.model.catalogue import CATALOGUE, get_scheme
from tinit.model.formula import FormulaError
from tinit.model.param_rules import describe_groups, optimizer_groups, rules_summary
from tinit.model.scheme_file import parse_scheme

LR, WD, EPS = 1e-2, 0.1, 1e-8
D0, L0 = 32, 1


def groups(scheme: str, d: int = 4 * D0, L: int = 4, tied: bool = False, bias: bool = True, **kw):
    cfg = ModelConfig(n_layers=L, d_model=d, n_heads=2, vocab_size=64, max_seq_len=16,
                      tie_embeddings=tied, bias=bias)  # fmt: skip
    model = Transformer(cfg, InitConfig(scheme, base_width=D0, base_depth=L0), "cpu")
    return model, {g["name"]: g for g in optimizer_groups(model, lr=LR, weight_decay=WD, eps=EPS, **kw)}


def test_mup_at_m4_hidden_lr_quarter_and_vectors_unchanged():
    """MuAdamW at width_mult 4: matrix-like lr / 4, weight_decay x 4 (decoupled_wd False);
    vector-like (embedding, readout, norms, biases) untouched; eps untouched."""
    _, g = groups("mup")
    assert g["hidden_matrix"]["lr"] == pytest.approx(LR / 4)
    assert g["hidden_matrix"]["weight_decay"] == pytest.approx(WD * 4)
    for name in ("embedding", "readout", "hidden_vector", "final_vector"):
        assert g[name]["lr"] == pytest.approx(LR)
    assert g["embedding"]["weight_decay"] == pytest.approx(WD)
    assert g["hidden_vector"]["weight_decay"] == 0.0 and g["final_vector"]["weight_decay"] == 0.0
    assert all(x["eps"] == pytest.approx(EPS) for x in g.values())


def test_completep_at_4L0_alpha1():
    """nanoGPT-mup completep, alpha 1, L = 4 L0, m = 4: hidden lr x 1/m x (L/L0)^0,
    wd x m; hidden ln/bias lr x (L/L0)^0 = 1; eps x (1/m)(L/L0)^-1 = 1/16 everywhere."""
    _, g = groups("completep")
    assert g["hidden_matrix"]["lr"] == pytest.approx(LR / 4)
    assert g["hidden_matrix"]["weight_decay"] == pytest.approx(WD * 4)
    assert g["hidden_vector"]["lr"] == pytest.approx(LR)
    assert g["embedding"]["lr"] == pytest.approx(LR) and g["final_vector"]["lr"] == pytest.approx(LR)
    assert all(x["eps"] == pytest.approx(EPS / 16) for x in g.values())


def test_depth_mup_at_4L0_alpha_half():
    """alpha 1/2: hidden lr x (1/4) 4^(-1/2) = 1/8, hidden vectors x 1/2, eps x (1/4)(1/2)."""
    _, g = groups("depth-mup")
    assert g["hidden_matrix"]["lr"] == pytest.approx(LR / 8)
    assert g["hidden_vector"]["lr"] == pytest.approx(LR / 2)
    assert g["embedding"]["lr"] == pytest.approx(LR)
    assert all(x["eps"] == pytest.approx(EPS / 8) for x in g.values())


def test_depth_mup_depth_only():
    """At m = 1 (d = d0) and L = 16 L0 the hidden lr is lr / 4 from depth alone."""
    _, g = groups("depth-mup", d=D0, L=16)
    assert g["hidden_matrix"]["lr"] == pytest.approx(LR / 4)
    assert g["hidden_matrix"]["weight_decay"] == pytest.approx(WD)


def test_megatron_mup_hidden_lr_and_eps_only():
    """get_mup_config_overrides (Adam): hidden lr / m and eps / m; embeddings, output
    layer and vectors base; weight decay unscaled."""
    _, g = groups("megatron-mup")
    assert g["hidden_matrix"]["lr"] == pytest.approx(LR / 4)
    assert g["hidden_matrix"]["eps"] == pytest.approx(EPS / 4)
    assert g["hidden_matrix"]["weight_decay"] == pytest.approx(WD)
    for name in ("embedding", "readout", "hidden_vector", "final_vector"):
        assert g[name]["lr"] == pytest.approx(LR) and g[name]["eps"] == pytest.approx(EPS)


@pytest.mark.parametrize("scheme", ["gpt2", "naive", "nanochat"])
def test_standard_schemes_have_one_lr(scheme):
    assert get_scheme(scheme).param_rules is None
    _, g = groups(scheme)
    assert {x["lr"] for x in g.values()} == {LR} and {x["eps"] for x in g.values()} == {EPS}


def test_rules_off_gives_one_lr_for_the_same_init():
    _, g = groups("completep", rules=False)
    assert {x["lr"] for x in g.values()} == {LR} and {x["eps"] for x in g.values()} == {EPS}
    assert g["hidden_matrix"]["weight_decay"] == WD


def test_only_the_parametrizations_declare_rules():
    declared = {n for n, s in CATALOGUE.items() if s.param_rules is not None}
    assert declared == {"mup", "mup-example", "completep", "depth-mup", "megatron-mup"}
    for n in declared:
        assert CATALOGUE[n].param_rules.upstream


@pytest.mark.parametrize("tied", [True, False])
def test_groups_partition_the_parameters(tied):
    model, g = groups("mup", tied=tied, L=2)
    seen = [id(p) for x in g.values() for p in x["params"]]
    assert sorted(seen) == sorted(id(p) for p in model.parameters())
    assert ("readout" in g) == (not tied)
    # weight decay only on matrices (tinit's trainer's rule before the parametrizations)
    for x in g.values():
        if x["weight_decay"]:
            assert all(p.dim() >= 2 for p in x["params"])
    rows = describe_groups(list(g.values()))
    assert sum(r["params"] for r in rows) == sum(p.numel() for p in model.parameters())


def test_groups_reach_adam():
    """Adam's first step moves every weight by about lr (|m/sqrt(v)| = 1): under
    completep at m = 4 the hidden matrices move lr / 4, the embedding lr (mup's zero
    readout would leave the hidden gradients zero at step 1)."""
    model, g = groups("completep", L=1)
    before = {id(p): p.detach().clone() for p in model.parameters()}
    opt = torch.optim.AdamW([{**x, "weight_decay": 0.0} for x in g.values()], betas=(0.9, 0.95))
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    opt.step()

    def moved(p):
        return float((p.detach() - before[id(p)]).abs().max())

    assert moved(model.blocks[0].attn.v.weight) == pytest.approx(LR / 4, rel=1e-3)
    assert moved(model.embed.weight) == pytest.approx(LR, rel=1e-3)


def test_rules_pickle_with_the_scheme():
    s = get_scheme("completep")
    assert pickle.loads(pickle.dumps(s)) == s


def test_summary_names_the_rules():
    assert "lr x (d0 / d)" in rules_summary(InitConfig("mup"))
    assert "no optimizer rules" in rules_summary(InitConfig("gpt2"))
    assert "off" in rules_summary(InitConfig("mup"), rules=False)


def test_user_scheme_declares_rules():
    s = parse_scheme({"name": "my-mup", "optimizer": {"hidden_matrix": {"lr": "d0 / d", "eps": "d0 / d"}}})
    cfg = ModelConfig(n_layers=2, d_model=64, n_heads=2, vocab_size=64, max_seq_len=16)
    model = Transformer(cfg, InitConfig("my-mup", base_width=16, schemes=(s,)), "cpu")
    g = {x["name"]: x for x in optimizer_groups(model, lr=LR, eps=EPS)}
    assert g["hidden_matrix"]["lr"] == pytest.approx(LR / 4)
    assert g["hidden_matrix"]["eps"] == pytest.approx(EPS / 4)
    assert g["embedding"]["lr"] == pytest.approx(LR)


@pytest.mark.parametrize(
    "table, msg",
    [
        ({"hidden": {"lr": "1"}}, "unknown group"),
        ({"hidden_matrix": {"lr": "l"}}, "unknown variable"),
        ({"hidden_matrix": {"rate": "1"}}, "unknown key"),
        ({"hidden_matrix": {"lr": "1 - d0 / d"}}, "positive"),
    ],
)
def test_user_scheme_bad_rules(table, msg):
    with pytest.raises(FormulaError, match=msg):
        parse_scheme({"name": "bad", "optimizer": table})


def test_train_applies_and_records_the_rules(tmp_path):
    """`tinit train --init mup` at m = 2: config.json's param_groups give the hidden
    matrices lr / 2 and the embedding lr; --param-rules off gives one lr; the terminal
    names the rules; a bad value is a one-line usage error."""
    import json

    from typer.testing import CliRunner

    from tinit.cli import app

    runner = CliRunner()
    base = ["train", "--init", "mup", "--pre-norm", "--base-width", "16", "--d-model", "32", "--heads", "2",
            "--vocab", "16", "--seq-len", "8", "--batch", "2", "--layers", "1", "--steps", "2",
            "--lr", "1e-2", "--probe-points", "0"]  # fmt: skip
    for rules, hidden in (("on", 5e-3), ("off", 1e-2)):
        out = tmp_path / rules
        res = runner.invoke(app, [*base, "--param-rules", rules, "--out", str(out)])
        assert res.exit_code == 0, res.output
        (groups,) = json.loads((out / "config.json").read_text())["param_groups"].values()
        g = {x["name"]: x for x in groups}
        assert g["hidden_matrix"]["lr"] == pytest.approx(hidden)
        assert g["embedding"]["lr"] == pytest.approx(1e-2)
        assert g["hidden_matrix"]["weight_decay"] == pytest.approx(0.1 * (2 if rules == "on" else 1))
        assert ("lr x (d0 / d)" in res.output) == (rules == "on"), res.output
    res = runner.invoke(app, [*base, "--param-rules", "maybe", "--out", str(tmp_path / "bad")])
    assert res.exit_code == 2 and "--param-rules" in res.output and "Traceback" not in res.output
