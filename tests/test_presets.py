"""Guards the named shapes (tinit.model.presets) and the shared ``--preset`` option:
each preset is a valid configuration whose exact count is the real model's published
total (less the GQA difference tinit does not model), a preset sets every model field
it defines through the option that sets it on every command, explicit options override
it, batch and sequence length stay the command's, and an unknown name is a one-line
usage error."""

import dataclasses
import json

import pytest
from helpers import figures_built_not_saved
from typer.main import get_command
from typer.testing import CliRunner

from tinit.cli import app
from tinit.cli.configs import Options
from tinit.cli.registry import options_of
from tinit.model.config import InitConfig, ModelConfig
from tinit.model.params import count_params, gqa_attention_saving
from tinit.model.presets import PRESETS, get_preset
from tinit.model.transformer import Transformer

runner = CliRunner()

#: Model fields a preset may set: shapes and architecture, never run sizes or init.
SHAPE_FIELDS = {"n_layers", "d_model", "n_heads", "d_ff", "vocab_size", "norm", "ffn", "positions",
                "tie_embeddings", "bias", "n_kv_heads", "rope_base", "norm_eps"}  # fmt: skip


def preset_model(name: str) -> ModelConfig:
    """The ModelConfig of `tinit params --preset NAME` and no other option (params takes
    every shape option), its command line parsed as the CLI parses it."""
    ctx = get_command(app).commands["params"].make_context("params", ["--preset", name])
    return Options(ctx.params, options_of("params")).model_config()


def test_required_presets_exist():
    assert {"gpt2-small", "llama2-7b", "llama2-70b", "llama3-8b"} <= set(PRESETS)


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_set_shapes_only(name):
    p = PRESETS[name]
    assert set(p.model) <= SHAPE_FIELDS
    assert p.description and p.context >= 1


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_count_is_the_published_total(name):
    p = PRESETS[name]
    cfg = preset_model(name)
    # the GQA presets set --kv-heads: tinit builds and counts the real attention
    assert cfg.n_kv_heads == p.n_kv_heads
    assert count_params(cfg).total == p.published_total
    if p.n_kv_heads:  # and the multi-head variant counts gqa_attention_saving more
        mha = dataclasses.replace(cfg, n_kv_heads=None)
        assert count_params(mha).total - gqa_attention_saving(mha, p.n_kv_heads) == p.published_total
    # and the count is that of the real module tree, built on the meta device
    net = Transformer(cfg, InitConfig(), "meta")
    assert sum(t.numel() for t in net.parameters()) == count_params(cfg).total


def test_preset_shapes():
    gpt2 = preset_model("gpt2-small")
    assert (gpt2.n_layers, gpt2.d_model, gpt2.n_heads, gpt2.vocab_size, gpt2.max_seq_len) == (
        12,
        768,
        12,
        50257,
        1024,
    )
    assert (gpt2.norm, gpt2.ffn, gpt2.positions, gpt2.tie_embeddings, gpt2.bias) == (
        "layernorm", "gelu", "learned", True, True,
    )  # fmt: skip
    l7 = preset_model("llama2-7b")
    assert (l7.n_layers, l7.d_model, l7.n_heads, l7.d_ff, l7.vocab_size) == (32, 4096, 32, 11008, 32000)
    assert (l7.norm, l7.ffn, l7.positions, l7.tie_embeddings) == ("rmsnorm", "swiglu", "rope", False)
    l70 = preset_model("llama2-70b")
    assert (l70.n_layers, l70.d_model, l70.n_heads, l70.d_ff) == (80, 8192, 64, 28672)
    l3 = preset_model("llama3-8b")
    assert (l3.n_layers, l3.d_model, l3.n_heads, l3.d_ff, l3.vocab_size) == (32, 4096, 32, 14336, 128256)
    assert l3.rope_base == 500000.0 and l3.norm_eps == 1e-5


def test_gqa_is_documented():
    for name in ("llama2-70b", "llama3-8b"):
        p = PRESETS[name]
        assert p.n_kv_heads == 8 and "grouped-query" in p.note and p.model["n_kv_heads"] == 8
        assert "GQA" in p.description


def test_unknown_preset_raises_naming_the_choices():
    with pytest.raises(KeyError, match="gpt2-small"):
        get_preset("gpt5")


def _config(out):
    return json.loads((out / "config.json").read_text())


@pytest.fixture
def no_png(monkeypatch):
    """These tests read config.json: the figures are built, not rendered (the params and
    variance figures are drawn by tests/test_params.py and tests/test_cli_variance.py)."""
    figures_built_not_saved(monkeypatch)


def test_cli_preset_and_explicit_override(tmp_path, no_png):
    out = tmp_path / "p"
    result = runner.invoke(app, ["params", "--preset", "llama2-7b", "--layers", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    model = _config(out)["model"]
    assert model["n_layers"] == 2  # explicit
    assert (model["d_model"], model["d_ff"], model["vocab_size"]) == (4096, 11008, 32000)  # preset
    assert model["tie_embeddings"] is False


def test_cli_preset_on_another_command_keeps_run_sizes(tmp_path, no_png):
    out = tmp_path / "v"
    args = ["variance", "--preset", "gpt2-small", "--layers", "1", "--d-model", "32", "--heads", "2",
            "--d-ff", "64", "--vocab", "64", "--init", "naive", "--pre-norm", "-q"]  # fmt: skip
    args += ["--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    config = _config(out)
    model, run = config["model"], config["run"]
    assert (model["n_layers"], model["d_model"], model["n_heads"], model["vocab_size"]) == (1, 32, 2, 64)
    assert (model["norm"], model["ffn"], model["positions"], model["bias"]) == (
        "layernorm",
        "gelu",
        "learned",
        True,
    )
    assert model["norm_eps"] == 1e-5 and model["max_seq_len"] == 1024  # the model's context
    assert (run["batch"], run["seq_len"]) == (8, 128)  # the command's defaults, not the preset's
    assert run["extra"]["preset"] == "gpt2-small"


def test_cli_explicit_value_equal_to_the_default_still_overrides(tmp_path, no_png):
    # --ffn swiglu is the default value, but given explicitly it beats gpt2-small's gelu
    out = tmp_path / "p"
    result = runner.invoke(app, ["params", "--preset", "gpt2-small", "--ffn", "swiglu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert _config(out)["model"]["ffn"] == "swiglu"


@pytest.mark.parametrize("command", ["params", "variance"])
def test_cli_unknown_preset(tmp_path, command):
    result = runner.invoke(app, [command, "--preset", "gpt5", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1
    assert "--preset" in lines[0] and all(name in lines[0] for name in PRESETS)
