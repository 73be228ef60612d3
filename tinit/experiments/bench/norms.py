"""RMSNorm (Zhang & Sennrich 2019) vs LayerNorm (Ba et al. 2016): behaviour and cost.

RMSNorm ``y = x / sqrt(mean(x^2) + eps) * g`` drops LayerNorm's centring and bias,
``y = (x - mean(x)) / sqrt(var(x) + eps) * g + b``. Consequences checked here:

- both are invariant to a rescaling x -> a x (a > 0);
- only LayerNorm is invariant to a shift x -> x + c;
- on zero-mean input (x - mean(x)) the two agree (same gain, LayerNorm bias 0);
- RMSNorm has d parameters, LayerNorm 2d.

The invariances are exact only for eps = 0 (eps adds a relative error of about
eps / (2 mean(x^2))), so the behaviour checks run at eps = 0 and pass when the largest
absolute deviation is within ``8 * finfo(dtype).eps * max|y|`` (a few roundings of the
largest output). A check expected to *change* the output passes when the deviation
exceeds that tolerance.

Cost: forward and forward+backward times of each norm for every (rows, d_model), as the
median of ``repeats`` samples after warm-up (CUDA events on a GPU, ``perf_counter`` on
the CPU; each sample times enough calls to last ``min_sample_s``; the two norms'
samples alternate, so a busy machine's load hits both alike), for three
implementations: ``eager`` (hand-written torch ops), ``functional``
(``torch.nn.functional.rms_norm`` / ``layer_norm``) and ``compiled``
(``torch.compile`` of the eager ones, dynamic shapes; a failure is recorded as
unavailable, never raised). The bytes saved for backward are measured with
``torch.autograd.graph.saved_tensors_hooks`` on one grad-enabled forward.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import pandas as pd
import torch
import torch.nn.functional as F

from ... import theory
from ...model.config import ConfigError, RunConfig
from ...model.init import generator
from ..device import cpu_threads, device_name, resolve_device, resolve_dtype
from ..driver import Run
from ..result import ExperimentResult, Partial, Progress, is_run_failure

NORMS = ("rmsnorm", "layernorm")
IMPLS = ("eager", "functional", "compiled")
PASSES = ("forward", "forward_backward")

BEHAVIOUR_COLUMNS = [
    "check", "norm", "impl", "transform", "expected", "max_abs_dev", "tolerance", "passed",
    "dtype", "rows", "d_model", "eps",
]  # fmt: skip
TIMING_COLUMNS = [
    "norm", "impl", "pass", "rows", "d_model", "dtype", "device", "available", "time_ms",
    "time_ms_min", "time_ms_max", "repeats", "calls_per_sample", "params",
    "saved_bytes", "saved_bytes_extra", "saved_tensors", "input_bytes", "error",
]  # fmt: skip
RATIO_COLUMNS = [
    "impl", "pass", "rows", "d_model", "rmsnorm_ms", "layernorm_ms", "time_ratio", "time_ratio_min",
    "rmsnorm_saved_bytes_extra", "layernorm_saved_bytes_extra", "params_saved",
]  # fmt: skip


def _forward(df: pd.DataFrame):
    return df["pass"] == "forward"


def _unavailable(df: pd.DataFrame):
    return df["available"] != True  # noqa: E712 (a column of bools, or NaN)


#: Cells with no value by design (written empty): nothing is saved for backward in a
#: forward pass; an unavailable implementation has no times; an available one no error.
NOT_APPLICABLE = {
    "norms_timing": {
        "saved_bytes": _forward, "saved_bytes_extra": _forward, "saved_tensors": _forward,
        "time_ms": _unavailable, "time_ms_min": _unavailable, "time_ms_max": _unavailable,
        "calls_per_sample": _unavailable, "error": lambda df: df["available"] == True,  # noqa: E712
    },
    "norms_ratio": {"rmsnorm_saved_bytes_extra": _forward, "layernorm_saved_bytes_extra": _forward},
}  # fmt: skip

#: Behaviour-check constants: a scale that is not a power of two (so it rounds), a shift
#: of the order of the input's spread, and an input mean that makes centring matter.
SCALE, SHIFT, INPUT_MEAN = 3.0, 2.0, 0.5
#: Tolerance of a behaviour check, in units of finfo(dtype).eps * max|y|.
TOL_ULPS = 8.0


# --- the implementations: fn(x, weight, bias, eps) -> y (bias is None for RMSNorm) ---


def eager_rms_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def eager_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float):
    xc = x - x.mean(-1, keepdim=True)
    return xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps) * weight + bias


def functional_rms_norm(x, weight, bias, eps: float):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def functional_layer_norm(x, weight, bias, eps: float):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


Impl = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, float], torch.Tensor]


def implementations(compile: bool) -> dict[tuple[str, str], Impl]:
    """(norm, impl) -> function. Compiled ones are compiled lazily, on first call."""
    out: dict[tuple[str, str], Impl] = {
        ("rmsnorm", "eager"): eager_rms_norm,
        ("layernorm", "eager"): eager_layer_norm,
        ("rmsnorm", "functional"): functional_rms_norm,
        ("layernorm", "functional"): functional_layer_norm,
    }
    if compile:
        for norm in NORMS:
            out[(norm, "compiled")] = torch.compile(out[(norm, "eager")], dynamic=True)
    return out


def norm_tensors(norm: str, rows: int, d: int, device, dtype, seed: int, grad: bool = False):
    """Seeded input x ~ N(INPUT_MEAN, 1) of shape (rows, d), gain ~ 1 + 0.1 N(0, 1) and
    (LayerNorm) bias ~ 0.1 N(0, 1)."""

    def draw(key: str, shape, mean: float, std: float) -> torch.Tensor:
        gen = generator(seed, -4, f"norms/{key}/{rows}x{d}", device)
        t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std + mean
        return t.to(dtype).requires_grad_(grad)

    x = draw("x", (rows, d), INPUT_MEAN, 1.0)
    weight = draw("weight", (d,), 1.0, 0.1)
    bias = draw("bias", (d,), 0.0, 0.1) if norm == "layernorm" else None
    return x, weight, bias


# --- behaviour ---


def behaviour_checks(
    impls: dict[tuple[str, str], Impl], rows: int, d: int, device, dtype, seed: int
) -> list[dict]:
    """The invariance checks, one row each, per implementation, at eps = 0."""
    eps_dtype = torch.finfo(dtype).eps
    out = []

    def row(check, norm, impl, transform, expected, y_ref, y_other):
        dev = float((y_other.double() - y_ref.double()).abs().max())
        tol = TOL_ULPS * eps_dtype * float(y_ref.double().abs().max())
        passed = dev <= tol if expected in ("invariant", "agree") else dev > tol
        out.append({
            "check": check, "norm": norm, "impl": impl, "transform": transform, "expected": expected,
            "max_abs_dev": dev, "tolerance": tol, "passed": bool(passed), "dtype": str(dtype).split(".")[-1],
            "rows": rows, "d_model": d, "eps": 0.0,
        })  # fmt: skip

    with torch.no_grad():
        names = list(dict.fromkeys(impl for _, impl in impls))
        for impl in names:
            rms, ln = impls[("rmsnorm", impl)], impls[("layernorm", impl)]
            x, g, _ = norm_tensors("rmsnorm", rows, d, device, dtype, seed)
            _, _, b = norm_tensors("layernorm", rows, d, device, dtype, seed)
            for norm, f, bias in (("rmsnorm", rms, None), ("layernorm", ln, b)):
                y = f(x, g, bias, 0.0)
                row("scale", norm, impl, f"x -> {SCALE:g}*x", "invariant", y, f(SCALE * x, g, bias, 0.0))
                shift = "changes" if norm == "rmsnorm" else "invariant"
                row("shift", norm, impl, f"x -> x + {SHIFT:g}", shift, y, f(x + SHIFT, g, bias, 0.0))
            xc = x - x.mean(-1, keepdim=True)
            zero = torch.zeros_like(g)
            row("zero_mean", "both", impl, "RMSNorm(x - mean) vs LayerNorm(x - mean), bias 0", "agree",
                ln(xc, g, zero, 0.0), rms(xc, g, None, 0.0))  # fmt: skip
            row("nonzero_mean", "both", impl, f"RMSNorm(x) vs LayerNorm(x), mean(x) ~ {INPUT_MEAN:g}",
                "differ", ln(x, g, zero, 0.0), rms(x, g, None, 0.0))  # fmt: skip
            if impl != "eager" and ("rmsnorm", "eager") in impls:
                for norm, bias in (("rmsnorm", None), ("layernorm", b)):
                    ref = impls[(norm, "eager")](x, g, bias, 0.0)
                    row(f"{impl}_vs_eager", norm, impl, "same input", "agree", ref,
                        impls[(norm, impl)](x, g, bias, 0.0))  # fmt: skip
    return out


# --- cost ---


def saved_for_backward(fn: Impl, x, weight, bias, eps: float) -> dict[str, int]:
    """Bytes of the tensors autograd saves for backward in one forward, measured with
    ``saved_tensors_hooks``; each storage counted once. ``extra`` leaves out the
    storages of x and the parameters (which exist anyway)."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x, weight, bias, eps)
    own = {t.untyped_storage().data_ptr() for t in (x, weight, bias) if t is not None}
    return {
        "saved_bytes": sum(storages.values()),
        "saved_bytes_extra": sum(n for p, n in storages.items() if p not in own),
        "saved_tensors": len(storages),
    }


