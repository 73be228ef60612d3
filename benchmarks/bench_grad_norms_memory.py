"""Peak resident memory of `tinit grad-norms --layers 12` with 1, 2, 4 and 6
configurations in one process, against an independent peer doing the same number of
forward and backward passes with a Hugging Face LlamaForCausalLM of the same shape in
one process (benchmarks/_hf_grads_peer.py). The kernel's peak of each whole process
(os.wait4), one process at a time.

    python benchmarks/bench_grad_norms_memory.py [--layers 12]

Target (issue 20): flat in the number of configurations (the 6-configuration peak
within 10% of the 1-configuration one), as the peer's.
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

from _paired import load, machine, run_once

HERE = Path(__file__).resolve().parent
GRIDS = {
    1: ["--init", "naive", "--pre-norm"],
    2: ["--init", "naive,gpt2", "--pre-norm"],
    4: ["--init", "naive,gpt2", "--norm-position", "pre,post"],
    6: ["--init", "naive,gpt2,megatron", "--norm-position", "pre,post"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}
    before = load()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, grid in GRIDS.items():
            a = run_once([sys.executable, "-m", "tinit", "grad-norms", "--layers", str(args.layers), *grid,
                          "--device", "cpu", "-q", "--out", os.path.join(tmp, f"g{n}")], env)  # fmt: skip
            b = run_once([sys.executable, str(HERE / "_hf_grads_peer.py"), "--layers", str(args.layers),
                          "--seeds", "1", "--configs", str(n)], env)  # fmt: skip
            rows.append((n, a.peak_mib, b.peak_mib))
            print(f"  {n} configurations: tinit {a.peak_mib:.0f} MiB, peer {b.peak_mib:.0f} MiB", flush=True)
    print(f"machine: {machine()}; load {before} -> {load()}")
    print(f"grad-norms --layers {args.layers} (d 256, 8 x 128 tokens), peak resident memory of the process")
    print(f"{'configurations':>15}{'tinit MiB':>11}{'peer MiB':>10}{'ratio':>8}")
    for n, a, b in rows:
        print(f"{n:>15}{a:>11.0f}{b:>10.0f}{a / b:>8.3f}")
    print(f"tinit 6 / 1 configurations: {rows[-1][1] / rows[0][1]:.3f}; peer: {rows[-1][2] / rows[0][2]:.3f}")
    print("target: 6 / 1 <= 1.10")


if __name__ == "__main__":
    main()
