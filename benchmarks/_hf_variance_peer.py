"""The peer of bench_variance_hf.py, independent of tinit: a Hugging Face LlamaModel of
the shape of `tinit variance --layers 80 --pre-norm` (d 256, 4 heads, d_ff 704, vocab
1024, RoPE, RMSNorm), built from its config, one forward of 8 x 128 random tokens with
forward hooks that record, at each of the 2L additions, the variance of the stream
entering it, of the branch and of their sum, and their covariance (on the host once,
at the end). No CSV, no plot."""

import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaModel  # noqa: E402
from transformers.utils import logging  # noqa: E402

logging.set_verbosity_error()
layers = int(sys.argv[1]) if len(sys.argv) > 1 else 80
torch.manual_seed(0)
cfg = LlamaConfig(
    num_hidden_layers=layers,
    hidden_size=256,
    num_attention_heads=4,
    intermediate_size=704,
    vocab_size=1024,
    max_position_embeddings=128,
    use_cache=False,
    attn_implementation="sdpa",
)
model = LlamaModel(cfg).eval()
stats = []


def record(stream_in, branch):
    s = stream_in + branch
    stats.append(
        torch.stack(
            [
                stream_in.var(),
                branch.var(),
                s.var(),
                ((stream_in - stream_in.mean()) * (branch - branch.mean())).mean(),
            ]
        )
    )


def layer_hook(layer):
    def pre(module, args, kwargs):
        layer.inputs = args[0] if args else kwargs["hidden_states"]

    def attn_out(module, args, output):
        record(layer.inputs, output[0])
        layer.mid = layer.inputs + output[0]

    def mlp_out(module, args, output):
        record(layer.mid, output)

    layer.register_forward_pre_hook(pre, with_kwargs=True)
    layer.self_attn.register_forward_hook(attn_out)
    layer.mlp.register_forward_hook(mlp_out)


for layer in model.layers:
    layer_hook(layer)
tokens = torch.randint(cfg.vocab_size, (8, 128), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    model(tokens)
table = torch.stack(stats).tolist()
assert len(table) == 2 * layers