def make_timer(device: torch.device) -> Callable[[Callable[[], object], int], float]:
    """timer(fn, n) -> seconds per call of n back-to-back calls: CUDA events on a GPU
    (the host only enqueues), ``perf_counter`` on the CPU."""
    if device.type == "cuda":

        def timer(fn, n):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / n

        return timer

    def timer(fn, n):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    return timer


def calibrate(fn: Callable[[], object], timer, warmup: int, min_sample_s: float) -> int:
    """Warm up, then the calls per sample (a power of two, at most 4096) that make a
    sample last >= ``min_sample_s``, above timer resolution and launch jitter."""
    for _ in range(warmup):
        fn()
    n = 1
    while n < 4096 and timer(fn, n) * n < min_sample_s:
        n *= 2
    return n


def check_sizes(name: str, values: Sequence[int]) -> list[int]:
    out = list(values)
    if not out or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in out):
        raise ConfigError(name, f"give positive whole numbers, got {values!r}")
    return out


def ratio_frame(timing: pd.DataFrame) -> pd.DataFrame:
    """LayerNorm / RMSNorm time per (impl, pass, rows, d_model), both available: of the
    medians, and of the fastest samples (steadier when the machine is busy)."""
    ok = timing[timing["available"]]
    keys = ["impl", "pass", "rows", "d_model"]
    rms, ln = ok[ok["norm"] == "rmsnorm"], ok[ok["norm"] == "layernorm"]
    both = rms.merge(ln, on=keys, how="inner", suffixes=("_rms", "_ln")).set_index(keys)
    out = pd.DataFrame({
        "rmsnorm_ms": both["time_ms_rms"], "layernorm_ms": both["time_ms_ln"],
        "time_ratio": both["time_ms_ln"] / both["time_ms_rms"],
        "time_ratio_min": both["time_ms_min_ln"] / both["time_ms_min_rms"],
        "rmsnorm_saved_bytes_extra": both["saved_bytes_extra_rms"],
        "layernorm_saved_bytes_extra": both["saved_bytes_extra_ln"],
        "params_saved": both["params_ln"] - both["params_rms"],
    }).reset_index()  # fmt: skip
    return out[RATIO_COLUMNS]


