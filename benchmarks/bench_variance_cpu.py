"""Whole-process time of `tinit variance --layers 80` (defaults: four configurations,
its CSVs, its figure) against a bare script that builds the same four models and runs
one forward pass each with no probe, no CSV and no plot (benchmarks/_bare_forward.py),
at the same thread count (tinit's --threads and the bare script's OMP_NUM_THREADS).
Runs alternate A B A B, so both see the same load; the table gives medians, the ratio of
each pair and the load average.

    python benchmarks/bench_variance_cpu.py [--repeats 5] [--layers 80] [--threads 1]

Target (issue 20): ratio <= 1.10.
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
    tinit = [sys.executable, "-m", "tinit", "variance", "--layers", str(args.layers), "-q", "--device", "cpu",
             "--threads", str(args.threads)]  # fmt: skip
    bare = [sys.executable, str(HERE / "_bare_forward.py"), str(args.layers)]
    with tempfile.TemporaryDirectory() as tmp:
        sa, sb, walls, cpus, loads = paired(
            (f"A tinit variance --layers {args.layers} (CSVs, figure)", tinit),
            (f"B bare: 4 models, 1 forward each, no probe ({args.threads} thread)", bare),
            args.repeats, env, fresh=lambda i: ["--out", os.path.join(tmp, f"r{i}")],
        )  # fmt: skip
    report(sa, sb, walls, cpus, loads, "<= 1.10")


if __name__ == "__main__":
    main()
