"""The memory peer of bench_memory_points.py and bench_grad_norms_memory.py, independent
of tinit: for each point and configuration, a Hugging Face LlamaForCausalLM of the shape
of tinit's default model (d 256, 4 heads, d_ff 704, vocab 1024, RMSNorm, RoPE) built from
its config, one forward of 8 x 128 random tokens without gradients with hooks recording
the stream and branch variances (what `tinit variance` measures), then, unless
``--no-grads``, one forward with the block outputs' gradients retained, the next-token
loss, one backward and every parameter's gradient norm. After each point (a depth and
seed), the resident memory once the collector and glibc's malloc_trim have run.

    python benchmarks/_hf_grads_peer.py --layers 12,24,48 --seeds 2 --configs 4 [--no-grads]

Prints one line per point, ``point L=.. seed=.. rss_mib ..``."""

import argparse
import ctypes
import gc
import os

os.environ["HF_HUB_OFFLINE"] = "1"
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.utils import logging  # noqa: E402

logging.set_verbosity_error()


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def hooks(model, stats, keep):
    for layer in model.model.layers:

        def pre(module, args, kwargs, layer=layer):
            layer.inputs = args[0] if args else kwargs["hidden_states"]

        def attn_out(module, args, output, layer=layer):
            with torch.no_grad():
                stats.append(torch.stack([layer.inputs.var(), output[0].var()]))

        def block_out(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            if out.requires_grad:
                out.retain_grad()
                keep.append(out)

        layer.register_forward_pre_hook(pre, with_kwargs=True)
        layer.self_attn.register_forward_hook(attn_out)
        layer.register_forward_hook(block_out)


def point(L: int, seed: int, configs: int, grads: bool) -> None:
    cfg = LlamaConfig(num_hidden_layers=L, hidden_size=256, num_attention_heads=4, intermediate_size=704,
                      vocab_size=1024, max_position_embeddings=128, use_cache=False)  # fmt: skip
    tokens = torch.randint(1024, (8, 128), generator=torch.Generator().manual_seed(seed))
    for c in range(configs):
        torch.manual_seed(seed * 100 + c)
        stats, keep = [], []
        model = LlamaForCausalLM(cfg)
        hooks(model, stats, keep)
        with torch.no_grad():
            model(tokens)
        if grads:
            logits = model(tokens).logits[:, :-1]
            loss = F.cross_entropy(logits.reshape(-1, 1024), tokens[:, 1:].reshape(-1))
            loss.backward()
            [float(p.grad.norm()) for p in model.parameters() if p.grad is not None]
            [float(t.grad.pow(2).mean()) for t in keep if t.grad is not None]
        torch.stack(stats).tolist()
        del model, stats, keep
        gc.collect()  # the hooks' closures and the layers they name form cycles: free them now


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="12,24,48")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--configs", type=int, default=4)
    ap.add_argument("--no-grads", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    trim = ctypes.CDLL("libc.so.6").malloc_trim
    for L in (int(x) for x in args.layers.split(",")):
        for s in range(args.seeds):
            point(L, s, args.configs, not args.no_grads)
            gc.collect()
            trim(0)
            print(f"point L={L} seed={s} rss_mib {rss_mib():.0f}", flush=True)


if __name__ == "__main__":
    main()
