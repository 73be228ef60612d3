"""The independent peer of bench_variance_cpu.py: a minimal pre/post-norm transformer in
plain torch (nothing from tinit) doing the four forwards of a default `tinit variance`
run, naive and depth-scaled (W_O, W_down at sigma / sqrt(2L)) x pre- and post-norm, at
d 256, 4 heads, SwiGLU (d_ff 704), RMSNorm, RoPE, causal attention, batch 8 x seq 128,
vocab 1024. Each block's weights are drawn just before it runs (normal_ from a seeded
generator) and dropped after, as a streamed run does; no probe, no CSV, no figure.

    OMP_NUM_THREADS=1 python benchmarks/_variance_peer.py [LAYERS]
"""

import math
import sys

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
L = int(sys.argv[1]) if len(sys.argv) > 1 else 80
D, H, FF, V, B, T, SIGMA = 256, 4, 704, 1024, 8, 128, 0.02
HD = D // H


def rope(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    freq = 1.0 / 10000 ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD)
    ang = torch.outer(torch.arange(t, dtype=torch.float64), freq)
    return ang.cos().float(), ang.sin().float()


def rotate(x, cos, sin):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


def weights(layer: int, out_std: float, gen: torch.Generator) -> dict:
    gen.manual_seed(1000 + layer)
    shapes = {"q": (D, D), "k": (D, D), "v": (D, D), "o": (D, D), "gate": (FF, D), "up": (FF, D),
              "down": (D, FF)}  # fmt: skip
    return {n: torch.empty(s).normal_(0.0, out_std if n in ("o", "down") else SIGMA, generator=gen)
            for n, s in shapes.items()}  # fmt: skip


def block(x, w, post: bool, cos, sin):
    def attn(h):
        q, k, v = (F.linear(h, w[n]).view(B, T, H, HD).transpose(1, 2) for n in "qkv")
        y = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True)
        return F.linear(y.transpose(1, 2).reshape(B, T, D), w["o"])

    def ffn(h):
        return F.linear(F.silu(F.linear(h, w["gate"])) * F.linear(h, w["up"]), w["down"])

    norm = lambda h: F.rms_norm(h, (D,), eps=1e-5)  # noqa: E731 (unit gains)
    for f in (attn, ffn):
        x = norm(x + f(x)) if post else x + f(norm(x))
    return x


def main() -> None:
    gen = torch.Generator()
    tokens = torch.randint(0, V, (B, T), generator=gen.manual_seed(0))
    cos, sin = rope(T)
    with torch.no_grad():
        for post in (False, True):
            for out_std in (SIGMA, SIGMA / math.sqrt(2 * L)):
                embed = torch.empty(V, D).normal_(0.0, 1.0, generator=gen.manual_seed(1))
                x = F.embedding(tokens, embed)
                for layer in range(L):
                    x = block(x, weights(layer, out_std, gen), post, cos, sin)
                assert torch.isfinite(x).all()


main()
