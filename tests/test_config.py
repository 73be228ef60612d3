"""Guards the config contract: derived sizes (the d_ff rule), validation that names
the offending field, and the choices being exactly those docs/design.md §10 lists."""

import math

import pytest

from tinit.model.config import ConfigError, InitConfig, ModelConfig, RunConfig, swiglu_hidden


@pytest.mark.parametrize("d", [64, 256, 768, 1000, 2048, 4096, 8192])
def test_swiglu_hidden_is_8d_over_3_rounded_up_to_64(d):
    h = swiglu_hidden(d)
    assert h % 64 == 0
    assert 8 * d / 3 <= h < 8 * d / 3 + 64


def test_d_ff_defaults():
    assert ModelConfig(d_model=256).d_ff == 704
    assert ModelConfig(d_model=256, ffn="gelu").d_ff == 1024
    assert ModelConfig(d_model=256, d_ff=100).d_ff == 100


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n_layers": 0}, "n_layers"),
        ({"n_layers": -3}, "n_layers"),
        ({"d_model": 10, "n_heads": 3}, "n_heads"),
        ({"norm": "batchnorm"}, "norm"),
        ({"ffn": "tanh"}, "ffn"),
        ({"positions": "alibi"}, "positions"),
        ({"attention": "sliding"}, "attention"),
        ({"d_model": 6, "n_heads": 2}, "n_heads"),  # RoPE needs an even head size
        ({"branch_var": -1.0}, "branch_var"),
        ({"d_ff": 0}, "d_ff"),
    ],
)
def test_model_config_rejects(kwargs, field):
    with pytest.raises(ConfigError) as info:
        ModelConfig(**kwargs)
    assert info.value.field == field


def test_odd_head_size_is_fine_without_rope():
    assert ModelConfig(d_model=6, n_heads=2, positions="none").head_dim == 3


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"sigma": 0.0}, "sigma"),
        ({"sigma": -0.1}, "sigma"),
        ({"sigma": "inv-sqrt"}, "sigma"),
        ({"sigma": math.inf}, "sigma"),
        ({"embed_std": 0.0}, "embed_std"),
        ({"seed": -1}, "seed"),
        ({"scheme": "deepnorm"}, "scheme"),
    ],
)
def test_init_config_rejects(kwargs, field):
    with pytest.raises(ConfigError) as info:
        InitConfig(**kwargs)
    assert info.value.field == field


def test_sigma_inv_sqrt_d_resolves():
    init = InitConfig(sigma="inv-sqrt-d")
    assert init.resolved_sigma(256) == pytest.approx(1 / 16)
    assert init.resolved_embed_std(256) == pytest.approx(1 / 16)
    assert InitConfig(sigma=0.02, embed_std=1.0).resolved_embed_std(256) == 1.0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"batch": 0}, "batch"), ({"seq_len": 0}, "seq_len"), ({"dtype": "float16"}, "dtype"),
     ({"device": "tpu"}, "device")],
)  # fmt: skip
def test_run_config_rejects(kwargs, field):
    with pytest.raises(ConfigError) as info:
        RunConfig(**kwargs)
    assert info.value.field == field
