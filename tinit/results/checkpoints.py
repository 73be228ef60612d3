"""Checkpoints of training runs on disk: safetensors files, written atomically.

The trainer never writes a file: it calls ``on_checkpoint(step, run_label, state_dict,
info)`` (:func:`tinit.experiments.training.trainer.train_run`), and a
:class:`CheckpointWriter` made by the CLI for the run folder is that callback. Each
checkpoint is two files in ``checkpoints/<run_label>/`` of the run folder:

- ``step-000100.safetensors``: the model's state dict (float32, on the CPU), with the
  JSON below also in the safetensors header's metadata (key ``tinit``), so the file
  alone says what it holds;
- ``step-000100.json``: the model config, the init scheme and seed, the step and the
  run's labels.

Each is written to a temporary name in the same folder (``.NAME.PID.tmp``), flushed
and fsynced, then renamed; the folder is fsynced after the rename. The JSON is written
after the safetensors file, so a checkpoint is complete exactly when its JSON exists:
a run stopped by a signal or a full disk leaves at most a temporary file (removed when
the failure is an exception) and never a file under a final name that is partial.
No pickle is involved anywhere: safetensors stores raw tensors and a JSON header.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from .rundir import OutputError, atomic_write

#: The folder of a run folder that holds the checkpoints.
CHECKPOINT_DIR = "checkpoints"
#: safetensors header metadata key holding the checkpoint's JSON.
META_KEY = "tinit"


def step_name(step: int) -> str:
    """``step-000100``: zero-padded so that the files sort by step."""
    return f"step-{step:06d}"


def safe_label(label: str) -> str:
    """A run label as a folder name: letters, digits, ``.``, ``_``, ``=``, ``-`` only."""
    out = re.sub(r"[^A-Za-z0-9._=-]+", "-", label).strip("-.")
    return out or "run"


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # (a platform without directory fds: the rename is still atomic)
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _synced(write):
    """``write(tmp)``, then the temporary file's bytes forced to disk before its rename."""

    def run(tmp: Path) -> None:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())

    return run


class CheckpointWriter:
    """The ``on_checkpoint`` callback of a training run, writing into ``folder``
    (``<run folder>/checkpoints``). Each call returns what config.json lists for the
    checkpoint: its run label, step, the two files (relative to the run folder) and the
    size in bytes; :attr:`written` keeps them in order."""

    def __init__(self, run_dir: Path | str):
        self.run_dir = Path(run_dir)
        self.folder = self.run_dir / CHECKPOINT_DIR
        self.written: list[dict[str, Any]] = []

    def __call__(self, step: int, run_label: str, state_dict: dict, info: dict[str, Any]) -> dict[str, Any]:
        from safetensors.torch import save_file

        folder = self.folder / safe_label(run_label)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create {folder}: {exc.strerror or exc}") from exc
        base = folder / step_name(step)
        weights, sidecar = base.with_suffix(".safetensors"), base.with_suffix(".json")
        if weights.exists() or sidecar.exists():  # runs never overwrite (two runs of one label)
            raise OutputError(f"{weights} exists already: a checkpoint is never overwritten")
        # float32 on the CPU, contiguous, no shared storage (safetensors refuses aliases)
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
        doc = {**info, "step": step, "run": run_label}
        text = json.dumps(doc, sort_keys=True, default=str)
        atomic_write(weights, _synced(lambda tmp: save_file(tensors, str(tmp), metadata={META_KEY: text})))
        atomic_write(sidecar, _synced(lambda tmp: tmp.write_text(json.dumps(doc, indent=2, default=str))))
        _fsync_dir(folder)
        entry = {
            "run": run_label,
            "step": step,
            "file": str(weights.relative_to(self.run_dir)),
            "json": str(sidecar.relative_to(self.run_dir)),
            "bytes": weights.stat().st_size,
        }
        self.written.append(entry)
        return entry

    def free_bytes(self) -> int | None:
        """Free space on the run folder's file system (None where it cannot be told)."""
        import shutil

        try:
            return shutil.disk_usage(self.run_dir).free
        except OSError:
            return None


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def checkpoint_lines(entries: list[dict[str, Any]]) -> list[str]:
    """The terminal summary's lines: how many checkpoints, of how many runs, their size."""
    if not entries:
        return []
    runs = len({e["run"] for e in entries})
    total = sum(e["bytes"] for e in entries)
    steps = sorted({e["step"] for e in entries})
    shown = ",".join(map(str, steps[:8])) + (",..." if len(steps) > 8 else "")
    return [f"Checkpoints: {len(entries)} ({runs} run{'s' * (runs > 1)} x steps {shown}), "
            f"{human_bytes(total)} in {CHECKPOINT_DIR}/"]  # fmt: skip
