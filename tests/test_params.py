"""Guards the exact parameter accounting (tinit.model.params, tinit params): every count
equals the parameters of the modules tinit builds (real tiny models on the CPU, big
shapes on the meta device), the tied-head saving is V*d exactly, the gated FFN at the
unrounded 8d/3 equals the classic FFN at 4d, and the command's files, numbers and
errors."""

import dataclasses
import itertools
import json

import pandas as pd
import pytest
from helpers import figures_built_not_saved
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tinit import theory
from tinit.cli import app
from tinit.experiments.measure.params import FFN_COLUMNS, PARAMS_COLUMNS, SUMMARY_COLUMNS, run_params
from tinit.model.config import InitConfig, ModelConfig, swiglu_hidden
from tinit.model.params import (
    COMPONENTS,
    count_by_role,
    count_params,
    ffn_params,
    gqa_attention_saving,
    tied_saving,
)
from tinit.model.transformer import Transformer

runner = CliRunner()


def built_count(cfg: ModelConfig) -> int:
    """Parameters of the real model, built on the CPU (tiny shapes only)."""
    net = Transformer(cfg, InitConfig(), "cpu")
    return sum(p.numel() for p in net.parameters())


def meta_model(cfg: ModelConfig) -> Transformer:
    """The real Transformer built on the meta device: shapes without memory (the init
    draws nothing there)."""
    return Transformer(cfg, InitConfig(), "meta")


GRID = list(
    itertools.product(
        ("rmsnorm", "layernorm"), ("swiglu", "gelu"), ("rope", "none", "learned"), (True, False),
        (False, True), ("pre", "post"),
    )
)  # fmt: skip


@pytest.mark.parametrize(("norm", "ffn", "positions", "tied", "bias", "position"), GRID)
def test_count_equals_the_built_model(norm, ffn, positions, tied, bias, position):
    cfg = ModelConfig(
        n_layers=2, d_model=24, n_heads=2, vocab_size=37, max_seq_len=11, norm=norm, ffn=ffn,
        positions=positions, tie_embeddings=tied, bias=bias, norm_position=position,
    )  # fmt: skip
    assert count_params(cfg).total == built_count(cfg)


@settings(max_examples=25, deadline=None)
@given(
    layers=st.integers(1, 3),
    heads=st.sampled_from([1, 2, 4]),
    width=st.integers(1, 6),
    vocab=st.integers(1, 300),
    d_ff=st.one_of(st.none(), st.integers(1, 100)),
    seq=st.integers(1, 40),
)
def test_count_equals_the_built_model_for_random_shapes(layers, heads, width, vocab, d_ff, seq):
    cfg = ModelConfig(
        n_layers=layers, d_model=2 * heads * width, n_heads=heads, vocab_size=vocab, d_ff=d_ff,
        max_seq_len=seq, positions="learned", tie_embeddings=False, bias=True,
    )  # fmt: skip
    assert count_params(cfg).total == built_count(cfg)


def test_components_match_roles_of_the_built_model():
    cfg = ModelConfig(n_layers=3, d_model=32, n_heads=2, vocab_size=50, max_seq_len=9,
                      positions="learned", tie_embeddings=False)  # fmt: skip
    roles = count_by_role(Transformer(cfg, InitConfig(), "cpu").named_parameters())
    c = count_params(cfg).components()
    assert c["embedding"] == roles["embed"] == 50 * 32
    assert c["positions"] == roles["pos"] == 9 * 32
    assert c["attention"] == roles["q"] + roles["k"] + roles["v"] + roles["o"] == 3 * 4 * 32 * 32
    assert c["ffn"] == roles["gate"] + roles["up"] + roles["down"] == 3 * 3 * 32 * cfg.d_ff
    assert c["norms"] + c["final_norm"] == roles["norm"] == (2 * 3 + 1) * 32
    assert c["head"] == roles["head"] == 50 * 32
    assert list(c) == list(COMPONENTS)


def test_gaussian_branch_model_has_only_norms_in_its_blocks():
    cfg = ModelConfig(n_layers=2, d_model=16, n_heads=2, vocab_size=20, branch="gaussian")
    count = count_params(cfg)
    assert count.attention == count.ffn == 0
    assert count.total == built_count(cfg)


@pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig(n_layers=32, d_model=4096, n_heads=32, d_ff=11008, vocab_size=32000,
                    tie_embeddings=False, max_seq_len=4096),
        ModelConfig(n_layers=12, d_model=768, n_heads=12, vocab_size=50257, max_seq_len=1024,
                    norm="layernorm", ffn="gelu", positions="learned", bias=True),
        ModelConfig(n_layers=12, d_model=2048, n_heads=16, vocab_size=128000),
    ],
    ids=["llama2-7b-shape", "gpt2-small-shape", "background-1.5B-shape"],
)  # fmt: skip
def test_count_equals_a_meta_built_big_model(cfg):
    net = meta_model(cfg)
    assert all(p.device.type == "meta" for p in net.parameters())
    assert count_params(cfg).total == sum(p.numel() for p in net.parameters())


