"""A sweep's run folder: ``points/<name>/`` per point, the merged files of the command
beside them, and config.json with the sweep's record (``sweep``: the command and its
arguments, the executor and its options, job ids, and each point's state, reason and
host). Reading a point never trusts a half-written folder: a point is done only when
its config.json (written last) says ``complete``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

POINTS = "points"


def point_dir(run_dir: Path, name: str) -> Path:
    return Path(run_dir) / POINTS / name


def point_record(run_dir: Path, name: str) -> dict[str, Any] | None:
    """The point's config.json, or None while it has none (not run, or running)."""
    path = point_dir(run_dir, name) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def point_done(run_dir: Path, name: str) -> bool:
    rec = point_record(run_dir, name)
    return bool(rec and rec.get("complete"))


def read_point_frames(run_dir: Path, name: str, stems: list[str] | None = None) -> dict[str, pd.DataFrame]:
    """The frames a point wrote (its CSVs), by stem."""
    d = point_dir(run_dir, name)
    paths = sorted(d.glob("*.csv")) if stems is None else [d / f"{s}.csv" for s in stems]
    return {p.stem: pd.read_csv(p) for p in paths}


def set_aside(run_dir: Path, name: str) -> Path | None:
    """Move a failed point's folder to ``points/<name>.attempt-<n>`` (kept, never
    overwritten) so the point can run again; None when it has no folder."""
    d = point_dir(run_dir, name)
    if not d.exists():
        return None
    n = 1
    while (d.parent / f"{name}.attempt-{n}").exists():
        n += 1
    target = d.parent / f"{name}.attempt-{n}"
    d.rename(target)
    return target


def set_aside_merged(run_dir: Path) -> Path | None:
    """Before a resumed sweep writes its merged files, move the previous ones (the
    top-level files: CSVs, plots, config.json) to ``previous/<n>/``."""
    files = [p for p in Path(run_dir).iterdir() if p.is_file()]
    if not files:
        return None
    n = 1
    while (Path(run_dir) / "previous" / str(n)).exists():
        n += 1
    target = Path(run_dir) / "previous" / str(n)
    target.mkdir(parents=True)
    for p in files:
        p.rename(target / p.name)
    return target


def read_sweep_record(run_dir: Path) -> dict[str, Any]:
    """The sweep's config.json (raises OSError/ValueError when absent or unreadable)."""
    doc = json.loads((Path(run_dir) / "config.json").read_text())
    if "sweep" not in doc:
        raise ValueError(f"{run_dir}/config.json is not a sweep's (no 'sweep' record)")
    return doc
