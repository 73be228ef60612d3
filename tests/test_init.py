"""Guards the init schemes: every parameter has an explicit role, every role's
measured std matches the scheme within its sampling error, and the depth-scaled
scheme touches exactly W_O and W_down (the bug class of HF #47458 / llama2.c #579).
Also: draws are determined by (seed, layer, role) alone."""

import math

import pytest
import torch

from tinit.model.config import InitConfig, ModelConfig
from tinit.model.roles import role_of
from tinit.model.transformer import Transformer, build_block

WIDE = ModelConfig(n_layers=4, d_model=128, n_heads=4, vocab_size=512, max_seq_len=64)


def _model(cfg, scheme, **init_kw):
    return Transformer(cfg, InitConfig(scheme=scheme, seed=7, **init_kw), "cpu", torch.float64)


@pytest.mark.parametrize("scheme", ["naive", "scaled"])
@pytest.mark.parametrize(
    "cfg",
    [
        WIDE,
        ModelConfig(n_layers=2, d_model=64, n_heads=2, ffn="gelu", norm="layernorm", bias=True,
                    tie_embeddings=False, positions="learned", vocab_size=256, max_seq_len=64),
    ],
)  # fmt: skip
def test_every_parameter_std_matches_scheme(cfg, scheme):
    model = _model(cfg, scheme)
    # the scheme written out by hand (GPT-2's, docs/design.md §10), not read from the code:
    # every matrix and embedding N(0, 0.02^2); the scaled scheme divides W_O and W_down by
    # sqrt(2L); norm gains 1, biases 0
    writer = 0.02 / math.sqrt(2 * cfg.n_layers) if scheme == "scaled" else 0.02
    table = {**dict.fromkeys(("embed", "pos", "q", "k", "v", "gate", "up", "head"), 0.02),
             "o": writer, "down": writer, "norm": 1.0, "bias": 0.0}  # fmt: skip
    seen = set()
    for name, p in model.named_parameters():
        role, _ = role_of(name)
        seen.add(role)
        expected = table[role]
        x = p.detach().double().flatten()
        if role not in ("norm", "bias"):  # drawn: every matrix and embedding
            n = x.numel()
            # sample std of n N(0, s^2) draws: relative standard error 1/sqrt(2n); 5 sigma
            assert x.std().item() / expected == pytest.approx(1.0, abs=5 / math.sqrt(2 * n)), name
            assert abs(x.mean().item()) < 5 * expected / math.sqrt(n), name
        else:
            assert torch.all(x == expected), name
    assert "o" in seen and "down" in seen and "q" in seen


def test_scaled_changes_exactly_o_and_down():
    cfg = WIDE
    naive, scaled = _model(cfg, "naive"), _model(cfg, "scaled")
    factor = 1 / math.sqrt(2 * cfg.n_layers)
    hits = []
    for (name, p), (name2, q) in zip(naive.named_parameters(), scaled.named_parameters(), strict=True):
        assert name == name2
        if torch.equal(p, q):
            continue
        # shared draws: the scaled weight is the naive one times 1/sqrt(2L), exactly up to rounding
        torch.testing.assert_close(q, p * factor, rtol=1e-12, atol=0)
        hits.append(name)
    expected = [f"blocks.{i}.{m}" for i in range(cfg.n_layers) for m in ("attn.o.weight", "ffn.down.weight")]
    assert sorted(hits) == sorted(expected)


def test_gelu_ffn_roles_are_up_and_down():
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=2, ffn="gelu")
    names = {n for n, _ in build_block(cfg, InitConfig(), 0).named_parameters()}
    assert {"ffn.up.weight", "ffn.down.weight"} <= names
    assert role_of("ffn.up.weight")[0] == "up" and role_of("ffn.down.weight")[0] == "down"


def test_unknown_parameter_name_is_an_error():
    with pytest.raises(KeyError):
        role_of("blocks.0.attn.c_proj.weight")


def test_draws_depend_on_seed_layer_and_role_only():
    cfg = WIDE
    a = build_block(cfg, InitConfig(seed=1), 2)
    b = build_block(cfg, InitConfig(seed=1), 2)
    c = build_block(cfg, InitConfig(seed=2), 2)
    d = build_block(cfg, InitConfig(seed=1), 3)
    assert torch.equal(a.attn.q.weight, b.attn.q.weight)
    assert not torch.equal(a.attn.q.weight, c.attn.q.weight)
    assert not torch.equal(a.attn.q.weight, d.attn.q.weight)
    assert not torch.equal(a.attn.q.weight, a.attn.k.weight)


def test_inv_sqrt_d_and_embed_std():
    cfg = WIDE
    model = _model(cfg, "naive", sigma="inv-sqrt-d", embed_std=1.0)
    q = model.blocks[0].attn.q.weight
    n = q.numel()
    assert q.std().item() * math.sqrt(cfg.d_model) == pytest.approx(1.0, abs=5 / math.sqrt(2 * n))
    e = model.embed.weight
    assert e.std().item() == pytest.approx(1.0, abs=5 / math.sqrt(2 * e.numel()))
