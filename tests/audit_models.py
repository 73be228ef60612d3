"""User-module factories for the `tinit audit --module` tests (the documented contract:
factory() -> nn.Module mapping token ids (batch, seq) to logits (batch, seq, vocab))."""

import torch
import torch.nn.functional as F
from torch import nn

from tinit.model.config import InitConfig, ModelConfig
from tinit.model.transformer import Transformer

#: The shape `tinit variance` is run at in the tests (tests/test_audit_module.py TINY).
TINIT_SHAPE = {"n_layers": 2, "d_model": 16, "n_heads": 2, "vocab_size": 32, "max_seq_len": 8}


def tinit_model() -> Transformer:
    """tinit's own model, naive pre-norm, exactly as `tinit variance --init naive --pre-norm` builds it."""
    return Transformer(ModelConfig(**TINIT_SHAPE), InitConfig(scheme="naive"))


def tinit_post_model() -> Transformer:
    """tinit's own model, depth-scaled post-norm."""
    return Transformer(ModelConfig(**TINIT_SHAPE, norm_position="post"), InitConfig(scheme="scaled"))


class _Attn(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class _Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = _Attn(d, heads)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d, bias=False), nn.GELU(), nn.Linear(4 * d, d, bias=False))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """A small pre-norm LM with no tinit or HF structure: the generic finder's case."""

    def __init__(self, vocab=48, d=16, heads=2, layers=3):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        x = self.wte(tokens)
        for block in self.layers:
            x = block(x)
        return self.head(self.norm(x))


def _init_normal(model: nn.Module, std: float = 0.02) -> nn.Module:
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear | nn.Embedding):
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * std)
    return model


def good_model() -> TinyLM:
    """Every matrix N(0, 0.02^2), norms at 1 and 0: naive at 0.02."""
    torch.manual_seed(0)
    return _init_normal(TinyLM())


def broken_model() -> TinyLM:
    """As good_model, but layers.1.mlp.0 (an nn.Linear) left at PyTorch's default init
    and layers.0.attn.out.weight all zeros."""
    model = good_model()
    torch.manual_seed(1)
    model.layers[1].mlp[0] = nn.Linear(16, 64, bias=False)  # reset_parameters: kaiming-uniform
    with torch.no_grad():
        model.layers[0].attn.out.weight.zero_()
    return model


def off_scheme_model() -> TinyLM:
    """As good_model, but layers.2.mlp.2.weight drawn at std 0.05 instead of 0.02."""
    model = good_model()
    with torch.no_grad():
        model.layers[2].mlp[2].weight.mul_(2.5)
    return model


def constant_model() -> TinyLM:
    """As good_model, but layers.1.attn.qkv.weight every element 0.01."""
    model = good_model()
    with torch.no_grad():
        model.layers[1].attn.qkv.weight.fill_(0.01)
    return model


def non_finite_model() -> TinyLM:
    """As good_model, but one NaN in layers.0.mlp.0.weight."""
    model = good_model()
    with torch.no_grad():
        model.layers[0].mlp[0].weight[3, 5] = float("nan")
    return model


class _Broken(TinyLM):
    def forward(self, tokens):
        raise RuntimeError("shape mismatch in my model")


def bad_forward() -> TinyLM:
    """A module whose forward raises: the audit must say so in one line."""
    return _Broken()
