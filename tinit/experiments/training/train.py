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
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from ...model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from ...model.schemes import Scheme
from ..configs import (
    structure_meta,
)
from ..device import matmul_precision, resolve_device
from ..driver import Run
from ..meta import run_meta
from ..result import ExperimentResult, Partial, Progress
from .compare import compare_schemes
from .compare import not_applicable as compare_not_applicable
from .data import TrainData
from .grid import TrainGrid, check_specs
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
    checkpoint_labels,
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
    """Train every spec in order (``on_partial`` gets a function building the result so
    far after each run but the last, so the CLI writes finished runs as they end). Frames:
    ``train``, ``update_ratios``, ``variance_during_training``, ``runs`` (one row per run)
    and ``summary`` (over seeds).
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
            record = train_run(spec, train, data, device, driver.tick, saving, save_steps, labels[unit[0]])
        return record, time.perf_counter() - t0

    names, labels = run_names(specs), checkpoint_labels(specs)

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
    grid: TrainGrid,
    progress: Progress | None = None,
    on_partial: Partial | None = None,
    on_checkpoint: OnCheckpoint | None = None,
    save_steps: str | Sequence[int | str] | None = None,
) -> ExperimentResult:
    """Train the grid (:class:`~tinit.experiments.training.grid.TrainGrid`: schemes x norm
    positions x depths x widths x lrs x warmups x seeds on its data; ``widths``: d_model
    values, each with its default d_ff; None: the model's). With two or more schemes the
    result has ``compare``: each against the first, paired by seed. ``save_steps``
    (``"0,100,final"``) with ``on_checkpoint``: each run's weights at those steps
    (:func:`run_specs`).

    >>> from tinit.experiments.training.data import load_data
    >>> data = load_data("markov", vocab=64, seq_len=16, batch=8, seed=0)
    >>> model = ModelConfig(n_layers=2, d_model=32, n_heads=2, vocab_size=64)
    >>> grid = TrainGrid(model, InitConfig(), RunConfig(device="cpu"), TrainConfig(steps=20), data,
    ...                  ["scaled"], ["pre"], [2], [0])
    >>> res = run_train(grid)
    >>> res["summary"]["final_eval_loss_mean"]  # doctest: +SKIP
    """
    grid = grid.checked()
    specs = grid.specs()
    saves = parse_save_steps(save_steps, grid.train.steps)
    if saves and on_checkpoint is None:
        raise ConfigError("save_steps", "needs on_checkpoint, the callback that writes the files")
    configurations = list(dict.fromkeys((s.init.scheme, s.model.norm_position) for s in specs))
    return run_specs(
        specs,
        grid.train,
        grid.data,
        grid.run,
        progress,
        {
            "grid": grid.record(),
            # per (scheme, placement): what its model took from the scheme, what the user overrode
            "structure": structure_meta(grid.model, grid.init, grid.run, configurations),
        },
        on_partial,
        compare=len(grid.schemes) > 1,
        on_checkpoint=on_checkpoint if saves else None,
        save_steps=saves,
    )
