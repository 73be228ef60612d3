"""The local executor: worker processes (spawned, so each starts clean), one point per
task, each worker slot its own one-process pool (a worker that dies fails only its own
point; the slot gets a fresh one). On a machine with several GPUs each worker is pinned
to one of them through ``CUDA_VISIBLE_DEVICES`` (set before the worker touches CUDA),
round-robin when there are more workers than GPUs. When the sweep is stopped (a signal)
the workers are terminated, not left running."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
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


def _init_worker(gpu: str | None, threads: int | None) -> None:
    """Pool initializer, before any task: take the slot's GPU, set the thread count."""
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
        # one single-process pool per worker slot: a worker that dies (killed, out of host
        # memory) breaks only its own pool, so only the point it ran fails; the slot gets a
        # fresh worker and the other points go on (one shared pool fails every pending point)
        slots = min(self.workers, len(points))

        def new_pool(k: int) -> ProcessPoolExecutor:
            gpu = self.pinned[k] if self.pinned else None
            return ProcessPoolExecutor(1, mp_context=ctx, initializer=_init_worker,
                                       initargs=(gpu, self.threads))  # fmt: skip

        pools = [new_pool(k) for k in range(slots)]
        queue = list(zip(points, dirs, strict=True))[::-1]  # popped from the end: in order
        running: dict[Future, tuple[int, str, list]] = {}
        try:
            while queue or running:
                busy = {k for k, _, _ in running.values()}
                for k in range(slots):
                    if k not in busy and queue:
                        p, d = queue.pop()
                        f = pools[k].submit(run_points, [p], [str(d)], command)
                        running[f] = (k, p.name, list(getattr(pools[k], "_processes", {}).values()))
                done, _ = wait(running, timeout=0.2, return_when=FIRST_COMPLETED)
                for f in done:
                    k, name, procs = running.pop(f)
                    info[name] = _outcome(f, procs)
                    if isinstance(f.exception(), BrokenProcessPool):
                        pools[k].shutdown(wait=False)
                        pools[k] = new_pool(k)
                for f, (_, name, _) in running.items():
                    if f.running():
                        info[name]["state"] = "running"
                update(info)
        except BaseException:
            # stopped (a signal, Ctrl-C): end the workers now rather than leave them running
            # points nobody will gather; the interrupted points are failed by the caller
            for pool in pools:
                for proc in list(getattr(pool, "_processes", {}).values()):
                    proc.terminate()
            raise
        finally:
            # every point is in; the idle workers exit on their own (joined at exit), while
            # this process gathers (waiting here for torch's teardown costs ~2 s)
            for pool in pools:
                pool.shutdown(wait=False, cancel_futures=True)
        return info


def _outcome(future, procs: list | None = None) -> dict[str, Any]:
    try:
        r = future.result()[0]
    except BrokenProcessPool:  # this slot's worker died (killed, out of host memory)
        codes = []
        for proc in procs or []:
            proc.join(timeout=5)
            codes.append(proc.exitcode)
        how = next((f"killed by {signal.Signals(-c).name}" for c in codes if c is not None and c < 0), None)
        how = how or next((f"exit code {c}" for c in codes if c), "it ended abruptly")
        return {"state": "failed", "reason": f"worker process died ({how}) while running this point"}
    except Exception as exc:  # the worker could not start, or the task could not be sent
        return {"state": "failed", "reason": f"worker process failed: {type(exc).__name__}: {exc}"}
    out = {"state": "done" if r["complete"] else "failed", "reason": r["error"], "seconds": r["seconds"]}
    return {**out, **{k: v for k, v in r.items() if k in ("host", "pid", "cuda_visible_devices")}}
