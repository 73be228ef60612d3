"""The generic types of a measuring command's grid as independent points, and the
gathering of the points' frames into the command's frames. Each sweepable command's
plan and point function live in its experiment module (``variance_plan`` in
``measure/variance.py``, ...); :func:`tinit.experiments.driver.run_plan` runs a plan in
this process, :mod:`tinit.sweep` on local workers or SLURM: one grid path.

A :class:`Point` is one (depth, seed, init scheme, norm position) of a grid: the
configs and arguments of one call of the command's experiment restricted to it. Its
numbers are determined by those arguments alone (weights are drawn per seed, layer
and role, tokens per seed, and no configuration's draws depend on another's), so a
point gives the same numbers in any process, on any host. A :class:`Plan` lists a
command's points and gathers their frames: gathering every point's frames gives the
frames of the single-process run of the command with the same options.

No I/O here: :mod:`tinit.sweep` runs the points and writes them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..model.config import InitConfig, ModelConfig, RunConfig
from .configs import check_configs, grid, structure_meta
from .memory import check_memory
from .result import ExperimentResult, Progress

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


def run_point(point: Point, progress: Progress | None = None) -> ExperimentResult:
    """Measure one point (raises what its experiment raises). A user's scheme travels
    inside the point's InitConfig (``init.schemes``): no registry to fill first."""
    return point.run(**point.kwargs, progress=progress)


def grid_meta(model: ModelConfig, init: InitConfig, run: RunConfig, **extra: Any) -> dict[str, Any]:
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


def concat_plan(command: str, runner: Callable[..., ExperimentResult], stems: Sequence[str], model, init,
                run, inits, norm_positions, na: dict | None = None, backward: bool = False,
                **kwargs) -> Plan:  # fmt: skip
    """A command whose frames are its configurations' frames one after the other."""
    configs = list(grid(inits, norm_positions, init.schemes))
    check_memory(model, init, run, configs, backward, here=False)  # (each point checks where it runs)
    check_configs(model, init, run, configs)
    points = [
        Point(
            runner,
            {"n_layers": model.n_layers, "seed": init.seed, "init": scheme, "norm_position": pos},
            {
                "model": model,
                "init": init,
                "run": run,
                "inits": (scheme,),
                "norm_positions": (pos,),
                **kwargs,
            },
        )  # fmt: skip
        for scheme, pos in configs
    ]

    def gather(frames: dict[str, Frames]) -> Frames:
        done = [frames[p.name] for p in points if p.name in frames]
        if not done:
            return {s: pd.DataFrame() for s in stems}
        return {s: pd.concat([f[s] for f in done], ignore_index=True) for s in stems}

    meta = grid_meta(model, init, run, configurations=configs, **kwargs)
    return Plan(command, points, gather, meta, na or {})
