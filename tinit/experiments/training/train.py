"""Training tinit's model: does what holds at initialization survive training?

The experiment of ``tinit train``: a grid of runs, trained in order under the run
driver (one run is :mod:`.trainer`). :func:`run_train` builds the grid schemes x norm
positions x depths x widths x lrs x warmups x seeds (:func:`grid_specs`) and hands it
to :func:`run_specs`, which checks every spec before anything trains
(:func:`check_specs`), trains each with :func:`.trainer.train_run` and assembles the
frames: ``train``, ``update_ratios``, ``variance_during_training`` (one run's columns,
in :mod:`.trainer`), ``runs`` (one row per run) and ``summary`` (mean and standard
error over seeds, :func:`summarize_runs`), with the cells they leave empty by design
(:func:`not_applicable`, docs/design.md §5).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from ...model.catalogue import placements_for
from ...model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from ...model.params import count_params
from ...model.schemes import Scheme
from ...model.structure import apply_scheme
from ..configs import (
    DEFAULT_PLACEMENTS,
    check_configs,
    parse_widths,
    position_list,
    scheme_list,
    structure_meta,
)
from ..device import matmul_precision, resolve_device
from ..driver import Run
from ..memory import available_memory, host_memory
from ..meta import run_meta
from ..result import ExperimentResult, Partial, Progress
from .compare import compare_schemes
from .compare import not_applicable as compare_not_applicable
from .data import TrainData
from .saving import check_disk, parse_save_steps
from .trainer import (
    CONFIG_COLUMNS,
    PROBE_COLUMNS,
    RATIO_COLUMNS,
    RUN_COLUMNS,
    TRAIN_COLUMNS,
    OnCheckpoint,
    RunRecord,
    RunSpec,
    TrainConfig,
    train_run,
)

#: A configuration over seeds: the summary's key.
GROUP_COLUMNS = [c for c in CONFIG_COLUMNS if c != "seed"]
SUMMARY_COLUMNS = [
    *GROUP_COLUMNS,
    "seeds",
    "diverged",
    "final_eval_loss_mean",
    "final_eval_loss_se",
    "initial_eval_loss_mean",
    "entropy_floor",
    "gap_to_floor",
    "tokens_per_s",
    "mfu",
]


def standard_error(values: Sequence[float]) -> float:
    """Sample std / sqrt(n) (ddof 1); NaN with fewer than two values."""
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=float)
    return float(v.std(ddof=1) / math.sqrt(v.size)) if v.size >= 2 else math.nan


def summarize_runs(runs: pd.DataFrame, floor: float | None) -> pd.DataFrame:
    """One row per configuration: final eval loss mean and standard error over the
    seeds that did not diverge, how many diverged, mean tokens per second."""
    out = []
    for key, g in runs.groupby(GROUP_COLUMNS, sort=False, dropna=False):
        finals = g.loc[~g["diverged"].astype(bool), "final_eval_loss"].to_numpy(dtype=float)
        mean = float(np.mean(finals)) if finals.size else math.nan
        out.append(
            {
                **dict(zip(GROUP_COLUMNS, key, strict=True)),
                "seeds": len(g),
                "diverged": int(g["diverged"].sum()),
                "final_eval_loss_mean": mean,
                "final_eval_loss_se": standard_error(finals),
                "initial_eval_loss_mean": float(g["initial_eval_loss"].mean()),
                "entropy_floor": math.nan if floor is None else floor,
                "gap_to_floor": math.nan if floor is None else mean - floor,
                "tokens_per_s": float(g["tokens_per_s"].mean()),
                "mfu": float(g["mfu"].mean()),
            }
        )
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)


def run_specs(
    specs: Sequence[RunSpec],
    train: TrainConfig,
    data: TrainData,
    run: RunConfig,
    progress: Progress | None = None,
    meta_extra: dict | None = None,
    on_partial: Partial | None = None,
    compare: bool = False,
    on_checkpoint: OnCheckpoint | None = None,
    save_steps: Sequence[int] = (),
) -> ExperimentResult:
    """Train every spec in order (``on_partial`` gets the result so far after each run,
    so a finished run is on disk before the next starts). Frames: ``train``, ``update_ratios``,
    ``variance_during_training``, ``runs`` (one row per run) and ``summary`` (over seeds).
    With ``compare``, also ``compare``: each scheme against the first, paired by seed
    (:func:`.compare.compare_schemes`). With ``on_checkpoint``, each run's weights are
    handed to it at ``save_steps`` (:func:`parse_save_steps`; the callback writes them,
    :class:`tinit.results.checkpoints.CheckpointWriter`), and config.json's
    ``checkpoints`` lists what it wrote. A run that fails part-way (out of memory,
    interrupted) raises :class:`IncompleteRun` holding the finished runs."""
    device = resolve_device(run.device)
    if run.dtype != "float32":
        raise ConfigError(
            "dtype", "training keeps float32 master weights (bf16 autocast on CUDA); use float32"
        )
    check_specs(specs, data, device, train.param_rules, train.steps)
    if on_checkpoint is not None and save_steps:
        check_disk(specs, save_steps, getattr(on_checkpoint, "free_bytes", lambda: None)())
    torch.manual_seed(0)  # nothing draws from the global generator; fixed in case a kernel does
    records: list[RunRecord] = []
    base = specs[0] if specs else RunSpec(ModelConfig(), InitConfig(), train.lr, train.warmup)
    meta = run_meta(
        base.model,
        base.init,
        run,
        device,
        train=dataclasses.asdict(train),
        data=data.info,
        entropy_floor=data.floor,
        runs=len(specs),
        **(meta_extra or {}),
    )
    meta["seconds"] = {}
    meta["param_groups"] = {}  # per run: every optimizer group's lr, weight decay and eps
    if on_checkpoint is not None:
        meta["save_steps"] = list(save_steps)
        meta["checkpoints"] = []  # per checkpoint written: run, step, file, json, bytes

    def frames() -> dict[str, pd.DataFrame]:
        def frame(rows, cols):
            return pd.DataFrame(rows, columns=cols) if rows else pd.DataFrame(columns=cols)

        runs = frame([r.summary for r in records], RUN_COLUMNS)
        probes = [p for r in records for p in r.probes]
        variance = pd.concat(probes, ignore_index=True)[PROBE_COLUMNS] if probes else frame([], PROBE_COLUMNS)
        out = {
            "train": frame([x for r in records for x in r.train], TRAIN_COLUMNS),
            "update_ratios": frame([x for r in records for x in r.ratios], RATIO_COLUMNS),
            "variance_during_training": variance,
            "runs": runs,
            "summary": summarize_runs(runs, data.floor) if len(runs) else frame([], SUMMARY_COLUMNS),
        }
        if compare:
            out["compare"] = compare_schemes(runs)
        if train.probe_points == 0:  # none asked for: no empty CSV (and the plots still get written)
            del out["variance_during_training"]
        meta["complete_runs"] = len(records)
        return out

    # (a progress step is an optimizer step; each run's time is recorded without a Meter's
    # memory figures, which training's config.json does not carry)
    custom = base.init.schemes

    def empty_cells(_frames) -> dict:
        rules = not_applicable(train, device, data.floor, custom)
        return {**rules, "compare": compare_not_applicable()} if compare else rules

    driver = Run(meta, frames, empty_cells,
                 on_partial=on_partial, progress=progress, total=len(specs) * train.steps)  # fmt: skip

    def measure(unit: tuple[int, RunSpec]) -> tuple[RunRecord, float]:
        spec = unit[1]
        if spec.model.vocab_size < data.vocab:
            raise ConfigError(
                "vocab_size", f"the data needs a vocabulary of {data.vocab}, got {spec.model.vocab_size}"
            )
        if spec.model.max_seq_len < data.seq_len:
            spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, max_seq_len=data.seq_len))
        t0 = time.perf_counter()
        with matmul_precision(run):
            record = train_run(spec, train, data, device, driver.tick, saving, save_steps)
        return record, time.perf_counter() - t0

    names = run_names(specs)

    def saving(step: int, label: str, state: dict, info: dict) -> dict:
        # listed as soon as it is written: a run stopped later still lists its checkpoints
        entry = on_checkpoint(step, label, state, info)
        meta["checkpoints"].append(entry)
        return entry

    saving = saving if on_checkpoint is not None else None

    def collect(unit: tuple[int, RunSpec], measured: tuple[RunRecord, float]) -> None:
        i, (record, seconds) = unit[0], measured
        records.append(record)
        key = names[i] if names[i] not in meta["seconds"] else f"{names[i]} (run {i + 1})"
        meta["seconds"][key] = seconds
        meta["param_groups"][key] = record.groups

    # no partial after the last run: the caller's result follows at once
    driver.each(enumerate(specs), measure, collect, label=lambda u: f"run {u[0] + 1}/{len(specs)}",
                last_partial=False)  # fmt: skip
    return driver.result()


def run_names(specs: Sequence[RunSpec]) -> list[str]:
    """Each run named by its configuration (what the timing line and config.json's
    ``seconds`` show): init/placement, then the settings that vary in the grid."""
    labels = [s.labels() for s in specs]
    short = {"n_layers": "L", "peak_lr": "lr", "d_model": "d", "d_ff": "d_ff"}
    varying = [k for k in labels[0] if k not in ("init", "norm_position")
               and len({str(x[k]) for x in labels}) > 1] if labels else []  # fmt: skip

    def part(k: str, v) -> str:
        if k == "tied":
            return "tied" if v else "untied"
        if k in ("norm", "ffn"):
            return str(v)
        return f"{short.get(k, k)}={v:g}" if isinstance(v, float) else f"{short.get(k, k)}={v}"

    return [", ".join([f"{x['init']}/{x['norm_position']}", *(part(k, x[k]) for k in varying)])
            for x in labels]  # fmt: skip


def _numbers(values, field: str, whole: bool, low: float) -> list:
    """A list of numbers (never a string, iterated by character): finite, whole when
    ``whole``, ``>= low`` (whole) or ``> low``; a ConfigError naming ``field`` otherwise."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise ConfigError(field, f"give a list of numbers, got {values!r}")
    out = list(values)
    for v in out:
        real = isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool)
        ok = real and math.isfinite(v) and (v == int(v) and v >= low if whole else v > low)
        if not ok:
            want = f"a whole number >= {low:g}" if whole else f"a finite number > {low:g}"
            raise ConfigError(field, f"{v!r} is not {want}")
    if not out:
        raise ConfigError(field, "the list is empty")
    return [int(v) for v in out] if whole else [float(v) for v in out]


