"""Whole-process time of `tinit variance --layers 80` (defaults) against a bare
script that builds the same four models and runs one forward pass each with no
probe, no CSV and no plot (benchmarks/_bare_forward.py). Runs alternate, so both
see the same machine load; the table gives medians and the ratio.

    python benchmarks/bench_variance_cpu.py [--repeats 5] [--layers 80]

Target (issue 6): ratio <= 1.25 on a 2-core CPU.
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--csv", type=Path, default=HERE / "out" / "bench_variance_cpu.csv")
    args = ap.parse_args()
    # the bare script runs on torch's default threads: give tinit the same (its own default is 1)
    tinit = [sys.executable, "-m", "tinit", "variance", "--layers", str(args.layers), "-q", "--device", "cpu",
             "--threads", str(torch.get_num_threads())]  # fmt: skip
    bare = [sys.executable, str(HERE / "_bare_forward.py"), str(args.layers)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        timed(bare)  # warm the file cache and the import caches
        for i in range(args.repeats):
            t_bare = timed(bare)
            t_tinit = timed([*tinit, "--out", os.path.join(tmp, f"r{i}")])
            rows.append((i, t_bare, t_tinit))
            print(f"  repeat {i}: bare {t_bare:.2f} s, tinit {t_tinit:.2f} s", flush=True)
    med_bare = statistics.median(r[1] for r in rows)
    med_tinit = statistics.median(r[2] for r in rows)
    ratios = [r[2] / r[1] for r in rows]
    print()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, threads {torch.get_num_threads()}")  # fmt: skip
    print(f"{'what':<44}{'median s':>10}")
    print(f"{'bare: build 4 models + 1 forward each':<44}{med_bare:>10.2f}")
    print(f"{'tinit variance --layers ' + str(args.layers) + ' (whole process)':<44}{med_tinit:>10.2f}")
    print(f"{'ratio tinit / bare (median of paired ratios)':<44}{statistics.median(ratios):>10.3f}")
    print("target: <= 1.25")
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with open(args.csv, "w") as f:
        f.write("repeat,bare_s,tinit_s,ratio\n")
        for (i, b, t), r in zip(rows, ratios, strict=True):
            f.write(f"{i},{b:.4f},{t:.4f},{r:.4f}\n")
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
