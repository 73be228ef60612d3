"""Checkpoints of training runs: which steps save (``--save-steps``), and whether their
files fit the disk. The files themselves are written by the caller's ``on_checkpoint``
(:class:`tinit.results.checkpoints.CheckpointWriter`): experiments do no I/O."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ...model.config import ConfigError
from ...model.params import count_params
from .trainer import RunSpec

#: A step as --save-steps takes it: ASCII digits (int() also reads "１０", "1_000", "+5").
STEP = re.compile(r"[0-9]+")


def parse_save_steps(spec: str | Sequence[int | str] | None, steps: int) -> list[int]:
    """``"0,100,final"`` -> [0, 100, steps]: the steps at which a run saves its weights
    (0: the initialization, before the first step; ``final``: the last step). Each a
    whole number in [0, steps] written in ASCII digits, or ``final``, given once; None or
    an empty list -> [] (no checkpoints). Anything else, an empty string included (which
    saved nothing without a word), is a ConfigError naming ``save_steps`` that says what
    is allowed."""
    allowed = "give whole numbers from 0 to --steps and 'final', e.g. 0,100,final"
    if spec is None:
        return []
    items = [x.strip() for x in spec.split(",")] if isinstance(spec, str) else list(spec)
    if not items:  # (a list of no steps: the library's "none", as lr-sweep hands its runs)
        return []
    if isinstance(spec, str) and not spec.strip():
        raise ConfigError("save_steps", f"{spec!r} names no step: {allowed} (leave it out to save none)")
    out: list[int] = []
    for item in items:
        if isinstance(item, str) and item == "final":
            value = steps
        elif isinstance(item, str) and STEP.fullmatch(item):
            value = int(item)
        elif isinstance(item, int) and not isinstance(item, bool):
            value = item
        else:
            raise ConfigError("save_steps", f"{item!r} is not a step: {allowed}")
        if not 0 <= value <= steps:
            raise ConfigError("save_steps", f"step {value} is outside 0..{steps} (--steps {steps})")
        if value in out:
            raise ConfigError("save_steps", f"step {value} is given twice")
        out.append(value)
    return sorted(out)


def check_disk(specs: Sequence[RunSpec], save_steps: Sequence[int], free: int | None) -> None:
    """The checkpoints of every run (float32 weights at each save step) must fit in the
    ``free`` bytes of the run folder's file system (None: not known, not checked)."""
    need = sum(count_params(s.model, s.init.definition).total for s in specs) * 4 * len(save_steps)
    if free is not None and need > free:
        raise ConfigError("save_steps", f"{len(save_steps)} checkpoints of {len(specs)} run(s) take "
                          f"{need / 2**30:.3g} GiB, more than the {free / 2**30:.3g} GiB free on the run "
                          "folder's disk")  # fmt: skip
