"""A measuring command's grid as independent points, and the gathering of the points'
frames into the command's frames.

A :class:`Point` is one (depth, seed, init recipe, norm position) of a grid: the
configs and arguments of one call of the command's experiment restricted to it. Its
numbers are determined by those arguments alone (weights are drawn per seed, layer
and role, tokens per seed, and no configuration's draws depend on another's), so a
point gives the same numbers in any process, on any host. A :class:`Plan` lists a
command's points and gathers their frames: gathering every point's frames gives the
frames of the single-process run of the command with the same options.

No I/O here: :mod:`tinit.sweep` runs the points and writes them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..model.config import MAX_SEEDS, InitConfig, ModelConfig, RunConfig, check_count
from .configs import check_configs, grid, structure_meta
from .measure.depth_sweep import (
    SWEEP_COLUMNS,
    assemble,
    depth_sweep_point,
    not_applicable,
    seed_configs,
    transfer_reference,
)
from .measure.grad_norms import not_applicable as grad_norms_not_applicable
from .measure.grad_norms import require_gradients, run_grad_norms
from .measure.variance import NOT_APPLICABLE as VARIANCE_NOT_APPLICABLE
from .measure.variance import run_variance
from .memory import check_memory
from .result import ExperimentResult, Progress
from .training import coord_check, lr_sweep

#: Frames of one point, by file stem.
Frames = dict[str, pd.DataFrame]


@dataclass(frozen=True)
class Point:
    """One point of a grid: ``run`` measures it (a module-level function, so a point
    pickles by reference to it), ``kwargs`` are its arguments (configs are dataclasses),
    and ``labels`` say which point it is (also its folder name, :attr:`name`)."""

    run: Callable[..., ExperimentResult]
    labels: dict[str, Any]
    kwargs: dict[str, Any] = field(repr=False)

    @property
    def name(self) -> str:
        """A folder name: ``L4-seed1-naive-pre`` style, unique within a plan. A label with
        anything but letters, digits and ``_ . + = -`` (a library scheme named ``a/../b``)
        is replaced by ``_`` there, with a hash of the whole name: the folder stays inside
        ``points/`` and distinct."""
        short = {"n_layers": "L", "seed": "seed", "init": "", "norm_position": ""}
        raw = "-".join(f"{short.get(k, k)}{v}" for k, v in self.labels.items())
        safe = re.sub(r"[^A-Za-z0-9_.+=-]", "_", raw)
        if safe != raw or safe.startswith("."):
            digest = hashlib.blake2b(raw.encode(), digest_size=4).hexdigest()
            safe = f"{safe.lstrip('.')}-{digest}"
        return safe


@dataclass
class Plan:
    """A command's grid as points, and how their frames gather into the command's.

    ``gather`` takes the frames of the points that finished (by point name; a
    missing point is left out) and returns the command's frames; ``meta`` describes
    the grid for config.json."""

    command: str
    points: list[Point]
    gather: Callable[[dict[str, Frames]], Frames]
    meta: dict[str, Any] = field(default_factory=dict)
    #: the cells that are empty by design, as the command's experiment declares them
    #: (:attr:`ExperimentResult.not_applicable`), so the merged CSVs are written alike; or
    #: a function of the gathered frames giving them (where the rules depend on the data)
    not_applicable: dict[str, dict[str, Any]] | Callable[[Frames], dict] = field(default_factory=dict)


def _depth_sweep_runner(
    model: ModelConfig, init: InitConfig, run: RunConfig, n_layers: int, seed_index: int,
    inits: Sequence[str], norm_positions: Sequence[str], grads: bool, progress: Progress | None = None,
) -> ExperimentResult:  # fmt: skip
    rows, metas = depth_sweep_point(
        model, init, run, n_layers, seed_index, inits, norm_positions, grads, progress
    )  # fmt: skip
    meta = dict(metas[0])
    if len(metas) > 1:
        meta["grad_norms_meta"] = metas[1]
    return ExperimentResult({"depth_sweep": pd.DataFrame(rows, columns=SWEEP_COLUMNS)}, meta)


def run_point(point: Point, progress: Progress | None = None) -> ExperimentResult:
    """Measure one point (raises what its experiment raises). A user's scheme travels
    inside the point's InitConfig (``init.schemes``): no registry to fill first."""
    return point.run(**point.kwargs, progress=progress)


