"""Peak resident memory of auditing a checkpoint 4x deeper (issue 32): the audit reads
one block at a time, so the peak must not grow with depth.

    python benchmarks/bench_checkpoint_memory.py [--layers 8] [--d-model 512] [--pairs 3]

Writes a tinit checkpoint of L and of 4L layers (width d, a step-5 checkpoint whose
init is rebuilt from the seed for the drift, as a real run without a step-0 file), then
audits each in its own process (stream variance, drift and spectral norms), L and 4L in
turn, ``--pairs`` times: the kernel's peak of each whole process (os.wait4), the ratio
taken pair by pair, medians, and the load average before and after.

Target: peak(4L) / peak(L) <= 1.2. The checkpoint files' sizes are printed beside it:
holding the whole 4L model would add their difference to the peak.
"""

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from _paired import load, machine, run_once

HERE = Path(__file__).resolve().parent


def write(path: str, layers: int, d: int) -> None:
    """A step-5 checkpoint of a tinit model: its init weights, each moved a little."""
    import torch

    from tinit.experiments.training.trainer import RunSpec, TrainConfig
    from tinit.model.config import InitConfig, ModelConfig
    from tinit.model.transformer import build_block
    from tinit.results.checkpoints import CheckpointWriter

    cfg = ModelConfig(n_layers=layers, d_model=d, n_heads=8, vocab_size=1024, max_seq_len=128)
    init = InitConfig(scheme="gpt2", seed=0)
    spec = RunSpec(cfg, init, 1e-3, 0)
    # the state dict, built a block at a time (the writer's input; a real run holds it anyway)
    from tinit.model.transformer import Transformer

    top = Transformer(cfg, init, stream=True).state_dict()
    state = dict(top)
    gen = torch.Generator().manual_seed(1)
    for layer in range(layers):
        for n, t in build_block(cfg, init, layer).state_dict().items():
            state[f"blocks.{layer}.{n}"] = t + 1e-3 * torch.randn(t.shape, generator=gen)
    CheckpointWriter(path)(5, spec.checkpoint_label(), state, spec.checkpoint_info(TrainConfig()))


def audit(path: str) -> None:
    import torch

    from tinit.experiments.audit.sources import find_checkpoints
    from tinit.experiments.audit.trained import run_checkpoint_audit
    from tinit.model.config import RunConfig

    torch.set_num_threads(1)
    res = run_checkpoint_audit(find_checkpoints(path), RunConfig(batch=4, seq_len=128), torch.device("cpu"),
                               torch.float32)  # fmt: skip
    assert len(res["variance"]) > 1 and res.complete


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--write", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--audit", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write:
        return write(args.write[0], int(args.write[1]), int(args.write[2]))
    if args.audit:
        return audit(args.audit)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}
    me = [sys.executable, str(Path(__file__).resolve())]
    before = load()
    with tempfile.TemporaryDirectory() as tmp:
        depths = [args.layers, 4 * args.layers]
        size = {}
        for L in depths:
            run_once([*me, "--write", os.path.join(tmp, f"L{L}"), str(L), str(args.d_model)], env)
            size[L] = sum(p.stat().st_size for p in Path(tmp, f"L{L}").rglob("*.safetensors"))
        peaks = {L: [] for L in depths}
        for _ in range(args.pairs):
            for L in depths:
                run = Path(tmp, f"L{L}", "checkpoints")
                peaks[L].append(run_once([*me, "--audit", str(next(run.iterdir()))], env).peak_mib)
    ratios = [b / a for a, b in zip(peaks[depths[0]], peaks[depths[1]], strict=True)]
    print(f"machine: {machine()}; load before {before}, after {load()}")
    print(f"{'layers':>6} {'checkpoint MiB':>15} {'peak RSS MiB (median)':>22}  runs")
    for L in depths:
        runs = ", ".join(f"{x:.0f}" for x in peaks[L])
        print(f"{L:>6} {size[L] / 2**20:>15.1f} {statistics.median(peaks[L]):>22.0f}  {runs}")
    r = statistics.median(ratios)
    print(f"peak(4L) / peak(L), paired: median {r:.3f} ({', '.join(f'{x:.3f}' for x in ratios)}); "
          f"target <= 1.2: {'meets' if r <= 1.2 else 'MISSES'}")  # fmt: skip


if __name__ == "__main__":
    main()
