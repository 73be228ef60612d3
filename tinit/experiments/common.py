"""What every experiment shares: device and dtype resolution, the seeded tokens,
the streaming decision, the configuration grid, and the incomplete-run error."""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from ..model.catalogue import placements_for
from ..model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from ..model.init import generator
from ..model.placements import PLACEMENTS
from ..model.transformer import Block
from .memory import peak_rss_own_mib, return_freed_memory, rss_mib

#: Callback for progress: (steps done so far, total steps). Experiments never print.
Progress = Callable[[int, int], None]

#: Callback with the result so far (``complete=False``) after each finished
#: configuration, so a caller can save rows as they are measured.
Partial = Callable[["ExperimentResult"], None]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


class ProgressCounter:
    """Counts finished steps and reports (done, total) to an optional callback."""

    def __init__(self, progress: Progress | None, total: int):
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self, n: int = 1) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.total)


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


#: What ends a run part-way and is turned into an IncompleteRun holding what was
#: measured. RuntimeError is here for the CPU allocator's failures: catch these, then
#: call :func:`failure_reason`, which raises any other RuntimeError again.
RUN_FAILURES = (torch.OutOfMemoryError, MemoryError, KeyboardInterrupt, RuntimeError)


def is_run_failure(exc: BaseException) -> bool:
    """Whether ``exc`` stops a run part-way (keeping what was measured) rather than
    being a bug: out of memory, Ctrl-C, or a stopping signal."""
    return isinstance(exc, KeyboardInterrupt) or is_out_of_memory(exc)


def failure_reason(exc: BaseException) -> str:
    """A short reason for a run that stopped part-way. Raises ``exc`` itself when it
    is no run failure (a RuntimeError that is not an allocator failure is a bug)."""
    if isinstance(exc, Stopped):
        return f"stopped by {exc.signal_name}"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if is_out_of_memory(exc):
        return "out of memory"
    raise exc


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


class DeviceError(ConfigError):
    """The requested device cannot be used here (for example cuda without CUDA)."""


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


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError("device", f"{name} requested but no CUDA device is available (use cpu or auto)")
    return torch.device(name)


@contextmanager
def matmul_precision(run: RunConfig):
    """Allow TF32 matmuls for the duration of a run when ``run.tf32`` (CUDA float32
    only); the global setting is restored afterwards."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = run.tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def resolve_dtype(name: str) -> torch.dtype:
    return DTYPES[name]


def stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """Statistics accumulate in float32, or float64 when the run is float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def make_tokens(cfg: ModelConfig, run: RunConfig, seed: int, device: torch.device) -> torch.Tensor:
    """Uniform random token ids (batch, seq_len), determined by the seed alone, so
    every configuration of a run sees the same tokens."""
    gen = generator(seed, -2, "tokens", device)
    return torch.randint(cfg.vocab_size, (run.batch, run.seq_len), generator=gen, device=device)


def block_param_count(cfg: ModelConfig) -> int:
    """Exact parameters in one block (built on the meta device: no memory)."""
    with torch.device("meta"):
        return sum(p.numel() for p in Block(cfg, 0).parameters())


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (no limit) and junk: None


#: Where the process's cgroups are listed and where the cgroup file systems are mounted.
PROC_CGROUP, CGROUP_MOUNT = "/proc/self/cgroup", "/sys/fs/cgroup"


def _cgroup_headroom() -> int | None:
    """Bytes this process's memory cgroup may still grow (limit - usage), or None
    when no limit applies. cgroup v2 (memory.max) and v1 (memory.limit_in_bytes); the
    process's own cgroup folder first, then the mount's root (what a container sees)."""
    try:
        with open(PROC_CGROUP) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":
            mount, limit_file, usage_file = CGROUP_MOUNT, "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            mount = f"{CGROUP_MOUNT}/memory"
            limit_file, usage_file = "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        for base in (mount + rel.rstrip("/"), mount):
            limit = _read_int(f"{base}/{limit_file}")
            if limit is not None and limit < 2**60:  # v1 says "no limit" with a huge number
                return max(limit - (_read_int(f"{base}/{usage_file}") or 0), 0)
    return None


def _address_space_headroom() -> int | None:
    """Bytes of address space left under RLIMIT_AS (``ulimit -v``), or None."""
    try:
        import resource
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    used = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    used = int(line.split()[1]) * 1024
    except OSError:
        pass
    return max(soft - used, 0)


def host_memory() -> int:
    """Available host memory (MemAvailable), at most what this process's cgroup
    memory limit and its address-space limit (RLIMIT_AS) still allow."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    if avail is None:
        avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    limits = [x for x in (_cgroup_headroom(), _address_space_headroom()) if x is not None]
    return min([avail, *limits])


def available_memory(device: torch.device) -> int:
    """Free bytes on the device (CUDA) or available host memory (CPU; see
    :func:`host_memory`)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return host_memory()