def test_known_totals():
    # GPT-2 small (124,439,808) and Llama 2 7B (6,738,415,616): the published exact counts
    gpt2 = ModelConfig(n_layers=12, d_model=768, n_heads=12, vocab_size=50257, max_seq_len=1024,
                       norm="layernorm", ffn="gelu", positions="learned", bias=True)  # fmt: skip
    assert count_params(gpt2).total == 124_439_808
    llama = ModelConfig(n_layers=32, d_model=4096, n_heads=32, d_ff=11008, vocab_size=32000,
                        tie_embeddings=False)  # fmt: skip
    assert count_params(llama).total == 6_738_415_616


def test_tied_saving_is_v_times_d_exactly():
    cfg = ModelConfig(vocab_size=128000, d_model=2048)
    tied = count_params(cfg).total
    untied = count_params(dataclasses.replace(cfg, tie_embeddings=False)).total
    assert untied - tied == tied_saving(cfg) == theory.tied_embedding_saving(128000, 2048) == 262_144_000
    biased = dataclasses.replace(cfg, bias=True)
    assert tied_saving(biased) == 262_144_000 + 128000  # the untied head's biases go too


@pytest.mark.parametrize("d", [48, 64, 96, 256, 2048, 4096])
def test_swiglu_at_8d_over_3_matches_classic_ffn(d):
    classic = ffn_params(d, 4 * d, "gelu")
    assert classic == 8 * d * d
    res = run_params(ModelConfig(d_model=d, n_heads=4))
    ffn = res["ffn"].set_index("variant")
    exact = ffn.loc["SwiGLU at 8d/3 (unrounded)"]
    assert bool(exact["equal"]) and exact["weights"] == classic
    rounded = ffn.loc["SwiGLU at 8d/3 rounded up to 64 (tinit default)"]
    assert rounded["d_ff"] == swiglu_hidden(d)
    assert rounded["weights"] == 3 * d * swiglu_hidden(d)
    # equal only when the rounding is a no-op, i.e. 8d/3 is already a multiple of 64
    assert bool(rounded["equal"]) == (8 * d % (3 * 64) == 0)


def test_gqa_saving():
    cfg = ModelConfig(n_layers=80, d_model=8192, n_heads=64, d_ff=28672, vocab_size=32000,
                      tie_embeddings=False)  # fmt: skip
    assert count_params(cfg).total - gqa_attention_saving(cfg, 8) == 68_976_648_192
    assert gqa_attention_saving(cfg, 64) == 0
    with pytest.raises(ValueError):
        gqa_attention_saving(cfg, 7)


def test_run_params_frames():
    res = run_params(ModelConfig(vocab_size=128000, d_model=2048), reference_total=1.5e9)
    assert list(res["params"].columns) == PARAMS_COLUMNS
    assert list(res["ffn"].columns) == FFN_COLUMNS
    assert list(res["summary"].columns) == SUMMARY_COLUMNS
    s = res["summary"].iloc[0]
    assert s["saved"] == s["saved_theory"] == 262_144_000
    assert round(100 * s["saved_frac_reference"], 1) == 17.5
    for tying, total in (("tied", s["total_tied"]), ("untied", s["total_untied"])):
        rows = res["params"][res["params"]["tying"] == tying]
        assert rows["count"].sum() == total
        assert rows["fraction"].sum() == pytest.approx(1.0)


def _run(tmp_path, *args):
    out = tmp_path / "run"
    result = runner.invoke(app, ["params", *args, "--out", str(out)])
    return result, out


def test_cli_background_numbers(tmp_path):
    result, out = _run(tmp_path, "--vocab", "128000", "--d-model", "2048", "--reference-total", "1.5e9")
    assert result.exit_code == 0, result.output
    assert "262,144,000 saved, 17.5% of 1.5B" in result.output
    assert {"params.csv", "ffn.csv", "summary.csv", "params.png", "config.json"} <= {
        p.name for p in out.iterdir()
    }
    params = pd.read_csv(out / "params.csv")
    assert list(params.columns) == PARAMS_COLUMNS
    assert len(params) == 2 * len(COMPONENTS)
    summary = pd.read_csv(out / "summary.csv")
    assert summary.loc[0, "saved"] == 262_144_000
    assert summary.loc[0, "total_untied"] - summary.loc[0, "total_tied"] == 262_144_000
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["vocab_size"] == 128000 and config["reference_total"] == 1.5e9


def test_cli_post_norm_drops_the_final_norm(tmp_path, monkeypatch):
    figures_built_not_saved(monkeypatch)  # (params.csv; test_cli_background_numbers draws)
    result, out = _run(tmp_path, "--post-norm", "--d-model", "64")
    assert result.exit_code == 0, result.output
    params = pd.read_csv(out / "params.csv").set_index(["tying", "component"])
    assert params.loc[("tied", "final_norm"), "count"] == 0


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--reference-total", "-1"], "--reference-total"),
        (["--reference-total", "nan"], "--reference-total"),
        (["--heads", "3"], "--heads"),
        (["--vocab", "0"], "--vocab"),
    ],
)
def test_cli_bad_input(tmp_path, args, option):
    result, out = _run(tmp_path, *args)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and option in lines[0]
    assert not out.exists() or not any(out.iterdir())


def test_counting_options_only():
    # options that do not change a count are not offered
    result = runner.invoke(app, ["params", "--sigma", "0.1"])
    assert result.exit_code == 2
    assert "No such option: --sigma" in result.output
