"""Per-point overhead of `tinit sweep`'s executors against running the same points one
after the other in one process (CPU, small points: a depth-sweep grid).

For each way of running the grid the table gives the wall time (from the first point
handed out to the last point's folder written: worker start-up, torch import, SLURM
scheduling and the point files included; the CLI's own start-up and the gathering are
not), the wall time per point, and the overhead per point in *slot-seconds*:
(wall x slots - in-process seconds) / points, where slots is the number of points that
can run at once (workers, or SLURM tasks the node runs side by side). That is what
each point costs beyond its own computation, whatever the parallelism.

    python benchmarks/bench_sweep.py [--layers 2,4,8] [--seeds 2] [--workers 1,2]
        [--slurm] [--points-per-job 1,4]

With --slurm it uses the cluster SLURM_CONF names, or starts the one-node cluster of
scripts/slurm-local-cluster.sh (root, slurm-wlm and munge needed) and stops it after.
"""

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from tinit.experiments.configs import parse_layers  # noqa: E402
from tinit.experiments.measure.depth_sweep import depth_sweep_plan  # noqa: E402
from tinit.experiments.points import run_point  # noqa: E402
from tinit.model.config import InitConfig, ModelConfig, RunConfig  # noqa: E402
from tinit.sweep.folder import point_dir, point_done  # noqa: E402
from tinit.sweep.local import LocalExecutor  # noqa: E402


def plan_of(args):
    model = ModelConfig(d_model=args.d_model, n_heads=2, vocab_size=64, max_seq_len=args.seq_len)
    run = RunConfig(batch=args.batch, seq_len=args.seq_len, device="cpu")
    return depth_sweep_plan(model, InitConfig(), run, parse_layers(args.layers), args.seeds,
                            ("naive", "scaled"), ("pre", "post"), grads=False)  # fmt: skip


def timed_executor(plan, executor, tmp: Path) -> float:
    run_dir = Path(tempfile.mkdtemp(dir=tmp))
    if hasattr(executor, "folder"):
        executor.folder = run_dir / "slurm"
    dirs = [point_dir(run_dir, p.name) for p in plan.points]
    t0 = time.perf_counter()
    executor.run(plan.points, dirs, plan.command, lambda info: None)
    wall = time.perf_counter() - t0
    bad = [p.name for p in plan.points if not point_done(run_dir, p.name)]
    if bad:
        raise SystemExit(f"{len(bad)} points failed, e.g. {bad[0]}")
    return wall


def slurm_slots(cpus_per_job: int) -> int:
    out = subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True, check=True).stdout
    return max(1, sum(int(x) for x in out.split()) // cpus_per_job)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="2,4,8")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--slurm", action="store_true")
    ap.add_argument("--points-per-job", default="1,4")
    args = ap.parse_args()
    torch.set_num_threads(1)
    plan = plan_of(args)
    n = len(plan.points)
    for p in plan.points[:2]:  # warm up (first-call costs are not the executor's)
        run_point(p)
    t0 = time.perf_counter()
    for p in plan.points:
        run_point(p)
    inproc = time.perf_counter() - t0
    rows = [("one process, in a loop (no files)", 1, inproc)]
    cluster = None
    with tempfile.TemporaryDirectory() as tmp:
        for w in [int(x) for x in args.workers.split(",")]:
            wall = timed_executor(plan, LocalExecutor(w, gpus=[]), Path(tmp))
            rows.append((f"local --workers {w}", w, wall))
            print(f"  local --workers {w}: {wall:.2f} s", flush=True)
        if args.slurm:
            from tinit.sweep.slurm import SlurmExecutor

            if not os.environ.get("SLURM_CONF") or shutil.which("sinfo") is None:
                cluster = Path(tmp) / "cluster"
                script = [str(ROOT / "scripts" / "slurm-local-cluster.sh")]
                subprocess.run([*script, "start", str(cluster)], check=True, stdout=subprocess.DEVNULL)
                os.environ["SLURM_CONF"] = str(cluster / "slurm.conf")
            try:
                slots = slurm_slots(1)
                for k in [int(x) for x in args.points_per_job.split(",")]:
                    ex = SlurmExecutor(Path(tmp), job_name="tinit-bench", points_per_job=k, poll_s=0.1)
                    wall = timed_executor(plan, ex, Path(tmp))
                    rows.append((f"slurm --points-per-job {k} ({-(-n // k)} tasks)", slots, wall))
                    print(f"  slurm --points-per-job {k}: {wall:.2f} s", flush=True)
            finally:
                if cluster is not None:
                    subprocess.run([*script, "stop", str(cluster)], check=False)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {load:.1f}, "
          f"torch {torch.__version__}; {n} points (depth-sweep --layers {args.layers} --seeds {args.seeds} "
          f"--no-grads, d={args.d_model}, seq {args.seq_len}, batch {args.batch}), "
          "1 thread per point")  # fmt: skip
    print(f"{'how':<40}{'slots':>6}{'wall s':>9}{'s/point':>9}{'overhead slot-s/point':>23}")
    for how, slots, wall in rows:
        over = (wall * slots - inproc) / n
        print(f"{how:<40}{slots:>6}{wall:>9.2f}{wall / n:>9.3f}{over:>23.3f}")


if __name__ == "__main__":
    main()
