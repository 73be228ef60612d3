"""Whole-process time of `tinit sweep depth-sweep --executor local --workers 2` over 8
small points (its point folders, records, merged CSVs and figure) against the same
points run by a plain ProcessPoolExecutor script that gathers them and writes the merged
CSVs (benchmarks/_pool_peer.py), one thread per worker on both sides. Runs alternate;
medians, paired ratios and the load average are printed. (That nothing of a sweep is
left running when it returns is tests/test_sweep_pool.py's.)

    python benchmarks/bench_sweep_pool.py [--repeats 5] [--layers 4,8] [--seeds 1]

Target (issue 20): ratio <= 1.2.
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
    ap.add_argument("--layers", default="4,8")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    shape = {"d_model": 64, "heads": 2, "vocab": 256, "seq_len": 32, "batch": 4}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}
    flags = [x for k, v in shape.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    tinit = [sys.executable, "-m", "tinit", "sweep", "depth-sweep", "--layers", args.layers, "--seeds",
             str(args.seeds), *flags, "--device", "cpu", "--executor", "local", "--workers",
             str(args.workers), "-q"]  # fmt: skip
    n = len(args.layers.split(",")) * args.seeds * 4
    with tempfile.TemporaryDirectory() as tmp:
        peer = [sys.executable, str(HERE / "_pool_peer.py"), str(args.workers), f"layers={args.layers}",
                f"seeds={args.seeds}", *(f"{k}={v}" for k, v in shape.items())]  # fmt: skip
        sa, sb, walls, cpus, loads = paired(
            (f"A tinit sweep depth-sweep, {n} points, local pool of {args.workers}", tinit),
            (f"B plain ProcessPoolExecutor({args.workers}) over the same points", peer),
            args.repeats, env, fresh=lambda i: ["--out", os.path.join(tmp, f"r{i}")],
            fresh_b=lambda i: [f"out={os.path.join(tmp, f'peer{i}')}"],
        )  # fmt: skip
    report(sa, sb, walls, cpus, loads, "<= 1.2")


if __name__ == "__main__":
    main()
