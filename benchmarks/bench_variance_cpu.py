"""Whole-process time of `tinit variance --layers 80` (defaults: four configurations, the
probe at every addition, its CSVs, its figure, the terminal table) against an
independent minimal model doing the same four forwards with no probe, CSV or figure
(benchmarks/_variance_peer.py: its own ~60-line pre/post-norm model in plain torch,
nothing from tinit), both on one thread (tinit's --threads, the peer's
torch.set_num_threads and OMP_NUM_THREADS). Runs alternate A B A B, so both see the
same load; the table gives medians, the ratio of each pair and the load average. Both
run as an installed program does, from cached byte-code: PYTHONDONTWRITEBYTECODE is
dropped and the cache kept under a temporary PYTHONPYCACHEPREFIX, filled by the
warm-up pair (compiling tinit's ~100 modules from source on every start would add a
cost no user pays).

    python benchmarks/bench_variance_cpu.py [--repeats 5] [--layers 80] [--peer independent|bare]
                                            [--tree DIR] [--peer-allocator default|tinit]

``--peer bare`` pairs with benchmarks/_bare_forward.py instead: tinit's own model
built and run the same way with no probe (what the model alone costs). ``--tree DIR``
times the tinit of another checkout (a "before"), against this checkout's peer.
``--peer-allocator tinit`` gives the peer the glibc malloc settings tinit's console
entry point makes (tinit/process.py: freed blocks under 32 MiB kept for reuse) through
glibc's environment variables, so that the ratio compares the same allocator; the
default runs the peer as written, on glibc's defaults.

Target (issue 31): ratio <= 1.10 against the independent peer.
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

from _paired import paired, report

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--peer", choices=("independent", "bare"), default="independent")
    ap.add_argument("--tree", type=Path, default=HERE.parent, help="the tinit checkout to time")
    ap.add_argument("--peer-allocator", choices=("default", "tinit"), default="default")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(args.tree.resolve()))
    tinit = [sys.executable, "-m", "tinit", "variance", "--layers", str(args.layers), "--threads", "1"]
    if "mf_draws" in (args.tree / "tinit" / "model" / "config.py").read_text():
        # the peer measures and predicts nothing: the same work is tinit's measurement without the
        # large-width prediction (its own cost is in docs/performance.md, "The large-width prediction")
        tinit += ["--mf-draws", "0"]
    peer = {
        "independent": ("B independent peer: same 4 forwards, plain torch", HERE / "_variance_peer.py"),
        "bare": ("B tinit's model, 4 forwards, no probe", HERE / "_bare_forward.py"),
    }[args.peer]
    with tempfile.TemporaryDirectory() as tmp:
        env["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pycache")
        env_b = dict(env)
        if args.peer_allocator == "tinit":
            sys.path.insert(0, str(HERE.parent))  # (this checkout's settings)
            from tinit.process import MMAP_THRESHOLD, TRIM_THRESHOLD  # (no torch imported)

            env_b.update(
                MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD), MALLOC_TRIM_THRESHOLD_=str(TRIM_THRESHOLD)
            )
            peer = (peer[0] + ", tinit's malloc", peer[1])
        sa, sb, walls, cpus, loads = paired(
            (f"A tinit variance --layers {args.layers} (tree {args.tree.name})", tinit),
            (peer[0], [sys.executable, str(peer[1]), str(args.layers)]),
            args.repeats, env, fresh=lambda i: ["--out", os.path.join(tmp, f"r{i}")], env_b=env_b,
        )  # fmt: skip
    report(sa, sb, walls, cpus, loads, "<= 1.10")


if __name__ == "__main__":
    main()
