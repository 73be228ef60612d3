"""Run a plan's points with an executor into a run folder and gather them: the
merged frames of the command (from the points' CSVs, so a resumed sweep gathers
exactly like a fresh one) and the sweep's record for config.json."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..experiments.points import Plan
from ..experiments.result import ExperimentResult
from ..results.rundir import write_config
from .folder import point_dir, point_done, point_record, read_point_frames, set_aside

STATES = ("done", "running", "queued", "failed")


def counts(info: dict[str, dict[str, Any]]) -> dict[str, int]:
    """How many points are in each state."""
    out = dict.fromkeys(STATES, 0)
    for entry in info.values():
        out[entry["state"]] = out.get(entry["state"], 0) + 1
    return out


def _from_record(run_dir: Path, name: str) -> dict[str, Any]:
    rec = point_record(run_dir, name) or {}
    where = rec.get("where", {})
    return {"state": "done" if rec.get("complete") else "failed", "reason": rec.get("error"),
            "host": where.get("host"), "job_id": where.get("slurm_task") or where.get("slurm_job_id"),
            "cuda_visible_devices": where.get("cuda_visible_devices"), "device": rec.get("device"),
            "seconds": rec.get("point_seconds")}  # fmt: skip


def sweep_record(plan: Plan, args: list[str], runs: list[dict], info: dict[str, dict]) -> dict[str, Any]:
    points = {p.name: {**p.labels, **info[p.name]} for p in plan.points}
    return {"command": plan.command, "args": list(args), "runs": runs, "counts": counts(info),
            "points": points, "executor": runs[-1]["executor"] if runs else None,
            "job_ids": [j for r in runs for j in r.get("job_ids", [])]}  # fmt: skip


def run_sweep(
    plan: Plan,
    executor,
    run_dir: Path,
    args: list[str],
    update: Callable[[dict[str, dict]], None] = lambda info: None,
    previous_runs: list[dict] | None = None,
    cli_options: dict[str, Any] | None = None,
    after_run: Callable[[], None] = lambda: None,
) -> tuple[ExperimentResult, dict[str, Any]]:
    """Run the plan's points that are not done yet in ``run_dir`` (a failed point's
    folder is set aside first, never overwritten), then gather every done point.

    Returns the gathered result (``complete`` only when every point is done; the
    ``error`` names the failed points and why) and the sweep's record. A
    KeyboardInterrupt (or the CLI's Stopped, for SIGTERM and SIGHUP) while the points run
    stops them; the points not done are failed with that reason. ``after_run`` is called
    once the executor has returned or been stopped."""
    names = [p.name for p in plan.points]
    info = {n: _from_record(run_dir, n) if point_done(run_dir, n) else {"state": "queued"} for n in names}
    todo = [p for p in plan.points if info[p.name]["state"] != "done"]
    attempts = {p.name: str(a.relative_to(run_dir)) for p in todo if (a := set_aside(run_dir, p.name))}
    started = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    run = {"executor": executor.name, "options": executor.describe(), "points": [p.name for p in todo],
           "started": started, "job_ids": [], "cli_options": dict(cli_options or {})}  # fmt: skip
    if attempts:
        run["set_aside"] = attempts
    runs = [*(previous_runs or []), run]

    def record_running(job_ids: list[str] | None = None) -> None:
        # a record before anything runs: a sweep whose parent dies can still be resumed
        if job_ids is not None:
            run["job_ids"] = list(job_ids)
        write_config(run_dir, plan.command, {**plan.meta, "sweep": sweep_record(plan, args, runs, info)},
                     complete=False, error="running")  # fmt: skip

    if hasattr(executor, "on_submit"):
        executor.on_submit = record_running
    interrupted = None
    try:
        record_running()
        got = executor.run(todo, [point_dir(run_dir, p.name) for p in todo], plan.command,
                           lambda i: update({**info, **i}))  # fmt: skip
        info.update(got)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP (the CLI's handlers raise Stopped)
        signal_name = getattr(exc, "signal_name", None)
        interrupted = f"stopped by {signal_name}" if signal_name else "interrupted"
    finally:
        run["job_ids"] = list(executor.job_ids)
        after_run()  # (the CLI: from here a signal no longer interrupts; the gathering finishes)
    # the folders are the truth: a point is done when its folder says so
    frames = {}
    for n in names:
        if point_done(run_dir, n):
            info[n] = {**info.get(n, {}), **_from_record(run_dir, n)}
            frames[n] = read_point_frames(run_dir, n)
        elif info[n]["state"] != "failed" or interrupted:
            rec = point_record(run_dir, n)
            reason = (rec or {}).get("error") or interrupted or "no result was written"
            info[n] = {**info[n], "state": "failed", "reason": reason}
    update(info)
    failed = [n for n in names if info[n]["state"] != "done"]
    devices = sorted({str(e["device"]) for e in info.values() if e.get("device")})
    record = sweep_record(plan, args, runs, info)
    meta = {**plan.meta, "devices": devices, "sweep": record}
    error = None
    if failed:
        first = "; ".join(f"{n}: {info[n].get('reason')}" for n in failed[:3])
        more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
        error = f"{len(failed)} of {len(names)} points failed ({first}{more})"
        if interrupted:
            error = f"{interrupted}; {error}"
    gathered = plan.gather(frames)
    na = plan.not_applicable(gathered) if callable(plan.not_applicable) else plan.not_applicable
    return ExperimentResult(gathered, meta, not failed, error, na), record
