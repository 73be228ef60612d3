"""The run driver: the loop every experiment runs under.

An experiment is its units of work (configurations, (input, head size) pairs, depth
and seed points, training runs...), a function that measures one unit, and a function
that assembles the frames of what was measured so far. :class:`Run` does the rest,
alike for every experiment: it times each unit (:class:`Meter`: wall time, peak
memory, resident memory after it, into config.json), turns a run failure (out of
memory, Ctrl-C, a stopping signal) into an :class:`IncompleteRun` holding the frames
measured before it and naming the unit, hands ``on_partial`` a function that builds
the result so far after each unit, counts progress, and attaches the cells that are
empty by design (``not_applicable``) to every result. Nothing is assembled for
``on_partial`` unless it calls that function: the CLI's writer
(:class:`tinit.cli.runner.RunWriter`) does after the first unit, then once ten times
the last write's cost has passed, so a hard kill (SIGKILL, power) loses the unit in
progress and those finished since the last completed write (within ten times its
duration after it); every other stop writes every finished unit.

A new measuring experiment (``measure/attention_scale.py`` is a short real one)::

    def run_thing(model=None, init=None, run=None, sizes=(8, 16), progress=None, on_partial=None):
        model, init, run = model or ModelConfig(), init or InitConfig(), run or RunConfig()
        device = resolve_device(run.device)  # bad input: raise ConfigError before the driver
        rows: list[dict] = []
        meta = run_meta(model, init, run, device, sizes=list(sizes))  # config.json
        driver = Run(meta, lambda: {"thing": pd.DataFrame(rows, columns=COLUMNS)}, NOT_APPLICABLE,
                     meter=Meter(device), on_partial=on_partial, progress=progress, total=len(sizes))

        def measure(size: int) -> dict:  # may raise out of memory / be interrupted
            return {"size": size, "value": ...}

        def collect(size: int, row: dict) -> None:  # keep what was measured, advance the bar
            rows.append(row)
            driver.tick()

        driver.each(sizes, measure, collect, label=lambda s: f"size {s}", span=lambda s: f"size={s}")
        return driver.result()

``label`` names the unit in the error (``IncompleteRun("size 16: out of memory")``,
holding the rows of the units before it); ``span`` names it in config.json's
``seconds``. Units that run a whole experiment inside (depth-sweep's points, check's
gradient run) give ``inner`` (the metas inside, for the memory peak) and, where the
inner IncompleteRun's message is not the reason to report, ``nested``. Frames derived
from the whole run (lr-sweep's optima, claims' verdicts) wrap it in :func:`extended`.
Measurements outside one loop (check's items) use :meth:`Run.step` or
:meth:`Run.guard` and call :meth:`Run.partial` themselves.

A sweepable experiment's grid is a :class:`~tinit.experiments.points.Plan` of
independent points; :func:`run_plan` runs it here, point after point, under :class:`Run`
(``tinit sweep`` runs the same plan on workers or SLURM and gathers the same way).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

import pandas as pd
import torch

from ..process import return_freed_memory
from .memory import peak_rss_own_mib, rss_mib
from .points import Frames, Plan, Point, run_point
from .result import RUN_FAILURES, ExperimentResult, IncompleteRun, Partial, Progress, failure_reason

U = TypeVar("U")
V = TypeVar("V")


class ProgressCounter:
    """Counts finished steps and reports (done, total) to an optional callback."""

    def __init__(self, progress: Progress | None, total: int):
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self, n: int = 1) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.total)


def peak_rss_mib() -> float | None:
    """This process's peak resident set size so far, in MiB (it never goes down);
    None where the platform does not say (Windows has no ``resource`` module).

    Linux: ``VmHWM`` of /proc/self/status, the peak of this process's own memory.
    ``getrusage``'s ``ru_maxrss`` is kept across ``execve``, so a process started by
    a large one (a sweep worker, a test's subprocess) would report its parent's size."""
    hwm = peak_rss_own_mib()
    if hwm is not None:
        return hwm
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


class Meter:
    """Wall time and peak memory per configuration, for config.json and the summary,
    and the process's resident memory after each configuration (``rss_mib``: flat
    when nothing of a configuration outlives it).

    On CUDA the clock is read after a synchronize (queued kernels are counted) and
    the peak is the allocator's ``max_memory_allocated`` since the configuration
    began; on the CPU only the process's peak RSS is known, recorded at the end.
    Call :meth:`start`, then :meth:`stop` once the configuration has succeeded.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.seconds: dict[str, float] = {}
        self.peak_gib: dict[str, float] = {}
        self.rss: dict[str, float | None] = {}  # host resident memory after each span

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self._t0 = time.perf_counter()

    def stop(self, name: str, inner: Iterable[dict[str, Any]] = ()) -> None:
        """Record ``name``'s time (and, on CUDA, peak memory) since :meth:`start`.

        ``inner``: the metas of experiments run inside this span. They reset the
        allocator's peak per configuration themselves, so the span's peak is the
        largest of theirs and of the allocator's peak since their last reset."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            peaks = [torch.cuda.max_memory_allocated(self.device) / 2**30]
            peaks += [p for meta in inner for p in meta.get("peak_gpu_memory_gib", {}).values()]
            self.peak_gib[name] = max(peaks)
        self.seconds[name] = time.perf_counter() - self._t0
        return_freed_memory()  # so that the figure is what the process holds, not what the heap kept
        self.rss[name] = rss_mib()

    def record(self, meta: dict[str, Any]) -> None:
        """Put the timings and memory peaks into ``meta`` (config.json)."""
        meta["seconds"] = dict(self.seconds)
        if self.cuda:
            meta["peak_gpu_memory_gib"] = dict(self.peak_gib)
        meta["peak_rss_mib"] = peak_rss_mib()
        meta["rss_mib"] = dict(self.rss)


#: The cells empty by design: fixed rules per frame stem, or a function of the frames
#: (where the rules depend on what was measured).
NotApplicable = dict[str, dict[str, Any]] | Callable[[dict[str, pd.DataFrame]], dict[str, dict[str, Any]]]


class Run:
    """One run of an experiment, measured unit by unit.

    ``meta``: config.json's settings (the meter adds each unit's time and memory);
    ``assemble()``: the frames of what was measured so far, for every result, partial
    or final (it may add to ``meta`` what only the end of the run knows);
    ``not_applicable``: the cells empty by design; ``meter``: times each unit with a
    ``span`` (None: nothing is timed); ``on_partial``: gets a function building the
    result so far after each unit (nothing is assembled unless it is called);
    ``progress`` and ``total``: the steps of :attr:`tick`, which the units advance;
    ``nested(exc)``: the reason a unit that runs a whole experiment inside
    (depth-sweep's points, check's gradient run) gives for that experiment's own
    :class:`IncompleteRun` (default: its message)."""

    def __init__(
        self,
        meta: dict[str, Any],
        assemble: Callable[[], dict[str, pd.DataFrame]],
        not_applicable: NotApplicable | None = None,
        *,
        meter: Meter | None = None,
        on_partial: Partial | None = None,
        progress: Progress | None = None,
        total: int = 1,
        nested: Callable[[IncompleteRun], str] = str,
    ):
        self.meta, self.assemble, self.not_applicable = meta, assemble, not_applicable
        self.meter, self.on_partial, self.nested = meter, on_partial, nested
        self.tick = ProgressCounter(progress, total)

    def result(self, complete: bool = True, error: str | None = None) -> ExperimentResult:
        """What was measured so far, as the experiment's result."""
        if self.meter is not None:
            self.meter.record(self.meta)
        frames = self.assemble()
        na = self.not_applicable
        na = na(frames) if callable(na) else ({} if na is None else na)
        return ExperimentResult(frames, self.meta, complete, error, na)

    def partial(self) -> None:
        """Hand ``on_partial`` the function that builds the result so far
        (``complete=False``); the frames are assembled only if it is called."""
        if self.on_partial is not None:
            self.on_partial(partial(self.result, False))

    @contextmanager
    def guard(self, label: str) -> Iterator[None]:
        """A run failure inside becomes ``IncompleteRun("<label>: <reason>")`` holding
        the result so far; any other error (a bug) passes through unchanged."""
        try:
            yield
        except RUN_FAILURES as exc:
            why = self.nested(exc) if isinstance(exc, IncompleteRun) else failure_reason(exc)
            raise IncompleteRun(f"{label}: {why}", self.result(False, why)) from exc

    def step(
        self, label: str, measure: Callable[[], V], span: str | None = None,
        inner: Callable[[V], Iterable[dict[str, Any]]] | None = None,
    ) -> V:  # fmt: skip
        """``measure()`` under :meth:`guard`, timed as ``span`` when given (``inner``: the
        metas of experiments run inside it, from its value; see :meth:`Meter.stop`)."""
        if span is not None:
            self.meter.start()
        with self.guard(label):
            value = measure()
        if span is not None:
            self.meter.stop(span, inner(value) if inner is not None else ())
        return value

    def each(
        self,
        units: Iterable[U],
        measure: Callable[[U], V],
        collect: Callable[[U, V], None] | None = None,
        *,
        label: Callable[[U], str],
        span: Callable[[U], str] | None = None,
        inner: Callable[[V], Iterable[dict[str, Any]]] | None = None,
        last_partial: bool = True,
    ) -> None:
        """Measure every unit in order: :meth:`step` (``label(unit)`` names it in a
        failure, ``span(unit)`` in the timings), then ``collect(unit, value)`` (outside
        the timed span), then :meth:`partial` (after the last unit too unless
        ``last_partial`` is False: the caller's result follows at once)."""
        units = list(units)
        for i, unit in enumerate(units):
            value = self.step(label(unit), partial(measure, unit), span(unit) if span else None, inner)
            if collect is not None:
                collect(unit, value)
            if last_partial or i + 1 < len(units):
                self.partial()


