"""The peer of bench_coord_check.py: the same training runs as the default `tinit
coord-check --init gpt2,mup` (tinit's model and each scheme's optimizer groups, the same
fixed Markov batch per seed, 5 forwards and 4 AdamW steps), written as a bare loop: no
probe, no RMS, no fit, no CSV, no figure, no run folder.

    python benchmarks/_coord_peer.py [widths=64,128,256,512] [depths=2,8] [seeds=3] [inits=gpt2,mup]"""

import sys

import torch
import torch.nn.functional as F

from tinit.experiments.training.data import load_data
from tinit.model.config import InitConfig, ModelConfig
from tinit.model.param_rules import optimizer_groups
from tinit.model.transformer import Transformer


def main() -> None:
    kw = dict(a.split("=", 1) for a in sys.argv[1:])
    widths = [int(x) for x in kw.get("widths", "64,128,256,512").split(",")]
    depths = [int(x) for x in kw.get("depths", "2,8").split(",")]
    inits, seeds = kw.get("inits", "gpt2,mup").split(","), int(kw.get("seeds", 3))
    torch.set_num_threads(1)
    for init in inits:
        for L in depths:
            for d in widths:
                for seed in range(seeds):
                    cfg = ModelConfig(n_layers=L, d_model=d, n_heads=4, vocab_size=256, max_seq_len=32)
                    data = load_data("markov", vocab=256, seq_len=32, batch=4, seed=0, eval_batches=1)
                    data.reset(seed)
                    batch = data.next_batch()
                    net = Transformer(cfg, InitConfig(scheme=init, seed=seed))
                    opt = torch.optim.AdamW(optimizer_groups(net, lr=1e-2), lr=1e-2, weight_decay=0.0)
                    for step in range(5):
                        with torch.set_grad_enabled(step < 4):
                            logits = net(batch[:, :-1])
                            if step < 4:
                                loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
                                opt.zero_grad(set_to_none=True)
                                loss.backward()
                                opt.step()


if __name__ == "__main__":
    main()
