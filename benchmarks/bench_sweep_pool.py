"""Whole-process time of `tinit sweep depth-sweep --executor local --workers 2` over 8
small points (its point folders, records, merged CSVs and figure) against the same 8
points in one process, `tinit depth-sweep` with the same options (its CSVs and figure),
one thread per worker on both sides (issue 31: two local workers on 2 cores finish 8
small points no slower than one process). Runs alternate; medians, paired ratios and the
load average are printed. With ``--peer pool`` the other side is instead a plain
ProcessPoolExecutor script that gathers the points and writes the merged CSVs
(benchmarks/_pool_peer.py, issue 20's pairing). (That nothing of a sweep is left
running when it returns is tests/test_sweep_pool.py's.)

    python benchmarks/bench_sweep_pool.py [--repeats 5] [--layers 4,8] [--seeds 1] [--peer single|pool]

Target: ratio <= 1.0 against one process (issue 31); <= 1.2 against the pool (issue 20).
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
    ap.add_argument("--peer", choices=("single", "pool"), default="single")
    args = ap.parse_args()
    shape = {"d_model": 64, "heads": 2, "vocab": 256, "seq_len": 32, "batch": 4}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}
    flags = [x for k, v in shape.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    grid = ["depth-sweep", "--layers", args.layers, "--seeds", str(args.seeds), *flags, "--device", "cpu"]
    tinit = [sys.executable, "-m", "tinit", "sweep", "--executor", "local", "--workers", str(args.workers),
             *grid, "-q"]  # fmt: skip
    n = len(args.layers.split(",")) * args.seeds * 4
    with tempfile.TemporaryDirectory() as tmp:
        if args.peer == "single":
            b = (f"B tinit depth-sweep, the same {n} points in one process", [sys.executable, "-m", "tinit",
                                                                           *grid, "-q"])  # fmt: skip
            fresh_b = lambda i: ["--out", os.path.join(tmp, f"one{i}")]  # noqa: E731
        else:
            b = (f"B plain ProcessPoolExecutor({args.workers}) over the same points",
                 [sys.executable, str(HERE / "_pool_peer.py"), str(args.workers), f"layers={args.layers}",
                  f"seeds={args.seeds}", *(f"{k}={v}" for k, v in shape.items())])  # fmt: skip
            fresh_b = lambda i: [f"out={os.path.join(tmp, f'peer{i}')}"]  # noqa: E731
        sa, sb, walls, cpus, loads = paired(
            (f"A tinit sweep depth-sweep, {n} points, {args.workers} local workers", tinit), b,
            args.repeats, env, fresh=lambda i: ["--out", os.path.join(tmp, f"r{i}")], fresh_b=fresh_b,
        )  # fmt: skip
    report(sa, sb, walls, cpus, loads, "<= 1.0" if args.peer == "single" else "<= 1.2")


if __name__ == "__main__":
    main()