def extended(
    experiment: Callable[[Partial | None], ExperimentResult],
    add: Callable[[ExperimentResult], ExperimentResult],
    on_partial: Partial | None = None,
) -> ExperimentResult:
    """Run ``experiment(on_partial)`` and ``add`` to every result it gives (each partial
    one, when it is built; the one an IncompleteRun holds; the final one) what is derived
    from its frames: lr-sweep's optima over the training runs, claims' verdicts."""
    wrapped = None if on_partial is None else (lambda so_far: on_partial(lambda: add(so_far())))
    try:
        result = experiment(wrapped)
    except IncompleteRun as exc:  # what finished gets its derived frames too
        raise IncompleteRun(str(exc), add(exc.result)) from exc
    return add(result)


def sub_progress(progress: Progress | None, start: int, width: int, total: int) -> Progress | None:
    """A sub-run's progress (done, its total) mapped onto [start, start + width] of ours."""
    if progress is None:
        return None

    def update(done: int, sub_total: int) -> None:
        progress(start + (done * width) // max(sub_total, 1), total)

    return update


def run_plan(
    plan: Plan,
    meta: dict[str, Any],
    *,
    meter: Meter | None = None,
    progress: Progress | None = None,
    on_partial: Partial | None = None,
    weight: Callable[[Point], int] = lambda p: 1,
    label: Callable[[Point], str] = lambda p: p.name,
    on_point: Callable[[Point, ExperimentResult], None] | None = None,
    last_partial: bool = True,
) -> ExperimentResult:
    """Run ``plan``'s points in this process, in order, under :class:`Run`: each point is
    :func:`run_point` (timed as its name), its frames kept, and the result so far is
    ``plan.gather`` of the points done (exactly what ``tinit sweep`` gathers from the
    points' folders) with ``plan.not_applicable``. ``meta``: config.json's settings
    (:func:`run_meta`, with the device); ``weight(point)``: its steps of the progress;
    ``on_point(point, result)``: sees each point's own result (its meta) once measured."""
    done: dict[str, Frames] = {}
    driver = Run(meta, lambda: plan.gather(done), plan.not_applicable, meter=meter, on_partial=on_partial,
                 progress=progress, total=sum(weight(p) for p in plan.points))  # fmt: skip

    def measure(point: Point) -> ExperimentResult:
        return run_point(point, sub_progress(progress, driver.tick.done, weight(point), driver.tick.total))

    def collect(point: Point, result: ExperimentResult) -> None:
        done[point.name] = result.frames
        if on_point is not None:
            on_point(point, result)
        driver.tick(weight(point))

    driver.each(plan.points, measure, collect, label=label, span=lambda p: p.name if meter else None,
                inner=lambda r: [r.meta], last_partial=last_partial)  # fmt: skip
    return driver.result()