def grid_axes(model: ModelConfig, init: InitConfig, train: TrainConfig, schemes, norm_positions, depths,
              seeds, lrs, warmups, widths) -> tuple:  # fmt: skip
    """The axes of a training grid as a library caller gave them, checked: schemes and
    placements (a string is a comma list, as --init reads it), depths and widths (each
    once), seeds and warmups (whole numbers >= 0), lrs (positive); lrs None: the
    config's, warmups None: the config's. A ConfigError naming the axis otherwise."""
    from ..measure.depth_sweep import parse_layers

    return (
        scheme_list(schemes, init.schemes),
        position_list(norm_positions) or None,
        parse_layers(depths),
        _numbers(seeds, "seed", True, 0),
        _numbers(lrs, "lr", False, 0) if lrs is not None else [train.lr],
        _numbers(warmups, "warmup", True, 0) if warmups is not None else [train.warmup],
        parse_widths(widths) if widths is not None else None,
    )


def grid_specs(
    model: ModelConfig,
    init: InitConfig,
    schemes: Sequence[str],
    norm_positions: Sequence[str] | None,
    depths: Sequence[int],
    seeds: Sequence[int],
    lrs: Sequence[float],
    warmups: Sequence[int],
    widths: Sequence[int] | None = None,
) -> list[RunSpec]:
    """schemes x norm positions x depths x widths x lrs x warmups x seeds, seeds
    innermost; each model with its scheme's structure
    (:func:`tinit.model.structure.apply_scheme`, as ``ModelConfig.from_scheme``), and
    ``norm_positions`` None: each scheme in its own placement (pre and post for a scheme
    scheme is whatever ``InitConfig.recipe`` accepts: the run only passes it on.
    ``widths`` (d_model values; None: the model's): several each take their default FFN
    width (d_ff grows with d, as a width-transfer study needs); the model's own width alone
    keeps the model's d_ff."""
    schemes, norm_positions, depths, seeds, lrs, warmups, widths = grid_axes(
        model, init, TrainConfig(), schemes, norm_positions, depths, seeds, lrs, warmups, widths
    )
    own = widths is None or widths == [model.d_model]

    def shape(pos: str, scheme: str, L: int, d: int) -> ModelConfig:
        sized = {"n_layers": L} if own else {"n_layers": L, "d_model": d, "d_ff": None}
        return apply_scheme(dataclasses.replace(model, **sized), scheme, init.schemes, norm_position=pos)

    def positions(scheme: str) -> tuple[str, ...]:
        if norm_positions is None:
            return placements_for(scheme, DEFAULT_PLACEMENTS, init.schemes)
        return tuple(norm_positions)

    return [
        RunSpec(shape(pos, scheme, L, d), dataclasses.replace(init, recipe=scheme, seed=seed), lr, warmup)
        for scheme in schemes
        for pos in positions(scheme)
        for L in depths
        for d in (widths or [model.d_model])
        for lr in lrs
        for warmup in warmups
        for seed in seeds
    ]


