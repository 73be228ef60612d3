"""Whole-process timing of two commands run in turn (A B A B ...), for the benchmarks
that pair tinit with an independent peer: wall seconds (a monotonic clock around the
child), CPU seconds and peak resident memory (the kernel's accounting of the reaped
child, os.wait4), and the A/B ratio taken pair by pair, so that the machine's load,
which drifts, divides out. Medians throughout; the load average is printed with them.

Used as a library by the bench_*.py scripts (no torch imported here: the parent stays
small, and a child's peak memory never includes it)."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field


@dataclass
class Run:
    wall: float
    cpu: float
    peak_mib: float


@dataclass
class Side:
    name: str
    runs: list[Run] = field(default_factory=list)

    def median(self, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in self.runs)


def run_once(cmd: list[str], env: dict | None = None, quiet: bool = True) -> Run:
    """One whole process: wall, user + system CPU, peak RSS (MiB)."""
    out = subprocess.DEVNULL if quiet else None
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=out, stderr=out, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed (exit {os.waitstatus_to_exitcode(status)}): {' '.join(cmd)}")
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> str:
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"python {platform.python_version()}")  # fmt: skip


def paired(
    a: tuple[str, list[str]], b: tuple[str, list[str]], repeats: int, env: dict | None = None,
    warmup: int = 1, fresh=None, fresh_b=None, env_b: dict | None = None,
) -> tuple[Side, Side, list[float], list[float], str]:  # fmt: skip
    """Run A and B in turn ``repeats`` times after ``warmup`` unrecorded pairs.
    ``fresh(i)`` (``fresh_b(i)``) may return extra arguments for A's (B's) i-th run: a
    new output folder; ``env_b``: B's environment when it differs from A's. Returns
    both sides, the paired wall and CPU ratios A/B, and the load before/after."""
    before = load()
    sa, sb = Side(a[0]), Side(b[0])
    for i in range(warmup + repeats):
        ra = run_once([*a[1], *(fresh(i) if fresh else [])], env)
        rb = run_once([*b[1], *(fresh_b(i) if fresh_b else [])], env if env_b is None else env_b)
        if i >= warmup:
            sa.runs.append(ra)
            sb.runs.append(rb)
            print(f"  pair {i - warmup + 1}/{repeats}: {a[0]} {ra.wall:.2f} s, {b[0]} {rb.wall:.2f} s "
                  f"(load {load()})", flush=True)  # fmt: skip
    walls = [x.wall / y.wall for x, y in zip(sa.runs, sb.runs, strict=True)]
    cpus = [x.cpu / y.cpu for x, y in zip(sa.runs, sb.runs, strict=True)]
    return sa, sb, walls, cpus, f"{before} -> {load()}"


def report(sa: Side, sb: Side, walls: list[float], cpus: list[float], loads: str, target: str) -> float:
    """Print the table; returns the median paired wall ratio."""
    print()
    print(f"machine: {machine()}; load average (1/5/15 min) before -> after: {loads}")
    print(f"{'whole process':<58}{'wall s':>8}{'cpu s':>8}{'peak MiB':>10}")
    for s in (sa, sb):
        print(f"{s.name:<58}{s.median('wall'):>8.2f}{s.median('cpu'):>8.2f}{s.median('peak_mib'):>10.0f}")
    ratio = statistics.median(walls)
    spread = f"cpu {statistics.median(cpus):.3f}; wall range {min(walls):.3f}-{max(walls):.3f}"
    print(f"{'ratio A/B, median of ' + str(len(walls)) + ' paired runs: wall':<58}{ratio:>8.3f}   ({spread})")
    print(f"target: {target}")
    sys.stdout.flush()
    return ratio
