"""The one role table (tinit.model.roles): every parameter of tinit's model gets exactly
one role, the one its module says; the audit reads widths and labels off the same table;
the schemes, the scheme files and the audit agree on the roles."""

import math

import pytest
from torch import nn

from tinit.model.catalogue import CATALOGUE, get_scheme
from tinit.model.config import InitConfig, ModelConfig
from tinit.model.roles import (
    AUDIT_MATRIX_ROLES,
    LINEAR_ROLES,
    ROLES,
    STREAM_WRITERS,
    TABLE,
    reader_label,
    role_of,
    role_shape,
    widths_of,
    writer_role,
)
from tinit.model.transformer import Block, Transformer

TINY = {"n_layers": 2, "d_model": 32, "n_heads": 2, "vocab_size": 16, "max_seq_len": 8}


def _expected(model: nn.Module, name: str) -> str:
    """The role a parameter's module says, independently of the names' patterns: a bias
    is a bias, a block's own scalar its learned gain, a norm module's weight a norm gain,
    a linear layer's or embedding's weight the role it is held as."""
    owner_path, _, leaf = name.rpartition(".")
    owner = model.get_submodule(owner_path) if owner_path else model
    if leaf == "bias":
        return "bias"
    if isinstance(owner, Block):
        return "gain"
    if isinstance(owner, nn.Linear | nn.Embedding):
        return owner_path.rpartition(".")[2]
    assert not any(True for _ in owner.children()) and all(p.dim() == 1 for p in owner.parameters())
    return "norm"


def _models():
    options = [
        {},
        {"norm": "layernorm", "bias": True, "tie_embeddings": False, "positions": "learned"},
        {"norm_position": "sandwich", "qk_norm": True},
        {"norm_position": "post", "ffn": "gelu"},
    ]
    # every scheme once, the option sets in turn (each meets about a quarter of the schemes)
    for i, scheme in enumerate(CATALOGUE):
        cfg = ModelConfig.from_scheme(scheme, **TINY, **options[i % len(options)])
        yield scheme, Transformer(cfg, InitConfig(scheme))  # tiny: faster on the CPU than on meta


def test_every_parameter_matches_exactly_one_role_the_one_its_module_says():
    import re

    patterns = [(re.compile(r.pattern), r.name) for r in TABLE if r.pattern is not None]
    seen = set()
    for scheme, model in _models():
        for name, _ in model.named_parameters():
            hits = [role for pattern, role in patterns if pattern.search(name)]
            assert hits == [_expected(model, name)], (scheme, name, hits)
            seen.add(hits[0])
    assert seen == set(ROLES)  # every role of the table is met in some model


def test_draw_keys_a_matrix_by_its_role_a_constant_by_its_name():
    assert role_of("blocks.3.attn.q.weight") == ("q", "q")
    assert role_of("attn.q.weight") == ("q", "q")  # a block initialised on its own
    assert role_of("blocks.3.ffn.down.bias") == ("bias", "blocks.3.ffn.down.bias")
    assert role_of("blocks.1.norm2o.weight") == ("norm", "blocks.1.norm2o.weight")
    assert role_of("final_norm.weight") == ("norm", "final_norm.weight")
    assert role_of("blocks.0.gain") == ("gain", "blocks.0.gain")
    for bad in ("blocks.0.attn.gain", "blocks.0.attn.c_proj.weight", "weight"):
        with pytest.raises(KeyError):
            role_of(bad)


def test_role_shapes_are_the_built_shapes():
    cfg = ModelConfig(n_layers=1, d_model=64, n_heads=4, n_kv_heads=2, vocab_size=40, max_seq_len=12,
                      positions="learned", tie_embeddings=False)  # fmt: skip
    model = Transformer(cfg, InitConfig())
    # d 64, d_h 16, 2 K/V heads (32 wide), d_ff 8d/3 rounded up to 64: 192
    want = {"embed": (40, 64), "pos": (12, 64), "q": (64, 64), "k": (32, 64), "v": (32, 64), "o": (64, 64),
            "gate": (192, 64), "up": (192, 64), "down": (64, 192), "head": (40, 64)}  # fmt: skip
    for name, p in model.named_parameters():
        role = role_of(name)[0]
        if role in want:
            assert tuple(p.shape) == want[role] == role_shape(role, 64, 192, 16, 2, 40, 12), name


def test_widths_read_off_an_audited_shape():
    def w(role, shape):
        return tuple(widths_of(role, shape)[k] for k in ("d", "d_ff", "V"))

    # a model whose heads x d_h (96) is not its width d (64): readers' d is their input,
    # writers' their output
    assert w("q", (96, 64))[0] == 64 and w("qkv", (288, 64))[0] == 64 and w("k", (32, 64))[0] == 64
    assert w("o", (64, 96))[0] == 64
    assert w("gate", (256, 64))[:2] == (64, 256) and w("down", (64, 256))[:2] == (64, 256)
    assert w("embed", (1000, 64))[::2] == (64, 1000) and w("head", (1000, 64))[::2] == (64, 1000)
    assert w("pos", (128, 64))[0] == 64 and math.isnan(w("pos", (128, 64))[2])
    assert w("norm", (64,))[0] == 64 and w("bias", (256,))[0] == 256
    assert all(math.isnan(x) for x in w("gain", ()))
    assert all(math.isnan(x) for x in w("q", (64,)))  # not the role's shape: nothing said
    assert math.isnan(w("q", (96, 64))[1]) and math.isnan(w("o", (64, 96))[2])


@pytest.mark.parametrize(("branch", "name", "role"), [
    ("attn", "q_proj", "q"), ("attn", "self_attn.query", "q"), ("attn", "wk", "k"), ("attn", "v_proj", "v"),
    ("attn", "c_attn", "qkv"), ("attn", "Wqkv", "qkv"), ("ffn", "gate_proj", "gate"), ("ffn", "fc1", "up"),
    ("ffn", "up_proj", "up"), ("ffn", "c_fc", "up"),
])  # fmt: skip
def test_reader_labels(branch, name, role):
    assert reader_label(branch, name) == role


def test_one_table_for_schemes_init_and_audit():
    assert writer_role("attn") == "o" and writer_role("ffn") == "down"
    assert STREAM_WRITERS == ("o", "down")
    assert ROLES == ("embed", "pos", "q", "k", "v", "o", "gate", "up", "down", "head", "norm", "bias", "gain")
    assert LINEAR_ROLES == ("q", "k", "v", "o", "gate", "up", "down", "head")
    assert set(AUDIT_MATRIX_ROLES) == {*LINEAR_ROLES, "embed", "pos", "qkv"}
    for name in CATALOGUE:
        assert tuple(get_scheme(name).rules) == ROLES  # every scheme rules every role, in table order
