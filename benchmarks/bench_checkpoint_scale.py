"""`tinit audit --checkpoint` on checkpoints of the sizes researchers have (issue 45),
paired with what a user writes instead, whole processes, one thread each.

    python benchmarks/bench_checkpoint_scale.py pair [--repeats 3]    # the 1B-shaped folder
    python benchmarks/bench_checkpoint_scale.py flat [--repeats 2]    # 4x deeper, 4x the vocabulary
    python benchmarks/bench_checkpoint_scale.py big [--folder DIR]    # the 8B-shaped folder (~15 GiB)

``pair``: a Llama-3.2-1B-shaped folder (written shard by shard by
``benchmarks/make_checkpoint.py`` into benchmarks/out/ckpt-1b; 2.3 GiB of bf16), 1 x 128
tokens. A = ``tinit audit --checkpoint FOLDER --seq-len 128 --batch 1 --threads 1`` (its
CSVs and figures; once with the default ``--spectral fast``, once with ``--spectral
off``), B = ``benchmarks/_checkpoint_peer.py``: ``AutoModelForCausalLM.from_pretrained(
dtype=float32)`` and one forward with ``output_hidden_states``, the variances to a CSV.
Targets: off <= 0.8x the peer's wall time, fast <= 2.0x; peak RSS <= 1.5 GiB.

``flat``: peak RSS auditing a checkpoint 4x deeper (L 4 vs 16) and one with 4x the
vocabulary (32064 vs 128256 rows), at the 1B shape's width; each ratio within 1.2.

``big``: a Llama-3-8B-shaped folder (32 layers, d 4096, d_ff 14336, vocab 128256,
untied; 15 GiB), written once; the audit's wall time and peak RSS (target <= 2.5 GiB),
then the peer's float32 whole load under an address-space cap of 20 GiB (this machine
has 24 GiB and no swap: uncapped it would take the machine down), with what it says.
The load average is printed beside every figure.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _paired import load, machine, paired, report, run_once

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
PY = sys.executable


def folder(name: str, *args: str) -> Path:
    path = OUT / name
    subprocess.run([PY, str(HERE / "make_checkpoint.py"), "--out", str(path), *args], check=True)
    return path


def tinit(path: Path, *extra: str) -> list[str]:
    return [PY, "-m", "tinit", "audit", "--checkpoint", str(path), "--seq-len", "128", "--batch", "1",
            "--threads", "1", "-q", *extra]  # fmt: skip


def pair(repeats: int) -> None:
    path = folder("ckpt-1b", "--shape", "llama-1b")
    tmp = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    peer = ("peer: from_pretrained(float32) + forward", [PY, str(HERE / "_checkpoint_peer.py"), str(path),
                                                          str(tmp / "peer.csv")])  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for spectral, target in (("off", "<= 0.8"), ("fast", "<= 2.0")):
        print(f"\n--spectral {spectral} (1B-shaped folder, 1 x 128 tokens, one thread each)", flush=True)
        a = (f"tinit audit --checkpoint --spectral {spectral}", tinit(path, "--spectral", spectral))

        def fresh(i: int, spectral: str = spectral) -> list[str]:
            return ["--out", str(tmp / f"{spectral}-{i}")]

        sa, sb, walls, cpus, loads = paired(a, peer, repeats, env, fresh=fresh)
        report(sa, sb, walls, cpus, loads, f"wall ratio {target}; peak RSS <= 1.5 GiB (1536 MiB)")


def flat(repeats: int) -> None:
    base = ("--shape", "llama-1b")
    shallow = folder("ckpt-flat-L4", *base, "--layers", "4", "--vocab", "32064")
    deep = folder("ckpt-flat-L16", *base, "--layers", "16", "--vocab", "32064")
    wide = folder("ckpt-flat-L4-V128k", *base, "--layers", "4", "--vocab", "128256")
    tmp = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    runs: dict[str, list[float]] = {"L4": [], "L16": [], "V128k": []}
    k = 0
    for _ in range(repeats):
        for name, path in (("L4", shallow), ("L16", deep), ("V128k", wide)):
            k += 1
            r = run_once([*tinit(path), "--out", str(tmp / f"{name}-{k}")])
            runs[name].append(r.peak_mib)
            print(f"  {name}: {r.wall:.1f} s, peak {r.peak_mib:.0f} MiB (load {load()})", flush=True)
    med = {n: sorted(v)[len(v) // 2] for n, v in runs.items()}
    print(f"\nmachine: {machine()}")
    print(f"peak RSS (median of {repeats}): L4 {med['L4']:.0f} MiB, L16 {med['L16']:.0f} MiB, "
          f"L4 with 4x vocab {med['V128k']:.0f} MiB")  # fmt: skip
    print(f"4x deeper: {med['L16'] / med['L4']:.3f}; 4x vocabulary: {med['V128k'] / med['L4']:.3f} "
          "(targets: each <= 1.2)")  # fmt: skip


def _cap(limit: int):
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return set_limit


def big(path: str | None) -> None:
    p = Path(path) if path else folder("ckpt-8b", "--shape", "llama-8b", "--shard-mib", "4800")
    tmp = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    print(f"8B-shaped folder {p} (load {load()})", flush=True)
    r = run_once([*tinit(p), "--out", str(tmp / "audit")])
    print(f"tinit audit --checkpoint (default --spectral fast): {r.wall:.1f} s wall, {r.cpu:.1f} s cpu, "
          f"peak {r.peak_mib / 1024:.2f} GiB (target <= 2.5 GiB; load {load()})")  # fmt: skip
    r = run_once([*tinit(p, "--spectral", "off"), "--out", str(tmp / "audit-off")])
    print(f"tinit audit --checkpoint --spectral off: {r.wall:.1f} s wall, peak {r.peak_mib / 1024:.2f} GiB "
          f"(load {load()})")  # fmt: skip
    cap = 20 << 30
    t0 = time.perf_counter()
    proc = subprocess.run([PY, str(HERE / "_checkpoint_peer.py"), str(p), str(tmp / "peer.csv")],
                          capture_output=True, text=True, preexec_fn=_cap(cap))  # fmt: skip
    wall = time.perf_counter() - t0
    last = (proc.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
    print(f"peer (from_pretrained float32, address space capped at {cap >> 30} GiB): exit {proc.returncode} "
          f"after {wall:.1f} s: {last[:300]}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("pair", "flat", "big"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--folder", help="big: an 8B-shaped folder already written")
    a = ap.parse_args()
    print(f"machine: {machine()}; load {load()}", flush=True)
    {"pair": lambda: pair(a.repeats), "flat": lambda: flat(a.repeats), "big": lambda: big(a.folder)}[a.what]()


if __name__ == "__main__":
    main()
