"""Whole-process wall time of tinit's quick commands: `tinit --help`, `tinit variance
-h`, `tinit --version`, a tiny `tinit variance` run, and, for scale, `python -c pass`
and `python -c "import torch"`. Each command runs --repeats times (cases interleaved,
so all see the same load); the table gives the median, the spread (min-max) and, for
the run, the time after its last line of output (interpreter shutdown). The load
average is printed before and after: on a shared machine the figures mean little
without it.

    python benchmarks/bench_startup.py [--repeats 7]

Target (issue 11): `tinit --help` and `tinit <cmd> -h` well under 1 s on an idle machine.
"""

import argparse
import csv
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """(whole-process seconds, seconds from the last line of stdout to the exit)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    last = t0
    for _ in p.stdout:
        last = time.perf_counter()
    if p.wait() != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    end = time.perf_counter()
    return end - t0, end - last


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--csv", type=Path, default=HERE / "out" / "bench_startup.csv")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    py, tinit = sys.executable, [sys.executable, "-m", "tinit"]
    tiny = ["variance", "-L", "2", "--d-model", "32", "--heads", "2", "--seq-len", "8", "--batch", "2",
            "--vocab", "64", "--init", "naive", "--pre-norm", "-q"]  # fmt: skip
    cases = {
        "python -c pass": [py, "-c", "pass"],
        'python -c "import torch"': [py, "-c", "import torch"],
        "tinit --help": [*tinit, "--help"],
        "tinit variance -h": [*tinit, "variance", "-h"],
        "tinit --version": [*tinit, "--version"],
        "tinit variance (tiny: L=2, d=32, 1 config)": [*tinit, *tiny],
    }
    before = load()
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cmd in cases.items():  # warm the file cache
            timed([*cmd, "--out", os.path.join(tmp, "warm")] if "tiny" in name else cmd, env)
        for i in range(args.repeats):
            for name, cmd in cases.items():
                run = [*cmd, "--out", os.path.join(tmp, f"r{i}")] if "tiny" in name else cmd
                times[name].append(timed(run, env))
            print(f"  repeat {i + 1}/{args.repeats} done (load {load()})", flush=True)
    after = load()
    print()
    cpu = platform.processor() or platform.machine()
    print(f"machine: {platform.node()}, {cpu}, {os.cpu_count()} cores, python {platform.python_version()}")
    print(f"load average (1/5/15 min): before {before}, after {after}")
    print(f"{'command (whole process)':<46}{'median s':>9}{'min-max s':>13}{'after last line':>17}")
    rows = []
    for name, ts in times.items():
        whole = [t for t, _ in ts]
        tail = statistics.median(s for _, s in ts)
        spread = f"{min(whole):.2f}-{max(whole):.2f}"
        tail_s = f"{tail:.2f}" if "tiny" in name else ""
        print(f"{name:<46}{statistics.median(whole):>9.2f}{spread:>13}{tail_s:>17}")
        rows.append((name, statistics.median(whole), min(whole), max(whole), tail))
    print("target: tinit --help and tinit <cmd> -h well under 1 s on an idle machine")
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        f.write(f"# load before {before}, after {after}; {os.cpu_count()} cores\n")
        w = csv.writer(f)
        w.writerow(["command", "median_s", "min_s", "max_s", "after_last_line_s"])
        for name, *values in rows:
            w.writerow([name, *(f"{v:.4f}" for v in values)])
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