#: Bytes per parameter a training run holds at least: float32 weights, gradients and
#: AdamW's two moments.
TRAIN_BYTES_PER_PARAM = 16
#: Bytes a run keeps in memory per record: every step adds a ``train`` row and an
#: ``update_ratios`` row per stream-writing matrix (2 a layer), kept until the run's
#: frames are made. 316 bytes a row as dicts (tracemalloc, 20,000 steps at L 12), with
#: the frames made from them rounded up to 512.
RECORD_BYTES = 512


def check_schemes(specs: Sequence[RunSpec], seq_len: int, rules: bool = True) -> None:
    """Before anything trains: every run's scheme is defined at every layer of its model
    and, with ``rules`` (--param-rules on), its optimizer rules are in range at that
    model's shape (a ConfigError naming --init-file or --init otherwise)."""
    checked = set()
    for spec in specs:
        key = (spec.model, spec.init.recipe)
        if key not in checked:
            checked.add(key)
            check_configs(spec.model, spec.init, RunConfig(seq_len=seq_len),
                          [(spec.init.recipe, spec.model.norm_position)], optimizer=rules)  # fmt: skip


def check_specs(
    specs: Sequence[RunSpec], data: TrainData, device: torch.device, rules: bool = True, steps: int = 0
) -> None:
    """Before anything trains: no run repeats another (a repeat would be counted as a
    seed), every vocabulary covers the data, every scheme is defined at every layer (and
    its optimizer rules, with ``rules``, in range at the run's shape), the records of
    ``steps`` steps of every run (:data:`RECORD_BYTES` each, kept in host memory) take at
    most half the free host memory, and the largest model's weights, gradients and AdamW
    state fit in the device's free memory (else a ConfigError naming what makes it large,
    not an out-of-memory stop)."""
    seen: set = set()
    for spec in specs:
        key = (tuple(sorted(spec.labels().items())), spec.init.seed)
        if key in seen:
            raise ConfigError("lr", f"the run {spec.labels()} (seed {spec.init.seed}) is in the grid twice: "
                              "give each lr, warmup, depth and seed once")  # fmt: skip
        seen.add(key)
        if spec.model.vocab_size < data.vocab:
            raise ConfigError(
                "vocab_size", f"the data needs a vocabulary of {data.vocab}, got {spec.model.vocab_size}"
            )
    check_schemes(specs, data.seq_len, rules)
    if not specs:
        return
    big_spec = max(specs, key=lambda s: count_params(s.model, s.init.scheme).total)
    big, n = big_spec.model, count_params(big_spec.model, big_spec.init.scheme).total
    free = available_memory(device)
    if n * TRAIN_BYTES_PER_PARAM > free:
        embedding = big.vocab_size * big.d_model
        if 2 * embedding > n:
            field = "data" if data.chain is None else "vocab_size"
        else:  # the stack: its depth when one layer of this width would fit, else its width
            one = count_params(dataclasses.replace(big, n_layers=1)).total
            field = "n_layers" if one * TRAIN_BYTES_PER_PARAM <= free else "d_model"
        need, gib = n * TRAIN_BYTES_PER_PARAM / 2**30, free / 2**30
        raise ConfigError(field, f"a model of {n:.3g} parameters (L={big.n_layers}, d={big.d_model}, "
                          f"V={big.vocab_size}) needs {need:.3g} GiB for its weights, gradients and AdamW "
                          f"state, more than the {gib:.3g} GiB free")  # fmt: skip
    # then the per-step records (the model fits: what remains large is the number of steps)
    records = sum(steps * (1 + 2 * s.model.n_layers) for s in specs) * RECORD_BYTES
    host = host_memory()
    if records > host / 2:
        raise ConfigError("steps", f"{steps:,} steps of {len(specs)} run{'s' * (len(specs) > 1)} keep "
                          f"{records / 2**30:.3g} GiB of per-step records (a train row and two update "
                          f"ratios a layer), more than half the {host / 2**30:.3g} GiB of free host "
                          "memory")  # fmt: skip


