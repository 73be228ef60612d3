"""The one writer of a run folder's files from a result: `tinit COMMAND` (after its
in-process run) and `tinit sweep COMMAND` (after gathering its points) both end here.

:func:`write_result` writes, in this order: config.json saying the files are being
written (``complete: false``), the CSVs, then the figures and the command's own files
(only when every frame has rows), and config.json last, with ``complete`` true only
when the run was complete, every step succeeded and every file it returned exists, and
the non-finite counts. A signal recorded in ``caught`` (the caller's handlers defer
signals while writing) stops it between two files. It never prints and never exits:
it returns a :class:`Written` the caller reports (docs/design.md §4)."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .rundir import CONFIG, OutputError, atomic_write_text, non_finite_counts, write_config, write_csvs


@dataclass
class Written:
    """What :func:`write_result` did: ``complete`` and ``error`` are config.json's;
    ``write_error``: a file that could not be written (or a plot that could not be drawn);
    ``stopped``: a signal stopped the writing; ``missing``: promised files not there."""

    complete: bool
    error: str | None
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    n_bad: int = 0
    write_error: str | None = None
    stopped: str | None = None
    missing: list[str] = field(default_factory=list)


def internal_error(exc: BaseException, run_dir: Path) -> str:
    """A one-line reason for an error that is tinit's own (a bug, not the input, the
    memory or a signal); its traceback goes to ``traceback.txt`` in the run folder, for
    a bug report, instead of the terminal."""
    why = " ".join(str(exc).split())[:200]
    where = ""
    try:
        atomic_write_text(run_dir / "traceback.txt", "".join(traceback.format_exception(exc)))
        where = f"; traceback in {run_dir / 'traceback.txt'}"
    except OutputError:
        pass
    return f"internal error: {type(exc).__name__}: {why}{where}"


def write_result(
    run_dir: Path,
    command: str,
    result: Any,
    figures: Callable[[Any], dict],
    files: Callable[[Any, Path], list[Path]],
    formats: Sequence[str],
    caught: list[str],
    failure: str | None = None,
    base: dict[str, Any] | None = None,
) -> Written:
    """Write ``result``'s files into ``run_dir`` (see the module's docstring).
    ``result``: an ExperimentResult (frames, meta, not_applicable, complete, error);
    ``figures(result)``: stem -> matplotlib Figure; ``files(result, run_dir)``: the
    command's other files; ``formats``: the figures' formats; ``caught``: the signals
    received so far (a non-empty list stops the writing); ``failure``: why the run
    stopped before the writing, if it did; ``base``: config.json keys under the meta."""
    run_dir = Path(run_dir)
    meta = {**(base or {}), **result.meta}
    counts = non_finite_counts(result.frames, result.not_applicable)
    n_bad = sum(sum(c.values()) for c in counts.values())
    extra = {"non_finite": counts, "non_finite_total": n_bad}
    expected = [run_dir / CONFIG]
    write_error = None

    def steps() -> Iterator[Callable[[], list[Path]]]:
        yield lambda: write_csvs(run_dir, result.frames, result.not_applicable)
        if result.frames and all(len(df) for df in result.frames.values()):
            from .plots import save_figure  # (matplotlib: only when there is something to draw)

            for stem, fig in figures(result).items():
                yield lambda stem=stem, fig=fig: save_figure(fig, run_dir, stem, formats)
            yield lambda: files(result, run_dir)

    try:
        under_way = "writing the files" + (f"; {failure or result.error}" if failure or result.error else "")
        write_config(run_dir, command, meta, complete=False, error=under_way, **extra)
        for step in steps():
            if caught:
                break
            expected += step() or []
    except OutputError as exc:
        write_error = str(exc)
    except Exception as exc:  # a plot that cannot be drawn (no memory left, a bug): the CSVs are saved
        write_error = "cannot draw the plots: " + internal_error(exc, run_dir)
    stopped = f"stopped by {caught[0]} while writing" if caught and failure is None else None
    missing = [p.name for p in expected if p.name != CONFIG and not p.exists()]
    complete = bool(result.complete and failure is None and stopped is None and write_error is None
                    and not missing)  # fmt: skip
    reasons = [failure or stopped, write_error, f"missing {', '.join(missing)}" if missing else None]
    if result.error and not result.complete and not any(result.error in r for r in reasons if r):
        reasons.append(result.error)  # (a sweep's failed points; not the failure's reason again)
    error = "; ".join(r for r in reasons if r) or result.error
    try:
        write_config(run_dir, command, meta, complete=complete, error=error, **extra)
    except OutputError as exc:
        write_error = write_error or str(exc)
        complete = False
    return Written(complete, error, counts, n_bad, write_error, stopped, missing)
