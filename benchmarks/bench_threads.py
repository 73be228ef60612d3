"""The same small `tinit variance` run at --threads 1 and --threads 2, on the machine
as it is and with one competing CPU-bound process (a Python busy loop) started beside
it: what the default thread count should be on a shared machine. Runs are interleaved
(1, 2, 1, 2, ...) so both thread counts see the same load; the table gives medians of
the whole process and of the measurement alone (config.json's `seconds`), and the
load average before and after.

    python benchmarks/bench_threads.py [--repeats 5] [--layers 12]
"""

import argparse
import json
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
SPIN = "import time\nend = time.time() + 3600\nwhile time.time() < end: pass"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run(cmd: list[str], out: Path, env: dict) -> tuple[float, float]:
    """(whole-process seconds, measured seconds from config.json)."""
    t0 = time.perf_counter()
    subprocess.run([*cmd, "--out", str(out)], check=True, env=env, stdout=subprocess.DEVNULL)
    whole = time.perf_counter() - t0
    return whole, sum(json.loads((out / "config.json").read_text())["seconds"].values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--csv", type=Path, default=HERE / "out" / "bench_threads.csv")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "tinit", "variance", "--layers", str(args.layers), "--init", "naive",
           "--pre-norm", "--device", "cpu", "-q"]  # fmt: skip
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    loads = {}
    with tempfile.TemporaryDirectory() as tmp:
        run([*cmd, "--threads", "1"], Path(tmp) / "warm", env)
        for competing in ("none", "1 busy process"):
            spin = subprocess.Popen([sys.executable, "-c", SPIN]) if competing != "none" else None
            try:
                time.sleep(1.0 if spin else 0)
                before = load()
                for i in range(args.repeats):
                    for threads in (1, 2):
                        out = Path(tmp) / f"{competing[:4]}-{threads}-{i}"
                        results.setdefault((competing, threads), []).append(
                            run([*cmd, "--threads", str(threads)], out, env)
                        )
                    print(f"  {competing}: repeat {i + 1}/{args.repeats} (load {load()})", flush=True)
                loads[competing] = (before, load())
            finally:
                if spin is not None:
                    spin.kill()
                    spin.wait()
    print()
    cpu = platform.processor() or platform.machine()
    print(f"machine: {platform.node()}, {cpu}, {os.cpu_count()} cores, python {platform.python_version()}")
    print(f"command: {' '.join(cmd[1:])} --threads N")
    for competing, (b, a) in loads.items():
        print(f"load average (1/5/15 min) with competing={competing}: before {b}, after {a}")
    print(f"{'competing':<16}{'threads':>8}{'whole median s':>16}{'min-max':>13}{'measured median s':>19}")
    rows = []
    for (competing, threads), ts in results.items():
        whole, meas = [w for w, _ in ts], [m for _, m in ts]
        spread = f"{min(whole):.2f}-{max(whole):.2f}"
        med_w, med_m = statistics.median(whole), statistics.median(meas)
        print(f"{competing:<16}{threads:>8}{med_w:>16.2f}{spread:>13}{med_m:>19.2f}")
        rows.append((competing, threads, med_w, min(whole), max(whole), med_m))
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with open(args.csv, "w") as f:
        f.write(f"# {os.cpu_count()} cores; loads {loads}\n")
        f.write("competing,threads,whole_median_s,whole_min_s,whole_max_s,measured_median_s\n")
        for r in rows:
            f.write(f"{r[0]},{r[1]},{r[2]:.4f},{r[3]:.4f},{r[4]:.4f},{r[5]:.4f}\n")
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
