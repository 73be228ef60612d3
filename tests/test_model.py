"""Guards the model's pieces against their definitions: RMSNorm and LayerNorm
formulas, the 1/sqrt(d_h) attention scale, causal masking, RoPE as a rotation,
pre-/post-norm wiring through the probe, and streamed == fully built."""

import math

import pytest
import torch
import torch.nn.functional as F

from tinit.model.config import InitConfig, ModelConfig
from tinit.model.layers import Attention, apply_rope, make_norm, rope_cache
from tinit.model.transformer import Transformer, build_block


def test_rmsnorm_formula():
    cfg = ModelConfig(d_model=16, n_heads=2)
    norm = make_norm(cfg)
    x = torch.randn(3, 5, 16) * 3 + 1
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(norm(x), expected)
    assert sum(p.numel() for p in norm.parameters()) == 16


def test_layernorm_formula():
    cfg = ModelConfig(d_model=16, n_heads=2, norm="layernorm")
    norm = make_norm(cfg)
    x = torch.randn(3, 5, 16) * 3 + 1
    mu = x.mean(-1, keepdim=True)
    var = x.var(-1, correction=0, keepdim=True)
    torch.testing.assert_close(norm(x), (x - mu) / torch.sqrt(var + 1e-6))
    assert sum(p.numel() for p in norm.parameters()) == 32


def _attention_reference(attn: Attention, x: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    b, t, d = x.shape
    h, dh = attn.n_heads, attn.head_dim
    q = attn.q(x).view(b, t, h, dh).transpose(1, 2)
    k = attn.k(x).view(b, t, h, dh).transpose(1, 2)
    v = attn.v(x).view(b, t, h, dh).transpose(1, 2)
    logits = q @ k.transpose(-1, -2) * scale
    if causal:
        logits = logits.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -math.inf)
    y = F.softmax(logits, -1) @ v
    return attn.o(y.transpose(1, 2).reshape(b, t, d))


@pytest.mark.parametrize("attn_scale", [True, False])
@pytest.mark.parametrize("attention", ["causal", "bidirectional"])
def test_attention_matches_reference(attn_scale, attention):
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=4, attn_scale=attn_scale, attention=attention,
                      positions="none")  # fmt: skip
    block = build_block(cfg, InitConfig(sigma=0.2), 0, dtype=torch.float64)
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    scale = 1 / math.sqrt(cfg.head_dim) if attn_scale else 1.0
    expected = _attention_reference(block.attn, x, scale, attention == "causal")
    torch.testing.assert_close(block.attn(x, None), expected)


def test_causal_attention_ignores_the_future():
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=4)
    model = Transformer(cfg, InitConfig(sigma=0.2), dtype=torch.float64)
    tokens = torch.randint(0, cfg.vocab_size, (1, 10))
    changed = tokens.clone()
    changed[0, 7:] = (changed[0, 7:] + 1) % cfg.vocab_size
    a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_rope_is_a_norm_preserving_rotation():
    cos, sin = rope_cache(12, 8, 10000.0, dtype=torch.float64)
    x = torch.randn(2, 3, 12, 8, dtype=torch.float64)
    y = apply_rope(x, cos, sin)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y[..., 0, :], x[..., 0, :])  # position 0: angle 0


def test_rope_logits_depend_on_relative_position():
    cos, sin = rope_cache(16, 8, 10000.0, dtype=torch.float64)
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    qs = apply_rope(q.expand(16, 8), cos, sin)
    ks = apply_rope(k.expand(16, 8), cos, sin)
    torch.testing.assert_close((qs[5] * ks[3]).sum(), (qs[12] * ks[10]).sum())


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, k, layer, sublayer, stream_in, branch, stream_out, normed=None):
        self.calls.append((k, layer, sublayer, stream_in, branch, stream_out, normed))


@pytest.mark.parametrize("position", ["pre", "post"])
def test_probe_sees_every_addition_with_explicit_sums(position):
    cfg = ModelConfig(n_layers=3, d_model=32, n_heads=2, norm_position=position, vocab_size=50)
    model = Transformer(cfg, InitConfig(), dtype=torch.float64)
    rec = Recorder()
    tokens = torch.randint(0, 50, (2, 8))
    out = model.forward_stream(tokens, rec)
    assert [c[0] for c in rec.calls] == list(range(2 * cfg.n_layers + 1))
    assert [c[2] for c in rec.calls[1:]] == ["attn", "ffn"] * cfg.n_layers
    assert [c[1] for c in rec.calls] == [-1] + [i // 2 for i in range(2 * cfg.n_layers)]
    for _k, _, _, x_in, f, s, normed in rec.calls[1:]:
        torch.testing.assert_close(s, x_in + f)
        if position == "post":
            # the normalised sum is what the next addition receives
            torch.testing.assert_close(normed, model.blocks[0].norm1(s))
        else:
            assert normed is None
    last = rec.calls[-1]
    torch.testing.assert_close(out, last[6] if position == "post" else last[5])
    # the stream entering addition k is what left addition k-1
    for prev, cur in zip(rec.calls[:-1], rec.calls[1:], strict=True):
        expected_in = prev[6] if (position == "post" and prev[0] > 0) else prev[5]
        torch.testing.assert_close(cur[3], expected_in)


def test_model_without_probe_is_a_plain_model():
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2, vocab_size=50)
    model = Transformer(cfg, InitConfig(), dtype=torch.float64)
    tokens = torch.randint(0, 50, (2, 8))
    torch.testing.assert_close(model(tokens), model(tokens, Recorder()))
    assert model(tokens).shape == (2, 8, 50)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"norm_position": "post", "norm": "layernorm", "ffn": "gelu"},
        {"positions": "learned", "tie_embeddings": False, "bias": True, "attention": "bidirectional"},
        {"branch": "gaussian", "branch_var": 0.3},
    ],
)
def test_streamed_equals_fully_built(kw):
    cfg = ModelConfig(n_layers=4, d_model=32, n_heads=2, vocab_size=50, max_seq_len=8, **kw)
    init = InitConfig(scheme="scaled", seed=11)
    tokens = torch.randint(0, 50, (2, 8))
    built = Transformer(cfg, init, stream=False)
    streamed = Transformer(cfg, init, stream=True)
    assert len(streamed.blocks) == 0 and len(built.blocks) == cfg.n_layers
    with torch.no_grad():
        assert torch.equal(built(tokens), streamed(tokens))


def test_tied_head_reuses_embedding():
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=2, vocab_size=50)
    tied = Transformer(cfg, InitConfig())
    untied = Transformer(ModelConfig(n_layers=1, d_model=32, n_heads=2, vocab_size=50, tie_embeddings=False),
                         InitConfig())  # fmt: skip
    n_tied = sum(p.numel() for p in tied.parameters())
    n_untied = sum(p.numel() for p in untied.parameters())
    assert tied.head is None and n_untied - n_tied == 50 * 32