def time_pair(
    fns: dict[str, Impl],
    rows: int,
    d: int,
    device,
    dtype,
    seed: int,
    eps: float,
    timer,
    repeats: int,
    warmup: int,
    min_sample_s: float,
) -> dict[str, dict[str, dict]]:
    """Forward (no grad) and forward+backward (gradients of x, gain, bias) timings of one
    implementation of both norms at one size, and their saved-for-backward bytes:
    norm -> pass -> columns. The two norms' samples alternate, so load changes and
    allocator state on a busy machine hit both alike and their ratio stays fair."""
    calls: dict[str, dict[str, Callable[[], object]]] = {}
    tensors: dict[str, tuple] = {}
    out: dict[str, dict[str, dict]] = {norm: {} for norm in fns}
    for norm, fn in fns.items():
        x, w, b = norm_tensors(norm, rows, d, device, dtype, seed, grad=True)
        grad_out = torch.ones(rows, d, device=device, dtype=dtype)
        inputs = tuple(t for t in (x, w, b) if t is not None)

        def forward(fn=fn, x=x, w=w, b=b):
            with torch.no_grad():
                return fn(x, w, b, eps)

        def forward_backward(fn=fn, x=x, w=w, b=b, inputs=inputs, grad_out=grad_out):
            return torch.autograd.grad(fn(x, w, b, eps), inputs, grad_out)

        calls[norm] = {"forward": forward, "forward_backward": forward_backward}
        tensors[norm] = (fn, x, w, b)
    for pass_ in PASSES:
        n = {norm: calibrate(c[pass_], timer, warmup, min_sample_s) for norm, c in calls.items()}
        samples: dict[str, list[float]] = {norm: [] for norm in calls}
        for _ in range(repeats):
            for norm, c in calls.items():
                samples[norm].append(1e3 * timer(c[pass_], n[norm]))
        for norm, ms in samples.items():
            out[norm].setdefault(pass_, {}).update({
                "available": True, "time_ms": statistics.median(ms), "time_ms_min": min(ms),
                "time_ms_max": max(ms), "calls_per_sample": n[norm],
            })  # fmt: skip
    for norm, (fn, x, w, b) in tensors.items():  # after warm-up: a compiled fn is built by now
        out[norm]["forward_backward"].update(saved_for_backward(fn, x, w, b, eps))
    return out


