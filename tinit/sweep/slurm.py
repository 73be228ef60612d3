"""The SLURM executor: the points as one job array through submitit (``pip install -e
".[slurm]"``), ``points_per_job`` points per array task.

Every task runs :func:`tinit.sweep.worker.run_points` with this machine's python
(``sys.executable``) and this tinit on ``PYTHONPATH``, so the cluster's nodes must see
the same paths (a shared filesystem, as submitit requires anyway). The executor follows
the tasks with ``squeue``; a task that left the queue without writing its points is
failed with the reason SLURM gives (``scontrol show job``, else ``sacct``, else the
``***`` line slurmstepd writes into the task's log: CANCELLED, TIME LIMIT, PREEMPTION).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .folder import point_record
from .worker import run_points

#: SLURM's job states that end a task, with what they mean for its points.
END_STATES = {
    "CANCELLED": "cancelled (scancel, or the scheduler)",
    "TIMEOUT": "timed out (the job's --time)",
    "PREEMPTED": "preempted",
    "NODE_FAIL": "its node failed",
    "OUT_OF_MEMORY": "out of memory (the job's --mem)",
    "FAILED": "the job failed",
    "BOOT_FAIL": "its node failed to boot",
    "DEADLINE": "reached its deadline",
    "COMPLETED": "the job ended without writing the point",
}
_LOG_REASONS = (
    ("DUE TO TIME LIMIT", "TIMEOUT"), ("DUE TO PREEMPTION", "PREEMPTED"),
    ("DUE TO NODE FAILURE", "NODE_FAIL"), ("CANCELLED", "CANCELLED"),
)  # fmt: skip
TIME_RE = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")
MEM_RE = re.compile(r"^\d+[KMGT]?$", re.IGNORECASE)


class SubmitError(RuntimeError):
    """sbatch refused the array (its message), or there is no SLURM here."""


def tinit_root() -> Path:
    """The folder to put on PYTHONPATH so a task imports this very tinit."""
    import tinit

    return Path(tinit.__file__).resolve().parents[1]


class SlurmExecutor:
    """``--executor slurm``: one job array of ceil(points / points_per_job) tasks."""

    name = "slurm"

    def __init__(
        self,
        folder: Path,
        *,
        job_name: str = "tinit",
        partition: str | None = None,
        gpus_per_job: int | None = None,
        cpus_per_job: int | None = None,
        mem: str | None = None,
        time_limit: str | None = None,
        array_parallelism: int | None = None,
        account: str | None = None,
        qos: str | None = None,
        slurm_args: dict[str, str] | None = None,
        points_per_job: int = 1,
        poll_s: float = 0.5,
    ):
        self.folder, self.points_per_job, self.poll_s = Path(folder), points_per_job, poll_s
        self.job_ids: list[str] = []
        #: called with the job ids once the array is submitted (the sweep records them)
        self.on_submit: Callable[[list[str]], None] | None = None
        cpus = cpus_per_job or 1
        params: dict[str, Any] = {
            "job_name": job_name,
            "cpus_per_task": cpus,
            "setup": [
                f"export PYTHONPATH={shlex.quote(str(tinit_root()))}${{PYTHONPATH:+:$PYTHONPATH}}",
                f"export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-{cpus}}}",
            ],
        }
        optional = {"partition": partition, "gpus_per_node": gpus_per_job, "mem": mem, "time": time_limit,
                    "account": account, "qos": qos, "array_parallelism": array_parallelism}  # fmt: skip
        params.update({k: v for k, v in optional.items() if v is not None})
        if slurm_args:
            params["additional_parameters"] = dict(slurm_args)
        self.params = params

    def describe(self) -> dict[str, Any]:
        return {"points_per_job": self.points_per_job, "python": sys.executable,
                "pythonpath": str(tinit_root()), "sbatch": self.params}  # fmt: skip

    def chunks(self, points: list, dirs: list[Path]) -> list[tuple[list, list[str]]]:
        k = self.points_per_job
        return [(points[i : i + k], [str(d) for d in dirs[i : i + k]]) for i in range(0, len(points), k)]

    def _python(self) -> str:
        return shlex.quote(sys.executable)

    def sbatch_script(self, n_tasks: int) -> str:
        """The sbatch script submitit would submit for an array of ``n_tasks``."""
        from submitit.slurm.slurm import _make_sbatch_string

        command = f"{self._python()} -u -m submitit.core._submit {shlex.quote(str(self.folder))}"
        params = {k: v for k, v in self.params.items() if k != "array_parallelism"}
        return _make_sbatch_string(
            command=command, folder=self.folder, map_count=n_tasks,
            array_parallelism=self.params.get("array_parallelism", 256), **params,
        )  # fmt: skip

    def submit(self, points: list, dirs: list[Path], command: str) -> list:
        """Submit the array; returns submitit's jobs (one per task)."""
        if shutil.which("sbatch") is None:
            raise SubmitError("no SLURM here: sbatch is not on PATH")
        import submitit

        ex = submitit.SlurmExecutor(folder=self.folder, python=self._python())
        ex.update_parameters(**self.params)
        chunks = self.chunks(points, dirs)
        try:
            jobs = ex.map_array(run_points, [c[0] for c in chunks], [c[1] for c in chunks],
                                [command] * len(chunks))  # fmt: skip
        except Exception as exc:  # sbatch's refusal (bad partition, account, ...)
            raise SubmitError(" ".join(str(exc).split())[:500]) from exc
        self.job_ids = sorted({j.job_id.split("_")[0] for j in jobs})
        return jobs

    def run(
        self, points: list, dirs: list[Path], command: str, update: Callable[[dict[str, dict]], None]
    ) -> dict[str, dict[str, Any]]:
        info: dict[str, dict[str, Any]] = {p.name: {"state": "queued"} for p in points}
        if not points:
            return info
        jobs = self.submit(points, dirs, command)
        if self.on_submit is not None:
            self.on_submit(self.job_ids)
        chunks = self.chunks(points, dirs)
        tasks = {j.job_id: (j, *chunk) for j, chunk in zip(jobs, chunks, strict=True)}
        for tid, (_, pts, _) in tasks.items():
            for p in pts:
                info[p.name]["job_id"] = tid
        live = set(tasks)
        try:
            self._follow(tasks, live, info, update)
        except KeyboardInterrupt:  # the user stops the sweep: stop its tasks too
            _slurm("scancel", *self.job_ids)
            raise
        return info

    def _follow(self, tasks: dict, live: set, info: dict, update: Callable) -> None:
        """Poll the queue and the point folders until every task has left the queue."""
        while live:
            queue = squeue(self.job_ids)
            if queue is None:  # the controller did not answer: try again
                time.sleep(self.poll_s)
                continue
            for tid in list(live):
                job, pts, pdirs = tasks[tid]
                state = queue.get(tid) or ("PENDING" if _pending_in_range(queue, tid) else None)
                for p, d in zip(pts, pdirs, strict=True):
                    _point_info(info[p.name], Path(d), state)
                if state is None:  # left the queue: final
                    live.discard(tid)
                    reason = end_reason(tid, Path(str(job.paths.stderr)))
                    for p in pts:
                        if info[p.name]["state"] not in ("done", "failed"):
                            info[p.name].update(state="failed", reason=reason)
            update(info)
            if live:
                time.sleep(self.poll_s)


