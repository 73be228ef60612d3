"""Run folders and what goes in them: config.json and tidy CSVs. Never overwrites.

A run folder is *claimed* before anything is measured: the folder is created with
an exclusive ``mkdir`` (or, for an existing empty ``--out``, ``config.json`` is
created with ``O_EXCL``), so of two runs aimed at one folder exactly one wins.
config.json says ``"complete": false`` from that moment; every file is written to a
temporary name in the folder and renamed into place (a reader sees the old file or
the new one, never half of one), and ``"complete": true`` is written last.

In the CSVs an empty cell is *not applicable* (documented per column); a number that
was measured but is not finite is written ``nan``, ``inf`` or ``-inf``.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import math
import os
import platform
import secrets
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

CONFIG = "config.json"

#: frame stem -> {column: where that column is not applicable}: ``True`` (every row),
#: or a function of the frame giving a boolean row mask. An empty cell in the CSV is a
#: NaN where its column is not applicable; every other NaN is written ``nan``.
NotApplicable = Mapping[str, Mapping[str, "bool | Callable[[pd.DataFrame], Any]"]]


class OutputError(OSError):
    """The run folder cannot be created or written (names the path)."""


class FolderTaken(OutputError):
    """The run folder exists and is not empty, or another run claimed it first."""


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def atomic_write(path: Path | str, write: Callable[[Path], Any]) -> Path:
    """Call ``write(tmp)`` on a temporary name beside ``path``, then rename it to
    ``path`` (atomic on POSIX). The temporary file is removed on any failure; an
    OSError becomes an :class:`OutputError` naming ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, OutputError):
            raise OutputError(f"cannot write {path}: {_why(exc)}") from exc
        raise
    return path


def atomic_write_text(path: Path | str, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


class RunFolder:
    """A claimed run folder: ``path``, and the folders the claim created (removed
    again by :meth:`abandon` when the run turns out to be bad input)."""

    def __init__(self, path: Path, created: list[Path], preexisting: bool):
        self.path, self.created, self.preexisting = path, created, preexisting

    def abandon(self) -> None:
        """Undo the claim of a run that measured nothing: remove config.json and the
        folders the claim created, where they hold nothing else."""
        try:
            (self.path / CONFIG).unlink(missing_ok=True)
            for folder in reversed(self.created):
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
        except OSError:
            pass


def _mkdirs(path: Path) -> list[Path]:
    """Create ``path``'s missing parents (not ``path``); return those created."""
    missing = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        if parent.parent == parent:
            break
        parent = parent.parent
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            missing.remove(folder)  # another run made it meanwhile: not ours to remove
    return list(reversed(missing))  # outermost first


def claim_run_dir(
    command: str,
    out: Path | str | None = None,
    root: Path | str = "results",
    config: Mapping[str, Any] | None = None,
) -> RunFolder:
    """Claim a fresh run folder and write its first config.json (``complete: false``).

    Default: ``results/<command>/<YYYYmmdd-HHMMSS>-<6 hex>/``. With ``out``, that
    folder is created, or used if it exists and is empty. Raises :class:`FolderTaken`
    when it holds anything or another run claims it first (the claim is an exclusive
    create, so two runs never share a folder), :class:`OutputError` when it cannot be
    created or written.
    """
    if out is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = Path(root) / command / f"{stamp}-{secrets.token_hex(3)}"
    else:
        path = Path(out)
    try:
        created = _mkdirs(path)
        try:
            path.mkdir()
            created.append(path)
            preexisting = False
        except FileExistsError:
            if out is None or not path.is_dir() or any(path.iterdir()):
                raise FolderTaken(
                    f"{path} already exists and is not an empty folder; runs never overwrite"
                ) from None
            preexisting = True
        doc = {**(config or {}), "complete": False}
        try:
            fd = os.open(path / CONFIG, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise FolderTaken(f"{path} was claimed by another run; runs never share a folder") from None
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(_jsonable(doc), indent=2) + "\n")
    except OutputError:
        raise
    except OSError as exc:
        raise OutputError(f"cannot write to {path}: {_why(exc)}") from exc
    return RunFolder(path, created, preexisting)


def new_run_dir(command: str, out: Path | str | None = None, root: Path | str = "results") -> Path:
    """Claim a fresh run folder (see :func:`claim_run_dir`) and return its path."""
    return claim_run_dir(command, out, root).path


@functools.cache
def git_commit() -> str | None:
    """The commit of the tinit source tree, when it is a git checkout (asked once per
    process: config.json is rewritten after every configuration)."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _jsonable(obj: Any) -> Any:
    """JSON-safe: non-finite floats become the strings "nan", "inf", "-inf" (JSON has
    no such numbers, and null would hide them)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float | np.floating) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    if isinstance(obj, str | int | float | bool) or obj is None:
        return obj
    return str(obj)


def environment() -> dict[str, Any]:
    """Versions, host and process of this run, for config.json."""
    import torch

    from .. import __version__

    return {
        "argv": sys.argv,
        "created": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "tinit_version": __version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "git_commit": git_commit(),
        "host": platform.node(),
        "pid": os.getpid(),
    }


