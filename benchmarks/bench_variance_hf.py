"""Whole-process time of `tinit variance --layers 80 --init scaled --pre-norm` (one
configuration: build, one probed forward, CSVs, figure) against an independent peer, a
Hugging Face LlamaModel of the same shape with forward hooks recording the variances
at every addition (benchmarks/_hf_variance_peer.py), at the same thread count. Runs
alternate; medians, paired ratios and the load average are printed.

    python benchmarks/bench_variance_hf.py [--repeats 5] [--layers 80] [--threads 1]

Reported (issue 20): the ratio (below 1: tinit ahead).
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

from _paired import paired, report

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(HERE.parent)}
    tinit = [sys.executable, "-m", "tinit", "variance", "--layers", str(args.layers), "--init", "scaled",
             "--pre-norm", "-q", "--device", "cpu", "--threads", str(args.threads)]  # fmt: skip
    peer = [sys.executable, str(HERE / "_hf_variance_peer.py"), str(args.layers)]
    with tempfile.TemporaryDirectory() as tmp:
        sa, sb, walls, cpus, loads = paired(
            (f"A tinit variance --layers {args.layers} --init scaled --pre-norm", tinit),
            ("B transformers LlamaModel + forward hooks", peer),
            args.repeats, env, fresh=lambda i: ["--out", os.path.join(tmp, f"r{i}")],
        )  # fmt: skip
    report(sa, sb, walls, cpus, loads, "reported (below 1: tinit ahead)")


if __name__ == "__main__":
    main()
