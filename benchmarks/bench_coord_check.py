"""Wall time of the default `tinit coord-check --init gpt2,mup` (48 training runs: two
schemes x widths 64..512 x depths 2, 8 x 3 seeds, 5 forwards and 4 AdamW steps each,
the RMS of every layer recorded, the fits, 4 CSV/PNG files and config.json) against the
same training runs as a bare loop (benchmarks/_coord_peer.py: tinit's model and
optimizer groups, no recording, no fit, no files), one thread each, whole processes in
turn. The ratio is what the check costs beyond its training: the probe, the fits, the
figures and the process's start. Medians, paired ratios and the load average are
printed, and the split of tinit's time into measuring (config.json's seconds per point)
and the rest.

    python benchmarks/bench_coord_check.py [--repeats 3]

Target: the default check in a few minutes on a 2-core CPU.
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
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}
    tinit = [sys.executable, "-m", "tinit", "coord-check", "--init", "gpt2,mup", "-q"]
    peer = [sys.executable, str(HERE / "_coord_peer.py")]
    with tempfile.TemporaryDirectory() as tmp:
        sa, sb, walls, cpus, loads = paired(
            ("A tinit coord-check --init gpt2,mup (defaults)", tinit),
            ("B the same 48 training runs, bare loop", peer),
            args.repeats, env, fresh=lambda i: ["--out", os.path.join(tmp, f"r{i}")],
        )  # fmt: skip
        measured = []
        for run in sorted(Path(tmp).iterdir()):
            cfg = json.loads((run / "config.json").read_text())
            measured.append(sum(cfg["seconds"].values()))
    report(sa, sb, walls, cpus, loads, "a few minutes (A's wall)")
    print(f"tinit's measuring (training + recording, sum over points), median of {len(measured)} runs: "
          f"{statistics.median(measured):.1f} s of {sa.median('wall'):.1f} s wall; the rest is start-up, "
          "fits, CSVs and figures")  # fmt: skip


if __name__ == "__main__":
    main()
