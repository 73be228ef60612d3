"""Measure the per-role weight stds of Hugging Face's Gemma 2 and Gemma 3 as their own
code initialises them, at the shape of shared/upstream/init-stds-L12-d768.csv.

Built offline from configs on the CPU (``AutoModelForCausalLM.from_config``, nothing is
downloaded): L = 12, d = 768, 12 heads of 64 (key/value heads 12), d_ff 2048,
V = 1024, untied head, initializer_range 0.02. One row per (scheme, role, layer in
{0, 11}), the embedding at layer -1 and the head at 12, plus the norm gains' values;
``std`` is the measured std of the weights (HF draws N(0, initializer_range) and
zeroes the padding row of the embedding), ``value`` a constant's value (the norm gains'
w, applied as 1 + w; Gemma 3's q_norm too).

Run from the repository root (the committed CSV came from this command):

    python scripts/measure_gemma_init.py > tests/data/gemma-init-stds-L12-d768.csv
"""

from __future__ import annotations

import csv
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig

SHAPE = {
    "num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "num_key_value_heads": 12,
    "head_dim": 64, "intermediate_size": 2048, "vocab_size": 1024, "tie_word_embeddings": False,
    "initializer_range": 0.02,
}  # fmt: skip
#: HF parameter name inside a decoder layer -> tinit role.
ROLES = {"self_attn.q_proj.weight": "q", "self_attn.k_proj.weight": "k", "self_attn.v_proj.weight": "v",
         "self_attn.o_proj.weight": "o", "mlp.gate_proj.weight": "gate", "mlp.up_proj.weight": "up",
         "mlp.down_proj.weight": "down", "input_layernorm.weight": "norm",
         "post_attention_layernorm.weight": "norm", "self_attn.q_norm.weight": "norm"}  # fmt: skip
SOURCE = f"huggingface/transformers@v{transformers.__version__} models/{{family}}/modeling_{{family}}.py"


def rows(name: str, family: str, config) -> list[dict]:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float()
    params = dict(model.named_parameters())
    out = []

    def add(role: str, layer: int, param: str) -> None:
        w = params[param].detach().to(torch.float64)
        const = role == "norm" or bool((w == w.flatten()[0]).all())
        out.append({"scheme": name, "param": param, "role": role, "layer": layer,
                    "shape": "x".join(map(str, w.shape)),
                    "distribution": "const" if const else "normal",
                    "std": "" if const else repr(float(w.std(unbiased=False))),
                    "value": repr(float(w.flatten()[0])) if const else "",
                    "source": SOURCE.format(family=family)})  # fmt: skip

    add("embed", -1, "model.embed_tokens.weight")
    for layer in (0, 11):
        for suffix, role in ROLES.items():
            if f"model.layers.{layer}.{suffix}" in params:  # q_norm: Gemma 3 only
                add(role, layer, f"model.layers.{layer}.{suffix}")
    add("head", 12, "lm_head.weight")
    return out


def main() -> None:
    out = rows("gemma2", "gemma2", Gemma2Config(**SHAPE)) + rows(
        "gemma3", "gemma3", Gemma3TextConfig(**SHAPE)
    )
    writer = csv.DictWriter(sys.stdout, fieldnames=list(out[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(out)


if __name__ == "__main__":
    main()
