"""What an experiment returns and how a run that stops part-way says so: the result
(tidy frames, config.json's metadata, the cells empty by design), the incomplete-run
error holding what was measured, and which exceptions stop a run rather than being
bugs (out of memory, Ctrl-C, a stopping signal)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

#: Callback for progress: (steps done so far, total steps). Experiments never print.
Progress = Callable[[int, int], None]

#: Callback after each finished unit (configuration, point, item), so a caller can save
#: rows as they are measured. It gets a function that builds the result so far
#: (``complete=False``): the frames (fits, summaries) cost more as the units grow, so a
#: caller builds them only when it uses them (the CLI's writer: when a write is due).
#: Built later, it holds what had been collected by then.
Partial = Callable[[Callable[[], "ExperimentResult"]], None]


@dataclass
class ExperimentResult:
    """Tidy DataFrames keyed by file stem, plus metadata for config.json."""

    frames: dict[str, pd.DataFrame]
    meta: dict[str, Any] = field(default_factory=dict)
    complete: bool = True
    error: str | None = None
    #: frame stem -> {column: True, or a function of the frame giving the rows where
    #: that column is not applicable}; such NaNs are written as empty cells, every
    #: other NaN as ``nan`` (see tinit.results.rundir.format_frame).
    not_applicable: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.frames[name]


class IncompleteRun(RuntimeError):
    """A run failed part-way (out of memory, interrupted). ``result`` holds what
    was measured before the failure, with ``complete=False``."""

    def __init__(self, message: str, result: ExperimentResult):
        super().__init__(message)
        self.result = result


class Stopped(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT, SIGTERM, SIGHUP): raised in the main
    thread by the CLI's handlers, and handled like Ctrl-C."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


#: Messages of CPU allocator failures, which torch raises as a plain RuntimeError.
CPU_OOM_MESSAGES = ("DefaultCPUAllocator", "not enough memory", "Cannot allocate memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, Python's MemoryError, or a CPU allocator failure."""
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return type(exc) is RuntimeError and any(m in str(exc) for m in CPU_OOM_MESSAGES)


class InputChanged(RuntimeError):
    """An input file changed under the run (rewritten, truncated: a download or a save
    still in progress) while it was being read: the run stops there, keeping what was
    measured from the file as it was, and says which file."""


#: What ends a run part-way and is turned into an IncompleteRun holding what was
#: measured. RuntimeError is here for the CPU allocator's failures: catch these, then
#: call :func:`failure_reason`, which raises any other RuntimeError again.
RUN_FAILURES = (torch.OutOfMemoryError, MemoryError, KeyboardInterrupt, RuntimeError)


def is_run_failure(exc: BaseException) -> bool:
    """Whether ``exc`` stops a run part-way (keeping what was measured) rather than
    being a bug: out of memory, Ctrl-C, a stopping signal, or an input file that changed
    while it was read."""
    return isinstance(exc, KeyboardInterrupt | InputChanged) or is_out_of_memory(exc)


def failure_reason(exc: BaseException) -> str:
    """A short reason for a run that stopped part-way. Raises ``exc`` itself when it
    is no run failure (a RuntimeError that is not an allocator failure is a bug)."""
    if isinstance(exc, Stopped):
        return f"stopped by {exc.signal_name}"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if is_out_of_memory(exc):
        return "out of memory"
    if isinstance(exc, InputChanged):
        return str(exc)
    raise exc
