"""The local executor: worker processes on this machine, one point per task, each
worker slot its own one-process pool (a worker that dies fails only its own point; the
slot gets a fresh one). On a machine with several GPUs each worker is pinned to one of
them through ``CUDA_VISIBLE_DEVICES`` (set before the worker touches CUDA), round-robin
when there are more workers than GPUs. When the sweep is stopped (a signal) the workers
are terminated, not left running.

Workers start once per sweep and at the cost of a fork, with torch and tinit imported:
never spawned to import them again each (a spawned pair of workers cost a plain pool's
whole run). A parent that has computed nothing, has no GPU to hand out and runs one
thread (``tinit sweep`` itself, before its progress bar starts: :meth:`LocalExecutor.start`)
forks them from itself, as a plain pool does; otherwise (and for a slot whose worker
died, once the progress bar's thread runs) they are forked from a fork server that
imported torch and the experiments once (``forkserver`` with preload), which has run
nothing either (no CUDA, no thread pool). Either way a worker exits without tearing
torch down. Where there is no fork (Windows) they are spawned.
:meth:`LocalExecutor.close` joins them and stops the server and multiprocessing's
resource tracker: nothing of a sweep outlives ``tinit sweep``."""

from __future__ import annotations

import atexit
import gc
import multiprocessing as mp
import os
import signal
import threading
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


#: What a worker needs, imported once by the fork server (torch, pandas and the experiments).
PRELOAD = ["tinit.sweep.worker", "tinit.experiments.measure.depth_sweep",
           "tinit.experiments.training.coord_check", "tinit.experiments.training.lr_sweep"]


def context(fork: bool = False):
    """The start method of the workers: this process itself (``fork``) when the caller
    says it is safe and no other thread runs, else a preloaded fork server where there
    is one, else spawn."""
    methods = mp.get_all_start_methods()
    if fork and "fork" in methods and threading.active_count() == 1:
        return mp.get_context("fork")
    if "forkserver" not in methods:
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def stop_helpers(tracker: bool = True) -> None:
    """Stop the fork server (and, with ``tracker``, multiprocessing's resource tracker)
    this process started, and wait for them: left alone they exit a moment after this
    process, stray processes in its group. The server is terminated (it may still be
    importing) and reaped by its ``_stop``; the tracker is stopped by closing its pipe,
    once every semaphore of the pool is released (else it reports them leaked). Where a
    Python lacks these private ``_stop`` methods, the helpers exit on their own."""
    from multiprocessing import forkserver, resource_tracker

    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if pid is not None:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    helpers = [server, getattr(resource_tracker, "_resource_tracker", None) if tracker else None]
    for helper in helpers:
        stop = getattr(helper, "_stop", None)
        if stop is not None:
            try:
                stop()
            except (OSError, ValueError):  # already gone
                pass


def start_tracker() -> None:
    """Start multiprocessing's resource tracker now, with SIGHUP blocked in it. A closed
    terminal sends SIGHUP to the whole process group; the tracker ignores SIGINT and
    SIGTERM but died of SIGHUP, and the one multiprocessing then relaunched printed a
    traceback for every semaphore it had never seen. The sweep itself still gets the
    signal (it is blocked only while the tracker is spawned, and delivered after), and
    the tracker exits with the sweep (its pipe closes; :func:`stop_helpers`)."""
    from multiprocessing import resource_tracker

    block = getattr(signal, "pthread_sigmask", None)
    hup = getattr(signal, "SIGHUP", None)
    if block is None or hup is None or threading.current_thread() is not threading.main_thread():
        resource_tracker.ensure_running()
        return
    before = block(signal.SIG_BLOCK, {hup})
    try:
        resource_tracker.ensure_running()
    finally:
        if hup not in before:
            block(signal.SIG_UNBLOCK, {hup})


_STOP_REGISTERED = False


def _stop_at_exit() -> None:
    """At exit, after the pool's workers are joined, stop the fork server (terminated:
    an early exit must not wait for its imports). The tracker is left to exit on its
    own there: multiprocessing releases the semaphores after this runs."""
    global _STOP_REGISTERED
    if not _STOP_REGISTERED:
        atexit.register(stop_helpers, tracker=False)
        _STOP_REGISTERED = True


def _init_worker(gpu: str | None, threads: int | None, env: dict[str, str] | None = None) -> None:
    """Pool initializer, before any task: take the parent's environment (a forked worker
    has the fork server's, from when it started), take the slot's GPU, set the thread
    count (``$OMP_NUM_THREADS`` when ``threads`` is None: torch read it when the server
    imported it)."""
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if threads is None and omp.isdigit() and int(omp) > 0:
        threads = int(omp)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


