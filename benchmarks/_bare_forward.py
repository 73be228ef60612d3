"""The baseline of bench_variance_cpu.py: build the four models of a default
`tinit variance` run (naive/scaled x pre/post-norm) and run one forward pass each,
with no probe, no CSV and no plot. Same shapes, dtype, tokens and weights."""

import sys

import torch

from tinit.experiments.device import make_tokens
from tinit.model.config import InitConfig, ModelConfig, RunConfig
from tinit.model.transformer import Transformer

layers = int(sys.argv[1]) if len(sys.argv) > 1 else 80
run = RunConfig()
for norm_position in ("pre", "post"):
    for scheme in ("naive", "scaled"):
        cfg = ModelConfig(n_layers=layers, norm_position=norm_position)
        init = InitConfig(scheme=scheme)
        model = Transformer(cfg, init, "cpu", torch.float32, stream=True)
        tokens = make_tokens(cfg, run, init.seed, torch.device("cpu"))
        with torch.no_grad():
            model.forward_stream(tokens)
