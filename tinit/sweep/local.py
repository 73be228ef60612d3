"""The local executor: worker processes on this machine, each taking one point at a
time through its own pipe (a worker that dies fails only its own point; its slot gets a
fresh one). On a machine with several GPUs each worker is pinned to one of them through
``CUDA_VISIBLE_DEVICES`` (set before the worker touches CUDA), round-robin when there
are more workers than GPUs. When the sweep is stopped (a signal) the workers are
terminated, not left running.

Workers start once per sweep, all of them at :meth:`LocalExecutor.start`, each one fork
of ``tinit sweep`` itself: it has imported torch and the experiments, computed nothing
and runs no other thread yet (no progress bar, no pool: the pipes need no thread).
Before, each slot was a one-process pool whose management thread made every later slot
wait for a fork server to import torch (2 workers on 2 cores ran slower than one
process). Where forking is not safe (a GPU to hand out, a caller that has computed: the
tests' in-process CLI; and for a slot whose worker died, once threads run) the worker
comes from a fork server that imported torch and the experiments once (``forkserver``
with preload), which has run nothing either. Either way a worker exits without tearing
torch down. Where there is no fork (Windows) they are spawned.
:meth:`LocalExecutor.close` joins them and stops the server and multiprocessing's
resource tracker: nothing of a sweep outlives ``tinit sweep``."""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import wait
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
PRELOAD = [
    "tinit.sweep.worker",
    "tinit.experiments.measure.depth_sweep",
    "tinit.experiments.training.coord_check",
    "tinit.experiments.training.lr_sweep",
]


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


def _serve(conn, gpu: str | None, threads: int | None, env: dict[str, str]) -> None:
    """A worker's life: set up (:func:`_init_worker`), then measure each task
    ``(points, dirs, command)`` received and send back its records, until the pipe
    closes or ``None`` comes. It exits without tearing torch down (``os._exit``)."""
    code = 0
    try:
        _init_worker(gpu, threads, env)
        while True:
            try:
                task = conn.recv()
            except (EOFError, OSError):
                break
            if task is None:
                break
            try:
                reply: tuple[str, Any] = ("ok", run_points(*task))
            except KeyboardInterrupt:  # the sweep stops: the point's folder says so already
                break
            except Exception as exc:  # the task could not run at all (unpicklable, a bug)
                reply = ("error", f"{type(exc).__name__}: {exc}")
            conn.send(reply)
    except BaseException:
        code = 1
    finally:
        try:
            conn.close()
        finally:
            os._exit(code)


class _Worker:
    """One worker process and the pipe to it; ``task``: the point it is measuring."""

    def __init__(self, ctx, gpu: str | None, threads: int | None):
        self.conn, child = ctx.Pipe()
        self.method = ctx.get_start_method()
        self.proc = ctx.Process(target=_serve, args=(child, gpu, threads, dict(os.environ)), daemon=True)
        self.proc.start()
        child.close()
        self.task: Any = None

    def died(self) -> str:
        """Why the process ended while a point ran (killed by a signal, an exit code)."""
        self.proc.join(timeout=5)
        c = self.proc.exitcode
        how = f"killed by {signal.Signals(-c).name}" if c is not None and c < 0 else (
            f"exit code {c}" if c else "it ended abruptly")  # fmt: skip
        return f"worker process died ({how}) while running this point"

    def stop(self, wait: bool = True) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.conn.close()
        if wait:
            self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=5)