def _check_count(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(name, f"must be a whole number >= {minimum}, got {value!r}")


def run_norms(
    run: RunConfig | None = None,
    rows: Sequence[int] = (256, 1024),
    d_models: Sequence[int] = (256, 1024, 4096),
    repeats: int = 10,
    progress: Progress | None = None,
    *,
    seed: int = 0,
    warmup: int = 3,
    compile: bool | None = None,
    eps: float = 1e-6,
    threads: int | None = 1,
    min_sample_s: float | None = None,
    behaviour_shape: tuple[int, int] = (64, 256),
    on_partial: Partial | None = None,
) -> ExperimentResult:
    """Behaviour and cost of RMSNorm vs LayerNorm on ``run.device`` in ``run.dtype``.

    ``compile=None`` compiles on CUDA only (inductor's C++ build on a small CPU takes
    15-60 s); ``True`` tries everywhere and records a failure as unavailable.
    ``threads`` sets torch's CPU thread count for the run (restored after; None leaves
    it): the default, one, gives steady numbers on a shared or busy CPU, where OpenMP
    threads otherwise wait for each other (times of small sizes then vary tenfold).

    Returns frames ``norms_behaviour`` (one row per check and implementation),
    ``norms_timing`` (one row per norm, impl, pass, rows, d_model) and ``norms_ratio``
    (LayerNorm / RMSNorm per impl, pass and size). Raises :class:`IncompleteRun` on
    out-of-memory or interrupt, holding what was measured. ``on_partial`` gets a
    function building the result so far after each size.

    >>> res = run_norms(RunConfig(device="cpu"), rows=(64,), d_models=(128,), repeats=3)
    >>> res["norms_ratio"][["impl", "pass", "time_ratio"]]  # doctest: +SKIP
    """
    run = run or RunConfig()
    rows_list, d_list = check_sizes("rows", rows), check_sizes("d_models", d_models)
    _check_count("repeats", repeats, 1)
    _check_count("warmup", warmup, 0)
    if threads is not None:
        _check_count("threads", threads, 1)
    device, dtype = resolve_device(run.device), resolve_dtype(run.dtype)
    use_compile = device.type == "cuda" if compile is None else bool(compile)
    if min_sample_s is None:
        min_sample_s = 1e-3 if device.type == "cuda" else 2e-3
    impls = implementations(use_compile)
    impl_names = [i for i in IMPLS if (NORMS[0], i) in impls]
    timer = make_timer(device)
    sizes = [(r, d) for r in rows_list for d in d_list]
    broken: dict[str, str] = {}  # impl -> why it is unavailable
    timing: list[dict] = []
    behaviour: list[dict] = []
    itemsize = torch.empty((), dtype=dtype).element_size()
    meta = {
        "run": run.to_dict(), "device": str(device), "device_name": device_name(device),
        "torch_threads": threads or torch.get_num_threads(), "seed": seed,
        "rows": rows_list, "d_models": d_list, "repeats": repeats, "warmup": warmup,
        "compile": use_compile, "eps": eps, "min_sample_s": min_sample_s,
        "timer": "cuda events" if device.type == "cuda" else "time.perf_counter",
        "behaviour": {
            "shape": list(behaviour_shape), "scale": SCALE, "shift": SHIFT, "input_mean": INPUT_MEAN,
            "tolerance": f"{TOL_ULPS:g} * finfo(dtype).eps * max|y|", "eps": 0.0,
        },
    }  # fmt: skip

    def frames() -> dict[str, pd.DataFrame]:
        meta["unavailable"] = broken
        t = pd.DataFrame(timing, columns=TIMING_COLUMNS)
        return {
            "norms_behaviour": pd.DataFrame(behaviour, columns=BEHAVIOUR_COLUMNS),
            "norms_timing": t,
            "norms_ratio": ratio_frame(t) if len(t) else pd.DataFrame(columns=RATIO_COLUMNS),
        }

    def not_applicable(_frames) -> dict:
        def gone(df: pd.DataFrame):
            return df["impl"].isin(list(broken))

        times = dict.fromkeys(("rmsnorm_ms", "layernorm_ms", "time_ratio", "time_ratio_min"), gone)
        return {**NOT_APPLICABLE, "norms_ratio": {**NOT_APPLICABLE["norms_ratio"], **times}}

    driver = Run(meta, frames, not_applicable, on_partial=on_partial, progress=progress,
                 total=len(sizes) * len(NORMS) * len(impl_names) + 1)  # fmt: skip

    def record(norm: str, impl: str, r: int, d: int, values: dict[str, dict]) -> None:
        base = {
            "norm": norm, "impl": impl, "rows": r, "d_model": d, "dtype": run.dtype, "device": str(device),
            "params": theory.norm_params(norm, d), "input_bytes": r * d * itemsize, "repeats": repeats,
        }  # fmt: skip
        for pass_ in PASSES:
            timing.append({**base, "pass": pass_, **values[pass_]})
        driver.tick()

    def measure(size: tuple[int, int]) -> None:
        """Every implementation of both norms at one size; each row kept as it is timed."""
        r, d = size
        for impl in impl_names:
            if impl not in broken:
                try:
                    values = time_pair(
                        {norm: impls[(norm, impl)] for norm in NORMS}, r, d, device, dtype, seed,
                        eps, timer, repeats, warmup, min_sample_s,
                    )  # fmt: skip
                except Exception as exc:  # a compile failure: unavailable, not fatal
                    if impl != "compiled" or is_run_failure(exc):
                        raise
                    first = (str(exc).strip().splitlines() or [""])[0][:200]
                    broken[impl] = f"{type(exc).__name__}: {first}"
            for norm in NORMS:
                gone = {"available": False, "error": broken.get(impl)}
                record(norm, impl, r, d, dict.fromkeys(PASSES, gone) if impl in broken else values[norm])

    with cpu_threads(threads):
        driver.each(sizes, measure, label=lambda _size: "norms")
        with driver.guard("norms"):
            available = {k: f for k, f in impls.items() if k[1] not in broken}
            behaviour.extend(behaviour_checks(available, *behaviour_shape, device, dtype, seed))
            driver.tick()
    return driver.result()