def not_applicable(train: TrainConfig, device: torch.device, floor: float | None = 0.0,
                   custom: Sequence[Scheme] = ()) -> dict:  # fmt: skip
    """The cells the training frames leave empty by design (see
    :attr:`ExperimentResult.not_applicable`): the step-0 row has no lr, train loss or
    gradient yet; the held-out loss exists only every ``eval_every`` steps and at the
    last (not after a divergence, whose row says so); the embedding (k = 0) has no
    branch, and a zero branch no correlation; a zero-initialised matrix has no relative
    update at step 1; a run that did not diverge has no divergence step, one that did no
    final loss; MFU is known only on a GPU whose peak tinit knows; a standard error needs
    two seeds that did not diverge; data with no known entropy rate (``floor`` None) has
    no floor. Any other NaN (a loss that became NaN) is written ``nan`` and flagged."""

    def init_row(df):
        return df["status"] == "init"

    def no_eval(df):
        evaluated = (df["step"] % train.eval_every == 0) | (df["step"] == train.steps)
        return ~evaluated | (df["status"] == "diverged")

    def diverged(df):
        return df["diverged"].astype(bool)

    def all_diverged(df):
        return df["diverged"] >= df["seeds"]

    no_mfu = device.type != "cuda"
    return {
        "train": {"lr": init_row, "train_loss": init_row, "grad_norm": init_row, "eval_loss": no_eval},
        "update_ratios": {"update_ratio": lambda df: zero_before(df, custom)},
        "variance_during_training": {"branch_var": lambda df: df["k"] == 0,
                                     "cross_corr": lambda df: (df["k"] == 0) | (df["branch_var"] == 0)},
        "runs": {"mfu": no_mfu, "diverged_step": lambda df: ~diverged(df), "final_eval_loss": diverged},
        "summary": {"mfu": no_mfu, "final_eval_loss_se": lambda df: df["seeds"] - df["diverged"] < 2,
                    "final_eval_loss_mean": all_diverged,
                    # a file or stdlib has no known entropy rate: no floor, no gap to it
                    "entropy_floor": floor is None,
                    "gap_to_floor": lambda df: all_diverged(df) | (floor is None)},
    }  # fmt: skip