def should_stream(
    cfg: ModelConfig, dtype: torch.dtype, device: torch.device, requested: bool | None,
    need: int | None = None,
) -> bool:  # fmt: skip
    """Stream when asked to, or when what the fully built pass holds would take more
    than half the free memory: ``need`` bytes, by default the blocks' weights (all a
    forward without gradients holds; a backward holds far more, see
    :func:`tinit.experiments.memory.gradient_pass_bytes`).

    A forward without gradients (``need`` None) off CUDA always streams: each block is
    built once either way, so streaming costs nothing there (it was 15% faster at L = 40,
    reusing one block's memory) and the memory stays flat in depth. On CUDA the built
    model saves the side stream's synchronisation."""
    if requested is not None:
        return requested
    if need is None and device.type != "cuda":
        return True
    if need is None:
        need = cfg.n_layers * block_param_count(cfg) * torch.empty((), dtype=dtype).element_size()
    return need > 0.5 * available_memory(device)


#: Placements a run uses when neither the user nor the scheme chose one.
DEFAULT_PLACEMENTS = ("pre", "post")


def grid(
    inits: Iterable[str], norm_positions: Iterable[str] | None, custom: Iterable = ()
) -> Iterator[tuple[str, str]]:
    """The (init scheme, norm position) configurations of a run, in a fixed order
    (placement, then scheme). ``norm_positions`` None: each scheme in the placement
    it presumes (olmo2 reordered, deepnet post, ...), the others in pre and post.
    ``custom``: the user's schemes the run's InitConfig carries."""
    inits, custom = list(inits), tuple(custom)
    if norm_positions is None:
        wanted = {recipe: placements_for(recipe, DEFAULT_PLACEMENTS, custom) for recipe in inits}
        norm_positions = [p for p in PLACEMENTS if any(p in w for w in wanted.values())]
    else:
        wanted = {recipe: tuple(norm_positions) for recipe in inits}
    for norm_position in norm_positions:
        for recipe in inits:
            if norm_position in wanted[recipe]:
                yield recipe, norm_position


def configure(
    model: ModelConfig, init: InitConfig, run: RunConfig, recipe: str, norm_position: str
) -> tuple[ModelConfig, InitConfig]:
    """The model and init of one configuration; the model's sequence cache fits the run.
    (QK-norm left unset in ``model`` is decided by the scheme when the blocks are built.)"""
    cfg = dataclasses.replace(
        model, norm_position=norm_position, max_seq_len=max(model.max_seq_len, run.seq_len)
    )
    return cfg, dataclasses.replace(init, recipe=recipe)


def check_configs(
    model: ModelConfig, init: InitConfig, run: RunConfig, configs: Iterable[tuple[str, str]],
    depths: Iterable[int] | None = None,
) -> None:  # fmt: skip
    """Before anything runs: every (recipe, norm position) of ``configs`` at every depth
    (default ``model.n_layers``) has rules and multipliers defined at every layer
    (:func:`tinit.model.rulecheck.check_scheme`). A ConfigError naming ``--init-file``
    (a user's scheme) or ``--init`` otherwise, so a bad formula never stops a run
    part-way."""
    from ..model.catalogue import CATALOGUE
    from ..model.formula import FormulaError
    from ..model.rulecheck import check_scheme

    configs = list(configs)
    for L in depths if depths is not None else [model.n_layers]:
        for recipe, norm_position in configs:
            cfg, ini = configure(dataclasses.replace(model, n_layers=L), init, run, recipe, norm_position)
            try:
                check_scheme(cfg, ini)
            except FormulaError as exc:
                if ini.scheme.name in CATALOGUE:
                    raise ConfigError("recipe", str(exc)) from None
                raise ConfigError("init_file", f"{ini.scheme.sources[0]}: {exc}") from None


def _tinit_version() -> str:
    from .. import __version__

    return __version__


def run_meta(
    model: ModelConfig, init: InitConfig, run: RunConfig, device: torch.device, **extra
) -> dict[str, Any]:
    """The resolved settings of a run, for config.json, with the versions that produced
    it. With ``configurations`` (the (recipe, norm position) grid that ran), the model's
    ``norm_position`` and the init's ``recipe`` name what ran (a list when more than one
    value ran), not the single value of the base configs."""
    model_d, init_d = model.to_dict(), init.to_dict()
    if extra.get("configurations"):
        for d, key, i in ((init_d, "recipe", 0), (model_d, "norm_position", 1)):
            ran = list(dict.fromkeys(c[i] for c in extra["configurations"]))
            d[key] = ran[0] if len(ran) == 1 else ran
    return {
        "tinit_version": _tinit_version(),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "model": model_d,
        "init": init_d,
        "sigma_resolved": init.resolved_sigma(model.d_model),
        "embed_std_resolved": init.resolved_embed_std(model.d_model),
        "run": run.to_dict(),
        "device": str(device),
        "device_name": device_name(device),
        "torch_threads": torch.get_num_threads(),
        "tf32_matmul": bool(run.tf32 and device.type == "cuda" and run.dtype == "float32"),
        **extra,
    }
