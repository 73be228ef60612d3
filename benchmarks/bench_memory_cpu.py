"""Peak memory of a streamed `tinit variance` run against depth: `--layers 1000`
vs `--layers 10` at the same width (and a fully built run for contrast). Peak RSS
of each whole process, from os.wait4.

    python benchmarks/bench_memory_cpu.py

Target (issue 6): streamed peak at 1000 layers within 1.2x of 10 layers.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def peak_rss(cmd: list[str]) -> tuple[float, float]:
    """(peak resident memory in MiB, wall seconds) of one process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return usage.ru_maxrss / 1024, time.perf_counter() - t0  # ru_maxrss is KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deep", type=int, default=1000)
    ap.add_argument("--shallow", type=int, default=10)
    ap.add_argument("--built", type=int, default=200, help="depth of the fully built contrast run")
    ap.add_argument("--csv", type=Path, default=HERE / "out" / "bench_memory_cpu.csv")
    args = ap.parse_args()
    base = [sys.executable, "-m", "tinit", "variance", "--init", "naive", "--pre-norm", "--batch", "1",
            "--seq-len", "64", "-q", "--device", "cpu"]  # fmt: skip
    cases = [
        ("streamed", args.shallow, ["--stream"]),
        ("streamed", args.deep, ["--stream"]),
        ("built", args.shallow, ["--no-stream"]),
        ("built", args.built, ["--no-stream"]),
    ]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (mode, layers, flags) in enumerate(cases):
            mib, secs = peak_rss([*base, "--layers", str(layers), *flags, "--out", os.path.join(tmp, str(i))])
            rows.append((mode, layers, mib, secs))
            print(f"  {mode:>8} L={layers:<5} peak {mib:8.1f} MiB  {secs:6.1f} s", flush=True)
    s_shallow = next(r[2] for r in rows if r[0] == "streamed" and r[1] == args.shallow)
    s_deep = next(r[2] for r in rows if r[0] == "streamed" and r[1] == args.deep)
    print()
    print(f"{'mode':<10}{'layers':>8}{'peak RSS MiB':>14}{'wall s':>9}")
    for mode, layers, mib, secs in rows:
        print(f"{mode:<10}{layers:>8}{mib:>14.1f}{secs:>9.1f}")
    print(f"streamed peak ratio L={args.deep} / L={args.shallow}: {s_deep / s_shallow:.3f} (target <= 1.2)")
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with open(args.csv, "w") as f:
        f.write("mode,layers,peak_rss_mib,wall_s\n")
        for r in rows:
            f.write(f"{r[0]},{r[1]},{r[2]:.1f},{r[3]:.2f}\n")
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
