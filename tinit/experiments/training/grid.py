"""The grid of ``tinit train`` and ``lr-sweep`` and its checks before anything trains:
the grid as one value (:class:`TrainGrid`), its axes as lists of numbers
(:func:`grid_axes`), the runs they make (:func:`grid_specs`:
each scheme in its own placement unless placements are given), and :func:`check_specs`
(no repeated run, the data's vocabulary, every scheme's rules at its own shape, the
memory of the weights, their AdamW state and the per-step records)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from ...model.catalogue import placements_for
from ...model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from ...model.params import count_params
from ...model.structure import apply_scheme
from ..configs import (
    DEFAULT_PLACEMENTS,
    check_configs,
    parse_widths,
    position_list,
    scheme_list,
)
from ..memory import check_fits, least_bytes
from .data import TrainData
from .trainer import (
    RunSpec,
    TrainConfig,
)


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


@dataclasses.dataclass(frozen=True)
class TrainGrid:
    """A training grid, as ``run_train``, ``run_lr_sweep`` and ``lr_sweep_plan`` take it:
    what every run shares (the model, init, run and training configs, the data) and the
    axes it crosses, schemes x norm positions x depths x widths x lrs x warmups x seeds
    (``norm_positions`` None: each scheme in its own placement; ``lrs``, ``warmups``
    None: the training config's; ``widths`` None: the model's)."""

    model: ModelConfig
    init: InitConfig
    run: RunConfig
    train: TrainConfig
    data: TrainData
    schemes: Sequence[str]
    norm_positions: Sequence[str] | None
    depths: Sequence[int]
    seeds: Sequence[int]
    lrs: Sequence[float] | None = None
    warmups: Sequence[int] | None = None
    widths: Sequence[int] | None = None

    def checked(self) -> TrainGrid:
        """The grid with its axes as lists of numbers, checked (:func:`grid_axes`)."""
        axes = grid_axes(self.model, self.init, self.train, self.schemes, self.norm_positions, self.depths,
                         self.seeds, self.lrs, self.warmups, self.widths)  # fmt: skip
        names = ("schemes", "norm_positions", "depths", "seeds", "lrs", "warmups", "widths")
        return dataclasses.replace(self, **dict(zip(names, axes, strict=True)))

    def specs(self) -> list[RunSpec]:
        """Its runs, in order (:func:`grid_specs`)."""
        return grid_specs(self.model, self.init, self.schemes, self.norm_positions, self.depths, self.seeds,
                          self.lrs, self.warmups, self.widths)  # fmt: skip

    def record(self) -> dict:
        """The axes as config.json's ``grid`` records them (a checked grid's)."""
        return {
            "schemes": list(self.schemes),
            "norm_positions": None if self.norm_positions is None else list(self.norm_positions),
            "depths": list(self.depths),
            "widths": list(self.widths or [self.model.d_model]),
            "seeds": list(self.seeds),
            "lrs": list(self.lrs),
            "warmups": list(self.warmups),
        }


def grid_axes(model: ModelConfig, init: InitConfig, train: TrainConfig, schemes, norm_positions, depths,
              seeds, lrs, warmups, widths) -> tuple:  # fmt: skip
    """The axes of a training grid as a library caller gave them, checked: schemes and
    placements (a string is a comma list, as --init reads it), depths and widths (each
    once), seeds and warmups (whole numbers >= 0), lrs (positive); lrs None: the
    config's, warmups None: the config's. A ConfigError naming the axis otherwise."""
    from ..configs import parse_layers

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
    scheme is whatever ``InitConfig.scheme`` accepts: the run only passes it on.
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
        RunSpec(shape(pos, scheme, L, d), dataclasses.replace(init, scheme=scheme, seed=seed), lr, warmup)
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
        key = (spec.model, spec.init.scheme)
        if key not in checked:
            checked.add(key)
            check_configs(spec.model, spec.init, RunConfig(seq_len=seq_len),
                          [(spec.init.scheme, spec.model.norm_position)], optimizer=rules)  # fmt: skip


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
    # every model of the grid, once: built whole, its weights, gradients and AdamW state,
    # and the least its backward holds besides on the data's batch (the tokens' streams
    # and logits: tinit.experiments.memory.least_bytes)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # (CUDA's autocast: bf16 activations)
    for model, init in {(s.model, s.init): None for s in specs}:
        n = count_params(model, init.definition).total
        embedding = model.vocab_size * model.d_model
        # the stack: its depth or its width (memory grows as L and as d^2); the embedding: the
        # data's vocabulary, unless --vocab sets it (the Markov chain)
        terms = {("n_layers", "d_model"): max(n - embedding, 0) * TRAIN_BYTES_PER_PARAM,
                 ("vocab_size",): min(embedding, n) * TRAIN_BYTES_PER_PARAM}  # fmt: skip
        least = least_bytes(model, init, data.batch, data.seq_len, dtype, backward=True)
        del least[("vocab_size", "d_model")], least[("d_model",)]  # (the weights: counted above)
        terms.update(least)
        sizes = {"n_layers": model.n_layers, "d_model": model.d_model, "vocab_size": model.vocab_size,
                 "batch": data.batch, "seq_len": data.seq_len}  # fmt: skip
        check_fits(terms, sizes, f"a model of {n:.3g} parameters (L={model.n_layers}, d={model.d_model}, "
                   f"V={model.vocab_size}) on {data.batch} x {data.seq_len} tokens needs", device,
                   blame={"vocab_size": "data" if data.chain is None else "vocab_size"},
                   purpose=" for its weights, gradients, AdamW state and activations")  # fmt: skip
    # then the per-step records (the model fits: what remains large is the number of steps)
    # (kept in host memory, and as much again for the frames made from them)
    records = sum(steps * (1 + 2 * s.model.n_layers) for s in specs) * RECORD_BYTES
    check_fits({("steps",): 2 * records}, {}, f"{steps:,} steps of {len(specs)} run{'s' * (len(specs) > 1)} "
               f"keep {records / 2**30:.3g} GiB of per-step records (a train row and two update ratios a "
               "layer): they and the frames made from them need", None, field="steps")  # fmt: skip
