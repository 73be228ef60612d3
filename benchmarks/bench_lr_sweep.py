"""Wall time of the default `tinit lr-sweep` (24 training runs: scaled init, pre- and
post-norm, L = 2, 4, 8, four peak lrs, 200 steps each, at d = 48 on the Markov language;
update ratios, variance probes, summary, optima, drift, 8 CSVs, 3 figures and
config.json) against the same training runs as a bare loop (benchmarks/_lr_sweep_peer.py:
tinit's model and optimizer groups, no recording, no files), one thread each, whole
processes in turn. The ratio is what the sweep costs beyond its training. Medians,
paired ratios and the load average are printed, and the split of tinit's time into
training (config.json's seconds per run) and the rest.

    python benchmarks/bench_lr_sweep.py [--repeats 3] [--warmup 1]

Target: the default sweep in a few minutes on a 2-core CPU.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from _paired import paired, report

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="unrecorded pairs first")
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}
    tinit = [sys.executable, "-m", "tinit", "lr-sweep", "--threads", "1", "-q"]
    peer = [sys.executable, str(HERE / "_lr_sweep_peer.py")]
    with tempfile.TemporaryDirectory() as tmp:
        sa, sb, walls, cpus, loads = paired(
            ("A tinit lr-sweep (defaults)", tinit), ("B the same 24 training runs, bare loop", peer),
            args.repeats, env, warmup=args.warmup, fresh=lambda i: ["--out", os.path.join(tmp, f"r{i}")],
        )  # fmt: skip
        measured = []
        for run in sorted(Path(tmp).iterdir()):
            cfg = json.loads((run / "config.json").read_text())
            measured.append(sum(cfg["seconds"].values()))
    report(sa, sb, walls, cpus, loads, "a few minutes (A's wall)")
    print(f"tinit's training (sum over runs), median of {len(measured)} runs: "
          f"{statistics.median(measured):.1f} s of {sa.median('wall'):.1f} s wall; the rest is start-up, "
          "summary, CSVs and figures")  # fmt: skip


if __name__ == "__main__":
    main()