def _point_info(entry: dict[str, Any], point_dir: Path, state: str | None) -> None:
    """Update one point's entry from its folder and its task's queue state."""
    rec = point_record(point_dir.parent.parent, point_dir.name)
    if rec is not None:
        where = rec.get("where", {})
        entry.update(state="done" if rec.get("complete") else "failed", reason=rec.get("error"),
                     host=where.get("host"), seconds=rec.get("point_seconds"))  # fmt: skip
    elif state in ("RUNNING", "COMPLETING", "CONFIGURING", "STAGE_OUT"):
        entry["state"] = "running"
    elif state is not None:
        entry["state"] = "queued"


def _slurm(*args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None


def squeue(job_ids: list[str]) -> dict[str, str] | None:
    """Task id -> state for the arrays' tasks still in the queue (pending ranges such as
    ``12_[3-5%2]`` are kept as keys too); None when squeue fails."""
    out = _slurm("squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", "%i %T")
    if out is None or out.returncode != 0:
        if out is not None and "Invalid job id" in out.stderr:
            return {}  # every job has left the controller's memory
        return None
    states = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def _pending_in_range(queue: dict[str, str], tid: str) -> bool:
    """Whether ``tid`` (``12_4``) is inside a pending range squeue printed (``12_[3-5%2]``)."""
    if "_" not in tid:
        return False
    job, task = tid.split("_", 1)
    for key in queue:
        m = re.fullmatch(rf"{job}_\[(.+?)(%\d+)?\]", key)
        if m:
            for part in m.group(1).split(","):
                lo, _, hi = part.partition("-")
                if int(lo) <= int(task) <= int(hi or lo):
                    return True
    return False


def end_reason(task_id: str, stderr_log: Path) -> str:
    """Why a task that left the queue ended, from SLURM's record or the task's log."""
    state = None
    out = _slurm("scontrol", "show", "job", "-o", task_id)
    if out is not None and out.returncode == 0:
        m = re.search(r"\bJobState=(\S+)", out.stdout)
        state = m.group(1) if m else None
    if state is None:
        out = _slurm("sacct", "-n", "-P", "-X", "-j", task_id, "-o", "State")
        if out is not None and out.returncode == 0 and out.stdout.strip():
            state = out.stdout.split()[0]
    if state is None and stderr_log.exists():
        text = stderr_log.read_text(errors="replace")
        for needle, st in _LOG_REASONS:
            if re.search(rf"\*\*\*.*{needle}", text):
                state = st
                break
    if state is None:
        return f"task {task_id} left the queue without writing the point; SLURM no longer knows why"
    word = state.split()[0].rstrip("+")
    why = END_STATES.get(word, word.lower())
    tail = _log_tail(stderr_log) if word in ("FAILED", "COMPLETED") else ""
    return f"task {task_id} {why} ({word})" + (f": {tail}" if tail else "")


def _log_tail(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip()[:300] if lines else ""
