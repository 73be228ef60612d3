"""The peer of bench_lr_sweep.py: the training runs of the default `tinit lr-sweep`
(scaled init, pre- and post-norm, L = 2, 4, 8, lr 1e-3, 3e-3, 1e-2, 3e-2, 200 AdamW steps
with warmup 30 and cosine decay, gradient clipping, d = 48, 4 heads, the 64-token Markov
language, batch 16 x 32, the held-out loss every 25 steps) as a bare loop: tinit's model
and optimizer groups, no update ratios, no variance probes, no summary, no optima, no
CSV, no figure, no run folder.

    python benchmarks/_lr_sweep_peer.py [depths=2,4,8] [lrs=1e-3,3e-3,1e-2,3e-2] [steps=200]"""

import sys

import torch
import torch.nn.functional as F

from tinit.experiments.training.data import load_data
from tinit.experiments.training.trainer import lr_factor
from tinit.model.config import InitConfig, ModelConfig
from tinit.model.param_rules import optimizer_groups
from tinit.model.transformer import Transformer


def main() -> None:
    kw = dict(a.split("=", 1) for a in sys.argv[1:])
    depths = [int(x) for x in kw.get("depths", "2,4,8").split(",")]
    lrs = [float(x) for x in kw.get("lrs", "1e-3,3e-3,1e-2,3e-2").split(",")]
    steps, warmup = int(kw.get("steps", 200)), 30
    data = load_data("markov", vocab=64, seq_len=32, batch=16, seed=0, eval_batches=4)
    evals = data.eval_batches()
    for pos in ("pre", "post"):
        for L in depths:
            for lr in lrs:
                cfg = ModelConfig(n_layers=L, d_model=48, n_heads=4, vocab_size=64, max_seq_len=128,
                                  norm_position=pos)  # fmt: skip
                net = Transformer(cfg, InitConfig(scheme="scaled", seed=0))
                groups = optimizer_groups(net, lr=lr, weight_decay=0.1)
                opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))
                sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, warmup, steps, 0.1))
                data.reset(0)
                for step in range(1, steps + 1):
                    batch = data.next_batch()
                    loss = F.cross_entropy(net(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
                    opt.step()
                    sched.step()
                    if step % 25 == 0 or step == steps:
                        with torch.no_grad():
                            for b in evals:
                                float(F.cross_entropy(net(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten()))


if __name__ == "__main__":
    main()
