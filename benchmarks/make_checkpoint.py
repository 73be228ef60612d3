"""Write a Llama-shaped Hugging Face folder of random bf16 weights, shard by shard, as a
user's downloaded checkpoint is laid out (config.json, model-0000i-of-0000N.safetensors,
model.safetensors.index.json), without ever holding the model: each shard's tensors are
drawn, saved with ``safetensors.torch.save_file`` and dropped before the next shard.

    python benchmarks/make_checkpoint.py --shape llama-1b --out benchmarks/out/ckpt-1b
    python benchmarks/make_checkpoint.py --shape llama-8b --out /somewhere/ckpt-8b   # ~15 GiB
    python benchmarks/make_checkpoint.py --shape llama-1b --layers 64 --vocab 1024 --out DIR

Shapes (their published configs): llama-1b is Llama-3.2-1B (16 layers, d 2048, d_ff 8192,
32/8 heads, vocab 128256, tied head: 2.3 GiB in bf16); llama-8b is Llama-3-8B (32 layers,
d 4096, d_ff 14336, 32/8 heads, vocab 128256, untied: 15 GiB). ``--layers``, ``--d-model``,
``--d-ff`` and ``--vocab`` scale a shape (the memory-flatness benchmarks). Weights are
N(0, 0.02) (transformers' initializer_range), norm gains 1; seeded, so a folder is the same
bytes each time on the same device (``--device cuda`` draws on a GPU: other numbers, same
law). An existing complete folder of the same shape is kept (``--force`` redoes it).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

SHAPES = {
    "llama-1b": {"num_hidden_layers": 16, "hidden_size": 2048, "intermediate_size": 8192,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                 "tie_word_embeddings": True, "max_position_embeddings": 131072, "rope_theta": 500000.0,
                 "head_dim": 64},
    "llama-8b": {"num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                 "tie_word_embeddings": False, "max_position_embeddings": 8192, "rope_theta": 500000.0,
                 "head_dim": 128},
}  # fmt: skip


def config_of(shape: str, layers: int | None, d: int | None, d_ff: int | None, vocab: int | None) -> dict:
    c = dict(SHAPES[shape])
    if layers:
        c["num_hidden_layers"] = layers
    if d:
        c["hidden_size"] = d
        c["head_dim"] = d // c["num_attention_heads"]
    if d_ff:
        c["intermediate_size"] = d_ff
    if vocab:
        c["vocab_size"] = vocab
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "rms_norm_eps": 1e-5, "initializer_range": 0.02, "attention_bias": False, "mlp_bias": False,
            "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16", **c}  # fmt: skip


def tensors(c: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Every stored tensor of the Llama of config ``c``, in the order HF saves them."""
    d, ff, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd, h, kv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    out = [("model.embed_tokens.weight", (V, d))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (d,)), (p + "mlp.down_proj.weight", (d, ff)),
                (p + "mlp.gate_proj.weight", (ff, d)), (p + "mlp.up_proj.weight", (ff, d)),
                (p + "post_attention_layernorm.weight", (d,)), (p + "self_attn.k_proj.weight", (kv * hd, d)),
                (p + "self_attn.o_proj.weight", (d, h * hd)), (p + "self_attn.q_proj.weight", (h * hd, d)),
                (p + "self_attn.v_proj.weight", (kv * hd, d))]  # fmt: skip
    out.append(("model.norm.weight", (d,)))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, d)))
    return out


def write(out: Path, c: dict, shard_bytes: int, seed: int, force: bool, device: str = "cpu") -> None:
    import torch
    from safetensors.torch import save_file

    specs = tensors(c)
    total = sum(math.prod(s) * 2 for _, s in specs)
    index = out / "model.safetensors.index.json"
    if index.is_file() and not force:
        doc = json.loads(index.read_text())
        if doc.get("metadata", {}).get("total_size") == total and json.loads(
            (out / "config.json").read_text()) == c:  # fmt: skip
            print(f"{out}: kept (complete, {total / 2**30:.2f} GiB)")
            return
    out.mkdir(parents=True, exist_ok=True)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in specs:
        b = math.prod(shape) * 2
        if shards[-1] and size + b > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += b
    n = len(shards)
    gen = torch.Generator(device=device).manual_seed(seed)
    wmap = {}
    t0 = time.perf_counter()
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{n:05d}.safetensors"
        part = {}
        for name, shape in shard:
            if len(shape) == 1:
                part[name] = torch.ones(shape, dtype=torch.bfloat16)
            else:  # (drawn in row blocks of float32: never a whole float32 table)
                t = torch.empty(shape, dtype=torch.bfloat16)
                for r in range(0, shape[0], 4096):
                    rows = t[r : r + 4096]
                    rows.copy_(torch.randn(rows.shape, generator=gen, device=device).mul_(0.02))
                part[name] = t
            wmap[name] = fname
        save_file(part, str(out / fname), metadata={"format": "pt"})
        del part
        print(f"  {fname} ({i}/{n}, {time.perf_counter() - t0:.0f} s)", flush=True)
    (out / "config.json").write_text(json.dumps(c, indent=2))
    index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wmap}, indent=2))
    print(f"{out}: {n} shards, {total / 2**30:.2f} GiB, {time.perf_counter() - t0:.0f} s")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-1b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--d-model", type=int)
    ap.add_argument("--d-ff", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--shard-mib", type=int, default=150, help="about this many MiB a shard (default 150)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--device", default="cpu", help="where the numbers are drawn (cuda: a GPU's, fast)")
    a = ap.parse_args(argv)
    c = config_of(a.shape, a.layers, a.d_model, a.d_ff, a.vocab)
    write(Path(a.out), c, a.shard_mib << 20, a.seed, a.force, a.device)


if __name__ == "__main__":
    sys.exit(main())