class LocalExecutor:
    """``--executor local``: ``workers`` processes on this machine, each taking one
    point at a time through its own pipe (no pool, no thread in this process)."""

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
        self._slots: list[_Worker] | None = None  # the workers taking points, once started
        self._started: list[_Worker] = []  # every worker made

    def describe(self) -> dict[str, Any]:
        return {"workers": self.workers, "gpus": self.gpus, "pinned_gpus": self.pinned,
                "threads_per_worker": self.threads}  # fmt: skip

    def _new_worker(self, k: int, fork: bool) -> _Worker:
        """Slot ``k``'s worker (pinned to the slot's GPU, if any): forked from this process
        when ``fork`` (and no thread runs here yet), else from the preloaded fork server."""
        ctx = context(fork and not self.pinned and not self.gpus)
        if ctx.get_start_method() != "fork":
            start_tracker()
            if ctx.get_start_method() == "forkserver":
                _stop_at_exit()
        worker = _Worker(ctx, self.pinned[k] if self.pinned else None, self.threads)
        self._started.append(worker)
        return worker

    def start(self, points: int) -> None:
        """Start the workers (at most one per point) now, all of them before any thread of
        this process exists (a progress bar's): each is one fork of this process, which
        has imported torch and the experiments and computed nothing."""
        if self._slots is None:
            self._slots = [self._new_worker(k, self.fork) for k in range(max(1, min(self.workers, points)))]

    def run(
        self, points: list, dirs: list[Path], command: str, update: Callable[[dict[str, dict]], None]
    ) -> dict[str, dict[str, Any]]:
        """Run the points; ``update(info)`` after every change; returns, per point name,
        its ``state`` (done or failed), ``reason`` and where it ran."""
        info: dict[str, dict[str, Any]] = {p.name: {"state": "queued"} for p in points}
        if not points:
            return info
        self.start(len(points))
        slots, self._slots = self._slots, None  # a later run starts new workers
        queue = list(zip(points, dirs, strict=True))[::-1]  # popped from the end: in order
        try:
            while queue or any(w.task is not None for w in slots):
                for k, w in enumerate(slots):
                    if w.task is None and queue:
                        if not w.proc.is_alive():  # killed between two points: no point was lost
                            slots[k] = w = self._new_worker(k, fork=False)
                        p, d = queue.pop()
                        w.task = p.name
                        try:
                            w.conn.send(([p], [str(d)], command))
                            info[p.name]["state"] = "running"
                        except (OSError, ValueError):  # its pipe broke: it died just now
                            self._finish(slots, k, info, {"state": "failed", "reason": w.died()})
                busy = [w for w in slots if w.task is not None]
                ready = set(wait([x for w in busy for x in (w.conn, w.proc.sentinel)], timeout=0.2))
                for k, w in enumerate(slots):
                    if w.task is None or not (w.conn in ready or w.proc.sentinel in ready):
                        continue
                    try:
                        status, value = w.conn.recv() if w.conn.poll() else (None, None)
                    except (EOFError, OSError):
                        status, value = None, None
                    if status == "ok":
                        self._finish(slots, k, info, _outcome(value[0]))
                    elif status == "error":
                        self._finish(slots, k, info, {"state": "failed", "reason": f"worker process failed: "
                                                      f"{value}"})  # fmt: skip
                    elif not w.proc.is_alive() or w.proc.sentinel in ready:
                        # this slot's worker died: only its point fails; the slot gets a fresh
                        # worker (from the fork server: a thread may run by now) and goes on
                        self._finish(slots, k, info, {"state": "failed", "reason": w.died()})
                update(info)
        except BaseException:
            # stopped (a signal, Ctrl-C): end the workers now rather than leave them running
            # points nobody will gather; the interrupted points are failed by the caller
            for w in slots:
                if w.proc.is_alive():
                    w.proc.terminate()
            raise
        finally:
            for w in slots:  # every point is in: the idle workers exit (joined by close)
                w.stop(wait=False)
        return info

    def _finish(self, slots: list[_Worker], k: int, info: dict, outcome: dict[str, Any]) -> None:
        w = slots[k]
        info[w.task] = outcome
        w.task = None
        if (outcome.get("reason") or "").startswith("worker process died"):
            slots[k] = self._new_worker(k, fork=False)

    def close(self) -> None:
        """Join the workers and stop the helper processes: once this returns, nothing
        the executor started is running."""
        helpers = any(w.method != "fork" for w in self._started)
        for w in self._started:
            w.stop(wait=True)
        self._slots, self._started = None, []
        if helpers:
            stop_helpers()


def _outcome(r: dict[str, Any]) -> dict[str, Any]:
    out = {"state": "done" if r["complete"] else "failed", "reason": r["error"], "seconds": r["seconds"]}
    return {**out, **{k: v for k, v in r.items() if k in ("host", "pid", "cuda_visible_devices")}}
