"""Named shapes of well-known models, as data (``--preset NAME`` on every command).

A preset sets *shapes and architecture* only, as ``ModelConfig`` fields (layers,
width, heads, d_ff, vocabulary, norm, FFN, positions, tying, biases, K/V heads, RoPE
base, norm eps), and the context length that sizes the learned position table. It
does not set batch, sequence length, init or device, so a preset never forces a run
bigger than the command's defaults; options given on the command line override the
preset's values.

Shapes are the published configs:

- gpt2-small: nanoGPT ``GPTConfig``/``from_pretrained('gpt2')`` (n_layer 12,
  n_head 12, n_embd 768, block_size 1024, vocab 50257, bias, LayerNorm eps 1e-5,
  tied wte/lm_head, MLP 4d with GELU) -- Radford et al. 2019.
- llama2-7b / llama2-70b: Hugging Face ``meta-llama/Llama-2-{7b,70b}-hf`` config.json
  (hidden 4096 / 8192, intermediate 11008 / 28672, heads 32 / 64, KV heads 32 / 8,
  layers 32 / 80, vocab 32000, rms_norm_eps 1e-5, rope_theta 1e4, context 4096,
  untied lm_head) -- Touvron et al. 2023.
- llama3-8b: ``meta-llama/Meta-Llama-3-8B`` config.json (hidden 4096, intermediate
  14336, heads 32, KV heads 8, layers 32, vocab 128256, rope_theta 5e5, context 8192,
  rms_norm_eps 1e-5, untied) -- Llama 3 model card / Dubey et al. 2024.

``published_total`` is the exact parameter count of the real model (with its GQA);
the GQA presets set ``n_kv_heads`` (``--kv-heads``) so tinit builds and counts their
attention as it really is (``--kv-heads`` = ``--heads`` gives the multi-head variant).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Preset:
    """One named shape."""

    name: str
    description: str
    model: Mapping[str, Any]  # ModelConfig field -> value
    context: int  # the model's context length: sizes the learned position table / RoPE cache
    n_kv_heads: int | None = None  # K/V heads of the real model when it uses GQA (also in model)
    published_total: int | None = None  # exact parameter count of the real model
    note: str = ""


def _preset(name, description, model, context, **kw) -> Preset:
    return Preset(name, description, MappingProxyType(dict(model)), context, **kw)


_GQA_NOTE = (
    "the real model uses grouped-query attention with {kv} K/V heads; the preset sets --kv-heads {kv}, "
    "so tinit builds and counts W_K, W_V as d x ({kv} d_h)"
)

PRESETS: Mapping[str, Preset] = MappingProxyType(
    {
        p.name: p
        for p in (
            _preset(
                "gpt2-small",
                "GPT-2 small (124M): 12 x 768, 12 heads, LayerNorm, GELU 4d, learned positions, "
                "biases, tied head",
                {
                    "n_layers": 12,
                    "d_model": 768,
                    "n_heads": 12,
                    "d_ff": 3072,
                    "vocab_size": 50257,
                    "norm": "layernorm",
                    "ffn": "gelu",
                    "positions": "learned",
                    "tie_embeddings": True,
                    "bias": True,
                    "norm_eps": 1e-5,
                },  # fmt: skip
                context=1024,
                published_total=124_439_808,
            ),
            _preset(
                "llama2-7b",
                "Llama 2 7B: 32 x 4096, 32 heads, d_ff 11008, RMSNorm, SwiGLU, RoPE, untied head",
                {
                    "n_layers": 32,
                    "d_model": 4096,
                    "n_heads": 32,
                    "d_ff": 11008,
                    "vocab_size": 32000,
                    "norm": "rmsnorm",
                    "ffn": "swiglu",
                    "positions": "rope",
                    "tie_embeddings": False,
                    "bias": False,
                    "norm_eps": 1e-5,
                    "rope_base": 10000.0,
                },  # fmt: skip
                context=4096,
                published_total=6_738_415_616,
            ),
            _preset(
                "llama2-70b",
                "Llama 2 70B: 80 x 8192, 64 heads, d_ff 28672, RMSNorm, SwiGLU, RoPE, untied head "
                "and grouped-query attention (GQA) with 8 K/V heads (--kv-heads 8)",
                {
                    "n_layers": 80,
                    "d_model": 8192,
                    "n_heads": 64,
                    "d_ff": 28672,
                    "vocab_size": 32000,
                    "norm": "rmsnorm",
                    "ffn": "swiglu",
                    "positions": "rope",
                    "tie_embeddings": False,
                    "bias": False,
                    "n_kv_heads": 8,
                    "norm_eps": 1e-5,
                    "rope_base": 10000.0,
                },  # fmt: skip
                context=4096,
                n_kv_heads=8,
                note=_GQA_NOTE.format(kv=8),
                published_total=68_976_648_192,
            ),
            _preset(
                "llama3-8b",
                "Llama 3 8B: 32 x 4096, 32 heads, d_ff 14336, vocab 128256, RMSNorm, SwiGLU, "
                "RoPE base 500000, untied head, GQA with 8 K/V heads (--kv-heads 8)",
                {
                    "n_layers": 32,
                    "d_model": 4096,
                    "n_heads": 32,
                    "d_ff": 14336,
                    "vocab_size": 128256,
                    "norm": "rmsnorm",
                    "ffn": "swiglu",
                    "positions": "rope",
                    "tie_embeddings": False,
                    "bias": False,
                    "n_kv_heads": 8,
                    "norm_eps": 1e-5,
                    "rope_base": 500000.0,
                },  # fmt: skip
                context=8192,
                n_kv_heads=8,
                note=_GQA_NOTE.format(kv=8),
                published_total=8_030_261_248,
            ),
        )
    }
)


def get_preset(name: str) -> Preset:
    """The preset called ``name``; a KeyError names the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}") from None
