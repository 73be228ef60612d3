"""Time of one training step, drawing its batch included, at several vocabularies:
tinit's (the Markov language's next batch, then :class:`Trainer.step`: loss, backward,
clipping, AdamW, LR schedule, and the per-layer update ratios of W_O and W_down it
records) against a nanoGPT-style loop written here (its own sampler of the same chain:
the stationary distribution solved once, then a vectorised walk; loss, backward,
clipping, AdamW, scheduler, nothing recorded). Steps alternate in blocks, so both see
the same machine load; the table gives medians per step, tokens per second and the
ratio of medians, per vocabulary.

    python benchmarks/bench_train_cpu.py [--vocab 64,1024,4096] [--layers 4] [--d-model 48]
        [--blocks 15] [--steps 20]

Target (issue 20): ratio <= 1.05 at every vocabulary (issue 14's, without the data: 1.15).
"""

import argparse
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tinit.experiments.training.data import load_data  # noqa: E402
from tinit.experiments.training.trainer import TrainConfig, Trainer, lr_factor  # noqa: E402
from tinit.model.config import InitConfig, ModelConfig  # noqa: E402
from tinit.model.transformer import Transformer  # noqa: E402


class Bare:
    """The loop one would write by hand: same model, optimizer, clipping and schedule."""

    def __init__(self, model, train: TrainConfig):
        self.model = model
        params = list(model.parameters())
        decay = [p for p in params if p.dim() >= 2]
        rest = [p for p in params if p.dim() < 2]
        self.params = params
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": train.weight_decay}, {"params": rest, "weight_decay": 0.0}],
            lr=train.lr,
            betas=(train.beta1, train.beta2),
        )
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: lr_factor(s, train.warmup, train.steps, train.min_lr_ratio)
        )
        self.clip = train.grad_clip

    def step(self, batch):
        self.opt.zero_grad(set_to_none=True)
        logits = self.model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.opt.step()
        self.sched.step()
        return float(loss.detach())  # a real loop logs the loss too


class Sampler:
    """The peer's sampler of a sparse Markov chain (successor lists ``succ``, their
    probabilities ``prob``): pi from the dense balance equations (or the lazy chain's
    power iteration above 2048 states), solved once; windows start from pi."""

    def __init__(self, succ: np.ndarray, prob: np.ndarray, n: int, length: int, seed: int = 0):
        self.succ, self.n, self.length = succ, n, length
        self.cum = np.cumsum(prob, axis=1)
        self.cum[:, -1] = 1.0
        V = succ.shape[0]
        if V <= 2048:
            P = np.zeros((V, V))
            np.put_along_axis(P, succ, prob, axis=1)
            A = P.T - np.eye(V)
            A[-1] = 1.0
            self.pi = np.linalg.solve(A, np.eye(V)[-1])
        else:
            pi = np.full(V, 1.0 / V)
            for _ in range(100_000):
                new = 0.5 * (pi + np.bincount(succ.ravel(), (pi[:, None] * prob).ravel(), minlength=V))
                if np.abs(new - pi).sum() < 1e-14:
                    break
                pi = new
            self.pi = new
        self.pi = np.clip(self.pi, 0, None) / np.clip(self.pi, 0, None).sum()
        self.rng = np.random.default_rng(seed)

    def batch(self) -> torch.Tensor:
        out = np.empty((self.n, self.length), dtype=np.int64)
        out[:, 0] = self.rng.choice(len(self.pi), size=self.n, p=self.pi)
        u = self.rng.random((self.n, self.length - 1))
        for t in range(1, self.length):
            prev = out[:, t - 1]
            j = np.minimum((u[:, t - 1, None] > self.cum[prev]).sum(axis=1), self.succ.shape[1] - 1)
            out[:, t] = self.succ[prev, j]
        return torch.from_numpy(out)


def measure(args, vocab: int) -> tuple[float, float]:
    cfg = ModelConfig(n_layers=args.layers, d_model=args.d_model, n_heads=args.heads, vocab_size=vocab,
                      max_seq_len=args.seq_len)  # fmt: skip
    train = TrainConfig(steps=10**6, lr=1e-3, warmup=10)
    data = load_data("markov", vocab=vocab, seq_len=args.seq_len, batch=args.batch, seed=0)
    peer_data = Sampler(data.chain.succ, data.chain.prob, args.batch, args.seq_len + 1)
    ours = Trainer(Transformer(cfg, InitConfig()), train, torch.device("cpu"), train.lr, train.warmup)
    bare = Bare(Transformer(cfg, InitConfig()), train)

    def tinit_step():
        ours.step(data.next_batch())

    def bare_step():
        bare.step(peer_data.batch())

    for _ in range(3):  # warm up both (allocator, first-call dispatch)
        tinit_step()
        bare_step()
    times = {"bare": [], "tinit": []}
    for _ in range(args.blocks):
        for name, fn in (("bare", bare_step), ("tinit", tinit_step)):
            for _ in range(args.steps):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return statistics.median(times["tinit"]), statistics.median(times["bare"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", default="64,1024,4096")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=48)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=15, help="alternating blocks per side")
    ap.add_argument("--steps", type=int, default=20, help="steps per block")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    load = os.getloadavg()[0]
    rows = [(v, *measure(args, v)) for v in (int(x) for x in args.vocab.split(","))]
    tokens = args.batch * args.seq_len
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
          f"{torch.__version__}, threads {torch.get_num_threads()}, "
          f"load {load:.2f} -> {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"model: L={args.layers}, d={args.d_model}, batch {args.batch} x seq {args.seq_len}; "
          f"{args.blocks} x {args.steps} steps per side and vocabulary, interleaved; "
          "a step draws its batch")  # fmt: skip
    print(f"{'vocab':>6}{'tinit ms':>10}{'bare ms':>10}{'tinit tok/s':>13}{'bare tok/s':>12}{'ratio':>8}")
    worst = 0.0
    for v, ours, bare in rows:
        ratio = ours / bare
        worst = max(worst, ratio)
        print(f"{v:>6}{1e3 * ours:>10.2f}{1e3 * bare:>10.2f}{tokens / ours:>13.0f}{tokens / bare:>12.0f}"
              f"{ratio:>8.3f}")  # fmt: skip
    print("target: <= 1.05 at every vocabulary", "(met)" if worst <= 1.05 else "(NOT met)")
    assert math.isfinite(worst)


if __name__ == "__main__":
    main()