def zero_before(df: pd.DataFrame, custom: Sequence[Scheme] = ()):
    """Update ratios with no meaning: step 1 of a matrix the scheme (the catalogue's or
    one of the user's, ``custom``) initialises to zero (its ||W_before|| is 0; any other
    NaN is a measurement, written nan)."""
    from ...model.catalogue import get_scheme, known

    def zero_role(name: str, tensor: str) -> bool:
        return known(name, custom) and get_scheme(name, custom).rule(tensor).dist == "zero"

    zero = [zero_role(str(i), str(t)) for i, t in zip(df["init"], df["tensor"], strict=True)]
    return (df["step"] == 1).to_numpy() & np.asarray(zero, dtype=bool)


def run_train(
    model: ModelConfig,
    init: InitConfig,
    run: RunConfig,
    train: TrainConfig,
    data: TrainData,
    schemes: Sequence[str],
    norm_positions: Sequence[str],
    depths: Sequence[int],
    seeds: Sequence[int],
    lrs: Sequence[float] | None = None,
    warmups: Sequence[int] | None = None,
    progress: Progress | None = None,
    on_partial: Partial | None = None,
    widths: Sequence[int] | None = None,
    on_checkpoint: OnCheckpoint | None = None,
    save_steps: str | Sequence[int | str] | None = None,
) -> ExperimentResult:
    """Train the grid schemes x norm positions x depths x widths x lrs x warmups x seeds
    on ``data`` (``widths``: d_model values, each with its default d_ff; None: the model's).
    With two or more schemes the result has ``compare``: each against the first, paired
    by seed. ``save_steps`` (``"0,100,final"``) with ``on_checkpoint``: each run's weights
    at those steps (:func:`run_specs`).

    >>> from tinit.experiments.training.data import load_data
    >>> data = load_data("markov", vocab=64, seq_len=16, batch=8, seed=0)
    >>> res = run_train(ModelConfig(n_layers=2, d_model=32, n_heads=2, vocab_size=64), InitConfig(),
    ...                 RunConfig(device="cpu"), TrainConfig(steps=20), data, ["scaled"], ["pre"], [2], [0])
    >>> res["summary"]["final_eval_loss_mean"]  # doctest: +SKIP
    """
    schemes, norm_positions, depths, seeds, lrs, warmups, widths = grid_axes(
        model, init, train, schemes, norm_positions, depths, seeds, lrs, warmups, widths
    )
    specs = grid_specs(model, init, schemes, norm_positions, depths, seeds, lrs, warmups, widths)
    saves = parse_save_steps(save_steps, train.steps)
    if saves and on_checkpoint is None:
        raise ConfigError("save_steps", "needs on_checkpoint, the callback that writes the files")
    return run_specs(
        specs,
        train,
        data,
        run,
        progress,
        {
            "grid": {
                "schemes": list(schemes),
                "norm_positions": None if norm_positions is None else list(norm_positions),
                "depths": list(depths),
                "widths": list(widths or [model.d_model]),
                "seeds": list(seeds),
                "lrs": list(lrs),
                "warmups": list(warmups),
            },
            # per (scheme, placement): what its model took from the scheme, what the user overrode
            "structure": structure_meta(
                model, init, run, list(dict.fromkeys((s.init.recipe, s.model.norm_position) for s in specs))
            ),
        },
        on_partial,
        compare=len(schemes) > 1,
        on_checkpoint=on_checkpoint if saves else None,
        save_steps=saves,
    )
