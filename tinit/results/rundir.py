"""Run folders and what goes in them: config.json and tidy CSVs. Never overwrites."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd


class OutputError(OSError):
    """The run folder cannot be created or written (names the path)."""


def new_run_dir(command: str, out: Path | str | None = None, root: Path | str = "results") -> Path:
    """Create and return a fresh run folder.

    Default: ``results/<command>/<YYYYmmdd-HHMMSS>-<6 hex>/``. With ``out``, that folder
    is used if it does not exist yet or is empty; a folder holding anything is refused,
    so an earlier run is never overwritten.
    """
    if out is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = Path(root) / command / f"{stamp}-{secrets.token_hex(3)}"
    else:
        path = Path(out)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise OutputError(f"{path} already exists and is not an empty folder; runs never overwrite")
    try:
        path.mkdir(parents=True, exist_ok=out is not None)
        probe = path / ".write-test"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise OutputError(f"cannot write to {path}: {exc.strerror or exc}") from exc
    return path


def git_commit() -> str | None:
    """The commit of the tinit source tree, when it is a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, str | int | float | bool) or obj is None:
        return obj
    return str(obj)


def write_config(run_dir: Path, command: str, meta: dict[str, Any], **extra: Any) -> Path:
    """config.json: every resolved option plus versions, device, git commit, status."""
    import torch

    from .. import __version__

    doc = {
        "command": command,
        "argv": sys.argv,
        "created": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "tinit_version": __version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "git_commit": git_commit(),
        "host": platform.node(),
        "pid": os.getpid(),
        **meta,
        **extra,
    }
    path = run_dir / "config.json"
    path.write_text(json.dumps(_jsonable(doc), indent=2) + "\n")
    return path


def write_csvs(run_dir: Path, frames: dict[str, pd.DataFrame]) -> list[Path]:
    """One CSV per frame, named after its key; floats at full precision."""
    paths = []
    for name, df in frames.items():
        path = run_dir / f"{name}.csv"
        df.to_csv(path, index=False, float_format="%.9g")
        paths.append(path)
    return paths
