"""The local executor: a pool of worker processes (spawned, so each starts clean), one
point per task. On a machine with several GPUs each worker is pinned to one of them
through ``CUDA_VISIBLE_DEVICES`` (set before the worker touches CUDA), round-robin when
there are more workers than GPUs."""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from .worker import run_points


def visible_gpus() -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES's entries when set, else
    every CUDA device torch sees (none on a CPU-only machine)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def _init_worker(gpus, threads: int | None) -> None:
    """Pool initializer, before any task: take a GPU, set the thread count."""
    gpu = gpus.get()
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


class LocalExecutor:
    """``--executor local``: ``workers`` processes on this machine."""

    name = "local"

    def __init__(self, workers: int, gpus: list[str] | None = None):
        self.workers = workers
        self.gpus = visible_gpus() if gpus is None else gpus
        self.job_ids: list[str] = []
        # pin one GPU per worker only where there is a choice to make
        self.pinned = [self.gpus[k % len(self.gpus)] for k in range(workers)] if len(self.gpus) > 1 else None
        # CPU threads split between the workers unless the user set them
        cpus = os.cpu_count() or 1
        self.threads = None if "OMP_NUM_THREADS" in os.environ else max(1, cpus // workers)

    def describe(self) -> dict[str, Any]:
        return {"workers": self.workers, "gpus": self.gpus, "pinned_gpus": self.pinned,
                "threads_per_worker": self.threads}  # fmt: skip

    def run(
        self, points: list, dirs: list[Path], command: str, update: Callable[[dict[str, dict]], None]
    ) -> dict[str, dict[str, Any]]:
        """Run the points; ``update(info)`` after every change; returns, per point name,
        its ``state`` (done or failed), ``reason`` and where it ran."""
        info: dict[str, dict[str, Any]] = {p.name: {"state": "queued"} for p in points}
        if not points:
            return info
        ctx = mp.get_context("spawn")
        gpus = ctx.Queue()
        for k in range(self.workers):
            gpus.put(self.pinned[k] if self.pinned else None)
        workers = min(self.workers, len(points))
        pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                   initargs=(gpus, self.threads))  # fmt: skip
        futures = {
            pool.submit(run_points, [p], [str(d)], command): p.name for p, d in zip(points, dirs, strict=True)
        }
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                for f in done:
                    info[futures[f]] = _outcome(f)
                for f in pending:
                    if f.running():
                        info[futures[f]]["state"] = "running"
                update(info)
        finally:
            # every point is in; the idle workers exit on their own (joined at exit), while
            # this process gathers (waiting here for torch's teardown costs ~2 s)
            pool.shutdown(wait=False, cancel_futures=True)
        return info


def _outcome(future) -> dict[str, Any]:
    try:
        r = future.result()[0]
    except Exception as exc:  # the worker died (killed, out of host memory) or could not start
        return {"state": "failed", "reason": f"worker process failed: {type(exc).__name__}: {exc}"}
    out = {"state": "done" if r["complete"] else "failed", "reason": r["error"], "seconds": r["seconds"]}
    return {**out, **{k: v for k, v in r.items() if k in ("host", "pid", "cuda_visible_devices")}}