def write_config(run_dir: Path, command: str, meta: dict[str, Any], **extra: Any) -> Path:
    """config.json: every resolved option plus versions, device, git commit, status
    (written to a temporary name and renamed)."""
    doc = {"command": command, **environment(), **meta, **extra}
    return atomic_write_text(Path(run_dir) / CONFIG, json.dumps(_jsonable(doc), indent=2) + "\n")


def _rows(df: pd.DataFrame, rule: Any) -> np.ndarray:
    if rule is True:
        return np.ones(len(df), dtype=bool)
    if not rule:
        return np.zeros(len(df), dtype=bool)
    return np.asarray(rule(df), dtype=bool)


def _not_applicable(df: pd.DataFrame, rules: Mapping[str, Any] | None) -> np.ndarray:
    """:func:`not_applicable_mask` as a (rows, columns) boolean array. Built in numpy, not
    by assigning the frame's columns one by one (pandas' per-column assignment was most
    of the ~50 ms a run's CSVs and config.json took to write); a rule that several columns
    share is evaluated once."""
    mask = np.zeros(df.shape, dtype=bool)
    if not rules or not len(df):
        return mask
    rows: dict[int, np.ndarray] = {}
    for col, rule in rules.items():
        if col in df.columns:
            if id(rule) not in rows:
                rows[id(rule)] = _rows(df, rule)
            mask[:, df.columns.get_loc(col)] = rows[id(rule)] & df[col].isna().to_numpy()
    return mask


def not_applicable_mask(df: pd.DataFrame, rules: Mapping[str, Any] | None) -> pd.DataFrame:
    """Boolean frame: True where a cell is not applicable (by ``rules``) and NaN."""
    return pd.DataFrame(_not_applicable(df, rules), index=df.index, columns=df.columns)


def _float_columns(df: pd.DataFrame) -> list[str]:
    return [c for c, dtype in df.dtypes.items() if pd.api.types.is_float_dtype(dtype)]


def non_finite_cells(df: pd.DataFrame, rules: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Boolean frame: True at every measured number that is NaN or infinite (a NaN
    where its column is not applicable does not count)."""
    bad = np.zeros(df.shape, dtype=bool)
    cols = _float_columns(df)
    if cols and len(df):
        at = [df.columns.get_loc(c) for c in cols]
        bad[:, at] = ~np.isfinite(df[cols].to_numpy(dtype=np.float64))
        bad &= ~_not_applicable(df, rules)
    return pd.DataFrame(bad, index=df.index, columns=df.columns)


#: The columns that name a configuration, in the order they are joined ("naive/pre").
CONFIG_KEYS = ("init", "norm_position")


def non_finite_counts(
    frames: Mapping[str, pd.DataFrame], not_applicable: NotApplicable | None = None
) -> dict[str, dict[str, int]]:
    """Per CSV (stem) and configuration (``init/norm_position`` where the frame has
    those columns, else ``all``): how many measured numbers are NaN or infinite.
    Only CSVs and configurations with at least one are listed."""
    out: dict[str, dict[str, int]] = {}
    for stem, df in frames.items():
        bad = non_finite_cells(df, (not_applicable or {}).get(stem)).sum(axis=1)
        if not bad.any():
            continue
        keys = [k for k in CONFIG_KEYS if k in df.columns]
        if keys:
            labels = df[keys].astype(str).agg("/".join, axis=1)
            counts = bad.groupby(labels, sort=False).sum()
        else:
            counts = pd.Series({"all": bad.sum()})
        out[stem] = {str(k): int(v) for k, v in counts.items() if v}
    return out


def format_frame(df: pd.DataFrame, rules: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The frame as it goes into a CSV: floats at full precision (``%.9g``); a NaN
    where its column is not applicable stays empty; every other NaN is ``nan`` and
    an infinity ``inf`` / ``-inf``."""
    na = _not_applicable(df, rules)
    floats = set(_float_columns(df))
    columns: dict[Any, Any] = {}
    for i, col in enumerate(df.columns):
        if col in floats:
            values = df[col].to_numpy(dtype=np.float64)
            columns[col] = ["" if b else f"{v:.9g}" for v, b in zip(values, na[:, i], strict=True)]
        else:
            columns[col] = df[col]
    # (one frame made from its columns: assigning each formatted column to a copy cost
    # pandas a block split per column)
    return pd.DataFrame(columns, index=df.index, columns=df.columns)


def write_csvs(
    run_dir: Path, frames: Mapping[str, pd.DataFrame], not_applicable: NotApplicable | None = None
) -> list[Path]:
    """One CSV per frame, named after its key (see :func:`format_frame`), each
    written to a temporary name and renamed."""
    paths = []
    for name, df in frames.items():
        text = format_frame(df, (not_applicable or {}).get(name)).to_csv(index=False)
        paths.append(atomic_write_text(Path(run_dir) / f"{name}.csv", text))
    return paths