def _grid_meta(model: ModelConfig, init: InitConfig, run: RunConfig, **extra: Any) -> dict[str, Any]:
    """The resolved settings, like :func:`run_meta` but without the device, which each
    point resolves where it runs (a login node may have no GPU)."""
    configs = extra.get("configurations") or []
    if configs and all(isinstance(c, tuple | list) and len(c) == 2 for c in configs):
        extra = {**extra, "structure": structure_meta(model, init, run, [tuple(c) for c in configs])}
    return {
        "model": model.to_dict(),
        "init": init.to_dict(),
        "sigma_resolved": init.resolved_sigma(model.d_model),
        "embed_std_resolved": init.resolved_embed_std(model.d_model),
        "run": run.to_dict(),
        **extra,
    }


def depth_sweep_plan(
    model: ModelConfig, init: InitConfig, run: RunConfig, depths: Sequence[int], seeds: int,
    inits: Sequence[str], norm_positions: Sequence[str] | None, grads: bool, transfer_from: int | None = None,
) -> Plan:  # fmt: skip
    """``depth-sweep`` as one point per (L, seed, init, norm position); gathering is
    :func:`tinit.experiments.measure.depth_sweep.assemble` over every point's rows."""
    check_count("seeds", seeds, MAX_SEEDS)
    ref = transfer_reference(depths, transfer_from)
    if grads:
        require_gradients(model, run)
    configs = list(grid(inits, norm_positions, init.schemes))
    check_memory(model, init, run, configs, backward=grads, n_layers=max(depths), here=False)
    check_configs(model, init, run, configs, depths)
    points = [
        Point(
            _depth_sweep_runner,
            {"n_layers": L, "seed": seed_configs(init, run, i)[0].seed, "init": recipe, "norm_position": pos},
            {"model": model, "init": init, "run": run, "n_layers": L, "seed_index": i, "inits": (recipe,),
             "norm_positions": (pos,), "grads": grads},
        )  # fmt: skip
        for L in depths
        for i in range(seeds)
        for recipe, pos in configs
    ]

    def gather(frames: dict[str, Frames]) -> Frames:
        done = [frames[p.name]["depth_sweep"] for p in points if p.name in frames]
        rows = [r for f in done for r in f.to_dict("records")]
        return assemble(rows, configs, model, init, ref)

    meta = _grid_meta(
        dataclasses.replace(model, n_layers=max(depths)), init, run, configurations=configs,
        layers=list(depths), seeds=seeds, seed_values=[init.seed + i for i in range(seeds)], grads=grads,
        transfer_from=ref,
    )  # fmt: skip
    return Plan("depth-sweep", points, gather, meta,
                not_applicable(grads and model.branch == "model", init.schemes, model))  # fmt: skip


def _concat_plan(command: str, runner: Callable[..., ExperimentResult], stems: Sequence[str], model, init,
                 run, inits, norm_positions, na: dict | None = None, backward: bool = False,
                 **kwargs) -> Plan:  # fmt: skip
    """A command whose frames are its configurations' frames one after the other."""
    configs = list(grid(inits, norm_positions, init.schemes))
    check_memory(model, init, run, configs, backward, here=False)  # (each point checks where it runs)
    check_configs(model, init, run, configs)
    points = [
        Point(runner, {"n_layers": model.n_layers, "seed": init.seed, "init": recipe, "norm_position": pos},
              {"model": model, "init": init, "run": run, "inits": (recipe,), "norm_positions": (pos,),
               **kwargs})  # fmt: skip
        for recipe, pos in configs
    ]

    def gather(frames: dict[str, Frames]) -> Frames:
        done = [frames[p.name] for p in points if p.name in frames]
        if not done:
            return {s: pd.DataFrame() for s in stems}
        return {s: pd.concat([f[s] for f in done], ignore_index=True) for s in stems}

    meta = _grid_meta(model, init, run, configurations=configs, **kwargs)
    return Plan(command, points, gather, meta, na or {})


def variance_plan(model, init, run, inits, norm_positions) -> Plan:
    """``variance`` as one point per (init, norm position)."""
    stems = ("variance", "summary")
    return _concat_plan("variance", run_variance, stems, model, init, run, inits, norm_positions,
                        VARIANCE_NOT_APPLICABLE)  # fmt: skip


