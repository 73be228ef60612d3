"""Whole-process time of `tinit audit --hf llama` (8 layers, d 256, d_ff 688, 4 heads:
weights against the scheme, the stream variance at every addition, one backward, its
CSVs, audit.md and four figures) against an independent peer that does the same by hand
with transformers: from_config, every weight's std, forward hooks, one backward
(benchmarks/_hf_audit_peer.py), at the same thread count. Runs alternate; medians,
paired ratios and the load average are printed.

    python benchmarks/bench_audit_hf.py [--repeats 5] [--threads 1]

Target (issue 20): ratio <= 1.15.
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

from _paired import paired, report

HERE = Path(__file__).resolve().parent
SHAPE = ["--set", "num_hidden_layers=8", "--set", "hidden_size=256", "--set", "intermediate_size=688",
         "--set", "num_attention_heads=4"]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(HERE.parent)}
    tinit = [sys.executable, "-m", "tinit", "audit", "--hf", "llama", *SHAPE, "-q", "--device", "cpu",
             "--threads", str(args.threads)]  # fmt: skip
    peer = [sys.executable, str(HERE / "_hf_audit_peer.py")]
    with tempfile.TemporaryDirectory() as tmp:
        sa, sb, walls, cpus, loads = paired(
            ("A tinit audit --hf llama (8 x 256; CSVs, audit.md, 4 figures)", tinit),
            ("B transformers from_config + stds + hooks + one backward", peer),
            args.repeats, env, fresh=lambda i: ["--out", os.path.join(tmp, f"r{i}")],
        )  # fmt: skip
    report(sa, sb, walls, cpus, loads, "<= 1.15")


if __name__ == "__main__":
    main()
