"""What runs on a worker (a local pool process or a SLURM array task): measure points and
write each one's folder, ``<run>/points/<name>/``: its CSVs (full precision, so gathering
them loses nothing) and config.json, written last, which says whether the point is
complete, why not, and where it ran (host, pid, SLURM job, visible GPUs)."""

from __future__ import annotations

import json
import os
import platform
import time
import traceback
from pathlib import Path
from typing import Any

#: The environment variables that say where a point ran.
WHERE_VARS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NODELIST",
              "CUDA_VISIBLE_DEVICES")  # fmt: skip


def where() -> dict[str, Any]:
    """This process's host, pid, parent pid (a local worker's: `tinit sweep` itself when
    it was forked from it, else the fork server) and SLURM/GPU placement."""
    env = {k.lower(): os.environ[k] for k in WHERE_VARS if k in os.environ}
    if "slurm_array_job_id" in env and "slurm_array_task_id" in env:
        env["slurm_task"] = f"{env['slurm_array_job_id']}_{env['slurm_array_task_id']}"
    return {"host": platform.node(), "pid": os.getpid(), "ppid": os.getppid(), **env}


def write_frames(point_dir: Path, frames: dict) -> None:
    """Each frame as ``<stem>.csv`` at full precision (shortest round-trip repr)."""
    for stem, df in frames.items():
        df.to_csv(point_dir / f"{stem}.csv", index=False)


def run_one(point, point_dir: str | Path, command: str) -> dict[str, Any]:
    """Measure one point into ``point_dir`` (created). A folder that already holds the
    point's config.json (a preempted task that SLURM requeued) is left as it is. A
    failure is recorded in the folder (what was measured kept, ``complete: false`` and
    the error), never raised; an interrupt is recorded and re-raised."""
    from ..experiments.points import run_point
    from ..experiments.result import IncompleteRun
    from ..results.rundir import write_config

    point_dir = Path(point_dir)
    point_dir.mkdir(parents=True, exist_ok=True)
    if (point_dir / "config.json").exists():  # a requeued task: this point has its record already
        rec = json.loads((point_dir / "config.json").read_text())
        return {"name": point.name, "complete": bool(rec.get("complete")), "error": rec.get("error"),
                "seconds": rec.get("point_seconds"), **rec.get("where", {})}  # fmt: skip
    here, t0 = where(), time.perf_counter()
    result, error, interrupted = None, None, None
    try:
        result = run_point(point)
        error = result.error
    except IncompleteRun as exc:
        result, error = exc.result, str(exc)
    except KeyboardInterrupt as exc:
        error, interrupted = "interrupted", exc
    except Exception as exc:  # recorded in the point's folder; the other points go on
        error = f"{type(exc).__name__}: {exc}"
        (point_dir / "traceback.txt").write_text(traceback.format_exc())
    complete = result is not None and result.complete and error is None
    if result is not None:
        write_frames(point_dir, result.frames)
    seconds = time.perf_counter() - t0
    meta = dict(result.meta) if result is not None else {}
    tmp = point_dir / ".config"
    tmp.mkdir(exist_ok=True)
    write_config(tmp, command, meta, complete=complete, error=error, point=point.name,
                 labels=point.labels, where=here, point_seconds=seconds)  # fmt: skip
    os.replace(tmp / "config.json", point_dir / "config.json")  # whole, or not there
    tmp.rmdir()
    if interrupted is not None:
        raise interrupted
    return {"name": point.name, "complete": complete, "error": error, "seconds": seconds, **here}


def run_points(points: list, dirs: list[str], command: str) -> list[dict[str, Any]]:
    """Measure several points one after the other (one SLURM task may hold several)."""
    return [run_one(p, d, command) for p, d in zip(points, dirs, strict=True)]