class LocalExecutor:
    """``--executor local``: ``workers`` processes on this machine."""

    name = "local"

    def __init__(self, workers: int, gpus: list[str] | None = None, fork: bool = False):
        """``fork``: the caller has run no torch computation (no thread pool, no CUDA), so
        the workers may be forked from it (taken only when no GPU is to be handed out)."""
        self.workers = workers
        self.fork = fork
        self.gpus = visible_gpus() if gpus is None else gpus
        self.job_ids: list[str] = []
        # pin one GPU per worker only where there is a choice to make
        self.pinned = [self.gpus[k % len(self.gpus)] for k in range(workers)] if len(self.gpus) > 1 else None
        # CPU threads split between the workers unless the user set them
        cpus = os.cpu_count() or 1
        self.threads = None if "OMP_NUM_THREADS" in os.environ else max(1, cpus // workers)
        self._pools: list[ProcessPoolExecutor] | None = None  # the slots taking points, once started
        self._started: list[tuple[ProcessPoolExecutor, str]] = []  # every pool made, and its start method

    def describe(self) -> dict[str, Any]:
        return {"workers": self.workers, "gpus": self.gpus, "pinned_gpus": self.pinned,
                "threads_per_worker": self.threads}  # fmt: skip

    def _new_pool(self, k: int, fork: bool) -> ProcessPoolExecutor:
        """Slot ``k``'s one-process pool (its worker pinned to the slot's GPU, if any)."""
        ctx = context(fork and not self.pinned and not self.gpus)
        if ctx.get_start_method() == "forkserver":
            _stop_at_exit()
        gpu = self.pinned[k] if self.pinned else None
        pool = ProcessPoolExecutor(1, mp_context=ctx, initializer=_init_worker,
                                   initargs=(gpu, self.threads, dict(os.environ)))  # fmt: skip
        self._started.append((pool, ctx.get_start_method()))
        if ctx.get_start_method() == "fork":
            pool.submit(int).result()  # the first task forks the worker, here and now
        return pool

    def start(self, points: int) -> None:
        """Start the workers (at most one per point) now: forked workers must be made
        before any other thread of this process exists (a progress bar's)."""
        if self._pools is None:
            start_tracker()
            self._pools = [self._new_pool(k, self.fork) for k in range(max(1, min(self.workers, points)))]

    def run(
        self, points: list, dirs: list[Path], command: str, update: Callable[[dict[str, dict]], None]
    ) -> dict[str, dict[str, Any]]:
        """Run the points; ``update(info)`` after every change; returns, per point name,
        its ``state`` (done or failed), ``reason`` and where it ran."""
        info: dict[str, dict[str, Any]] = {p.name: {"state": "queued"} for p in points}
        if not points:
            return info
        self.start(len(points))
        pools, self._pools = self._pools, None  # a later run starts new pools
        slots = len(pools)
        queue = list(zip(points, dirs, strict=True))[::-1]  # popped from the end: in order
        running: dict[Future, tuple[int, str, list]] = {}
        try:
            while queue or running:
                busy = {k for k, _, _ in running.values()}
                for k in range(slots):
                    if k not in busy and queue:
                        p, d = queue.pop()
                        f, pools[k] = self._submit(pools[k], k, run_points, [p], [str(d)], command)
                        running[f] = (k, p.name, list(getattr(pools[k], "_processes", {}).values()))
                done, _ = wait(running, timeout=0.2, return_when=FIRST_COMPLETED)
                for f in done:
                    k, name, procs = running.pop(f)
                    info[name] = _outcome(f, procs)
                    if isinstance(f.exception(), BrokenProcessPool):
                        # this slot's worker died: only its point fails; the slot gets a fresh
                        # worker (from the fork server: a thread runs by now) and goes on
                        pools[k].shutdown(wait=False)
                        pools[k] = self._new_pool(k, fork=False)
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
            # every point is in; the idle workers exit on their own while this process
            # gathers (joined by :meth:`close`, or at exit)
            for pool in pools:
                pool.shutdown(wait=False, cancel_futures=True)
        return info

    def _submit(self, pool: ProcessPoolExecutor, k: int, *task) -> tuple[Future, ProcessPoolExecutor]:
        """Submit ``task`` to slot ``k``; a slot whose idle worker has died (killed between
        two points: no point was lost) gets a fresh worker first."""
        if all(p.is_alive() for p in (getattr(pool, "_processes", None) or {}).values()):
            try:
                return pool.submit(*task), pool
            except BrokenProcessPool:
                pass
        pool.shutdown(wait=False)
        pool = self._new_pool(k, fork=False)
        return pool.submit(*task), pool

    def close(self) -> None:
        """Join the workers and stop the helper processes: once this returns, nothing
        the executor started is running."""
        tracked = False  # semaphores of a forked pool are unlinked at once, never tracked
        for pool, method in self._started:
            tracked |= method != "fork"
            pool.shutdown(wait=True)
        self._pools, self._started = None, []
        if tracked:
            gc.collect()  # the pools' semaphores are unregistered from the tracker as they go
            stop_helpers()


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
