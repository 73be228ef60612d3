"""The peer of bench_audit_hf.py, independent of tinit: what one writes by hand to audit
a Hugging Face model's init. A LlamaForCausalLM built from its config (8 layers, d 256,
d_ff 688, 4 heads, the default 32000-token vocabulary) with its own _init_weights; every
parameter's std; one forward of 8 x 128 random tokens with forward hooks recording the
variance of the stream, the branch and their sum at each of the 2L additions; the
next-token loss, one backward, every parameter's gradient norm. No CSV, no plot."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402
from transformers.utils import logging  # noqa: E402

logging.set_verbosity_error()
cfg = LlamaConfig(
    num_hidden_layers=8, hidden_size=256, intermediate_size=688, num_attention_heads=4, use_cache=False
)
model = AutoModelForCausalLM.from_config(cfg)
stds = {name: float(p.detach().std()) if p.numel() > 1 else float(p) for name, p in model.named_parameters()}
stats = []


def record(stream_in, branch):
    with torch.no_grad():
        s = stream_in + branch
        stats.append(torch.stack([stream_in.var(), branch.var(), s.var()]))


def hook(layer):
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


for layer in model.model.layers:
    hook(layer)
tokens = torch.randint(cfg.vocab_size, (8, 128), generator=torch.Generator().manual_seed(0))
logits = model(tokens).logits[:, :-1]
loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
loss.backward()
grad_norms = {name: float(p.grad.norm()) for name, p in model.named_parameters() if p.grad is not None}
variances = torch.stack(stats).tolist()
assert len(variances) == 16 and len(grad_norms) == len(stds)
