"""Resident memory of `tinit depth-sweep` (gradients on) after each (depth, seed) point
and at its peak, against an independent peer doing the same passes with a Hugging Face
LlamaForCausalLM (benchmarks/_hf_grads_peer.py: per point and configuration a model
built from its config, a probed forward, a forward and backward with the stream
gradients retained). tinit's figure after each point is config.json's ``rss_mib``; the
peer prints its own after trimming the heap as tinit does; the peaks are the kernel's
(os.wait4). One process each, one after the other (memory, not time: no pairing
needed, but never two at once).

    python benchmarks/bench_memory_points.py [--layers 12,24,48] [--seeds 2]

Target (issue 20): flat in points, depth and configurations: the resident memory after
the last point within 10% of the first, for tinit as for the peer.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _paired import load, machine

HERE = Path(__file__).resolve().parent


def run(cmd: list[str], env: dict) -> tuple[str, float]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return out, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="12,24,48")
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}
    before = load()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        _, tinit_peak = run([sys.executable, "-m", "tinit", "depth-sweep", "--layers", args.layers, "--seeds",
                             str(args.seeds), "--device", "cpu", "-q", "--out", str(out)], env)  # fmt: skip
        cfg = json.loads((out / "config.json").read_text())
    tinit_after = list(cfg["rss_mib"].values())
    peer = [sys.executable, str(HERE / "_hf_grads_peer.py"), "--layers", args.layers, "--seeds",
            str(args.seeds), "--configs", "4"]  # fmt: skip
    text, peer_peak = run(peer, env)
    peer_after = [float(line.split()[-1]) for line in text.splitlines() if line.startswith("point")]
    print(f"machine: {machine()}; load {before} -> {load()}")
    print(f"depth-sweep --layers {args.layers} --seeds {args.seeds}, 4 configurations, gradients on")
    print(f"{'':<34}{'after each point, MiB':<48}{'last/first':>11}{'peak MiB':>10}")
    for name, after, peak in (("A tinit depth-sweep", tinit_after, tinit_peak),
                              ("B transformers Llama, same passes", peer_after, peer_peak)):  # fmt: skip
        cells = " ".join(f"{x:.0f}" for x in after)
        print(f"{name:<34}{cells:<48}{after[-1] / after[0]:>11.3f}{peak:>10.0f}")
    print(f"peak ratio A/B: {tinit_peak / peer_peak:.3f}; after the last point A/B: "
          f"{tinit_after[-1] / peer_after[-1]:.3f}")  # fmt: skip
    print("target: last/first <= 1.10")


if __name__ == "__main__":
    main()