def grad_norms_plan(model, init, run, inits, norm_positions, batches: int = 1) -> Plan:
    """``grad-norms`` as one point per (init, norm position)."""
    require_gradients(model, run)
    plan = _concat_plan(
        "grad-norms", run_grad_norms, ("grad_norms", "stream_grads", "summary"), model, init, run, inits,
        norm_positions, backward=True, batches=batches,
    )  # fmt: skip
    # the single run's rules, from the gathered frames (which configurations pass no gradient)
    plan.not_applicable = lambda frames: grad_norms_not_applicable(model, frames["grad_norms"])
    return plan


def coord_check_plan(
    model: ModelConfig, init: InitConfig, run: RunConfig, coord: coord_check.CoordConfig,
    inits: Sequence[str], norm_positions: Sequence[str] | None, widths: Sequence[int],
    depths: Sequence[int], seeds: int, d_ff: int | None = None,
) -> Plan:  # fmt: skip
    """``coord-check`` as one point per training run (scheme, norm position, depth,
    width, seed), in the single run's order; gathering is the single run's
    (:func:`tinit.experiments.training.coord_check.gather`: concatenate, then fit)."""
    g = coord_check.make_grid(model, init, run, inits, norm_positions, widths, depths, seeds, d_ff, coord)
    points = [
        Point(coord_check.coord_point,
              {"d": p["d_model"], "n_layers": p["n_layers"], "seed": p["seed"], "init": p["recipe"],
               "norm_position": p["norm_position"]},
              {"model": model, "init": init, "run": run, "coord": coord, "d_ff": d_ff, **p})  # fmt: skip
        for p in g.points()
    ]

    def gather(frames: dict[str, Frames]) -> Frames:
        return coord_check.gather([frames[p.name]["coord_check"] for p in points if p.name in frames])

    big = dataclasses.replace(model, d_model=max(widths), n_layers=max(depths))
    extra = coord_check.grid_meta(g, coord, d_ff, init)
    meta = _grid_meta(big, init, run, configurations=list(g.configs), **extra)
    return Plan("coord-check", points, gather, meta, coord_check.NOT_APPLICABLE)


def lr_sweep_plan(
    model: ModelConfig, init: InitConfig, run: RunConfig, train, data_args: dict, floor: float | None,
    schemes: Sequence[str], norm_positions: Sequence[str], depths: Sequence[int], seeds: Sequence[int],
    lrs: Sequence[float], warmups: Sequence[int], widths: Sequence[int] | None = None,
) -> Plan:  # fmt: skip
    """``lr-sweep`` as one point per training run (scheme, norm position, depth, width,
    lr, warmup, seed), in the single run's order; gathering concatenates the runs'
    frames and derives the summary, optima and drifts as the single run does
    (:func:`tinit.experiments.training.lr_sweep.gather_points`)."""
    from .training.train import check_schemes, grid_specs

    specs = grid_specs(model, init, schemes, norm_positions, depths, seeds, lrs, warmups, widths)
    check_schemes(specs, data_args["seq_len"], train.param_rules)  # before any point starts
    points = [
        Point(lr_sweep.lr_sweep_point,
              {"n_layers": s.model.n_layers, "d": s.model.d_model, "lr": f"{s.lr:g}", "warmup": s.warmup,
               "seed": s.init.seed, "init": s.init.recipe, "norm_position": s.model.norm_position},
              {"model": model, "init": init, "run": run, "train": train, "data_args": data_args, "spec": s})
        for s in specs
    ]  # fmt: skip
    per_config = len(lrs) * len(seeds)

    def gather(frames: dict[str, Frames]) -> Frames:
        done = [frames[p.name] for p in points if p.name in frames]
        return lr_sweep.gather_points(done, train, floor, per_config)

    big = dataclasses.replace(model, n_layers=max(depths))
    grid_of = {"schemes": list(schemes),
               "norm_positions": None if norm_positions is None else list(norm_positions),
               "depths": list(depths),
               "widths": list(widths or [model.d_model]), "seeds": list(seeds), "lrs": list(lrs),
               "warmups": list(warmups)}  # fmt: skip
    meta = _grid_meta(big, init, run, train=dataclasses.asdict(train), data=data_args, grid=grid_of,
                      lr_criterion=lr_sweep.LR_CRITERION)  # fmt: skip
    return Plan("lr-sweep", points, gather, meta, lr_sweep.sweep_not_applicable(train, floor, init.schemes))
