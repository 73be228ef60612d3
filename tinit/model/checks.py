"""What a configuration value may be: :class:`ConfigError` (naming the field), the bounds
a command's counts and rates are held to, and the checks the configs
(:mod:`tinit.model.config`, the training configs) and the options' parsers share.

Pure Python, no torch, no typer: the lowest floor of the configs. A config check
raises ``ConfigError(field, message)``; an option's value check (:func:`positive`,
:func:`learning_rate`, ...) raises ``ValueError`` with the message the user sees, which
the CLI turns into a usage error naming the option (exit 2)."""

from __future__ import annotations

import math
from typing import Any, get_args

#: The most seeds a command runs per configuration. A mean over n seeds has a standard
#: error of sd/sqrt(n): 10,000 seeds put it at 1% of one seed's spread, finer than any
#: verdict tinit draws (each seed is a whole run, so more only costs time); and the
#: seed list, recorded in config.json, stays small.
MAX_SEEDS = 10_000
#: The largest learning rate a command takes. Adam moves every weight by about lr per
#: step, so any lr above ~1 already diverges (recorded as such, which is worth studying);
#: far beyond, the step overflows float32 (torch converts lr / (1 - beta1) to it) and the
#: run ends in an internal error instead of a divergence.
MAX_LR = 1e4
LR_WHY = "Adam moves each weight by about lr a step: above ~1 a run diverges"
#: The most batches grad-norms averages its gradients over: the average's noise falls as
#: 1/sqrt(N), 1% of one batch's at 10,000; each batch's data seed is recorded in config.json.
MAX_BATCHES = 10_000
#: The deepest model a command builds. The deepest published stacks are 1,000 layers
#: (DeepNet); past this, the per-layer rule checks and the 2L + 1 rows a run records per
#: configuration grow without bound (--layers 1e8 filled memory before any block ran).
MAX_LAYERS = 100_000
#: The most heads the large-width prediction (tinit.mf) draws per sequence at each
#: attention: its Monte Carlo error falls as 1/sqrt(draws), below 0.01% of a layer's
#: branch variance at 10,000; each draw costs about 4 T^3 multiply-adds.
MAX_MF_DRAWS = 10_000


class ConfigError(ValueError):
    """An invalid configuration value. ``field`` names the offending config field."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


def check_choice(name: str, value: Any, literal: Any) -> None:
    """``value`` is one of a ``Literal``'s arguments (or of a registry's names)."""
    allowed = tuple(literal) if isinstance(literal, dict) else get_args(literal)
    if value not in allowed:
        raise ConfigError(name, f"{value!r} is not one of {', '.join(map(repr, allowed))}")


def is_real(value: Any) -> bool:
    """A real number (int or float), not a bool (True is an int to Python)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_real(name: str, value: Any, low: float, strict: bool) -> None:
    """A finite real number above ``low`` (``strict``) or at least ``low``."""
    ok = is_real(value) and math.isfinite(value) and (value > low if strict else value >= low)
    if not ok:
        bound = f"> {low:g}" if strict else f">= {low:g}"
        raise ConfigError(name, f"must be a finite number {bound}, got {value!r}")


def check_bool(name: str, value: Any, optional: bool = False) -> None:
    if not (isinstance(value, bool) or (optional and value is None)):
        allowed = "True, False or None" if optional else "True or False"
        raise ConfigError(name, f"must be {allowed}, got {value!r}")


def check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(name, f"must be a whole number >= 1, got {value!r}")


def check_count(name: str, value: Any, most: int, least: int = 1, why: str = "") -> None:
    """A whole number in ``least..most``, checked before anything is built from it (a
    list of ``value`` items is never made first)."""
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise ConfigError(name, f"must be a whole number from {least} to {most:,}{why}, got {value!r}")


def check_lr(name: str, value: Any) -> None:
    """A learning rate: a finite number in (0, MAX_LR]."""
    if not (is_real(value) and math.isfinite(value) and 0 < value <= MAX_LR):
        raise ConfigError(name, f"must be a number > 0 and <= {MAX_LR:g} ({LR_WHY}), got {value!r}")


# --- an option's value checks (ValueError: the CLI names the option) ---


def positive(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{value} is not a positive number")
    return value


def nonneg(value: float) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{value} is not a finite number >= 0")
    return value


def sigma_value(value: str) -> float | str:
    """--sigma: a positive number, or ``inv-sqrt-d`` (1/sqrt(d))."""
    if value == "inv-sqrt-d":
        return value
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{value!r} is not a positive number or 'inv-sqrt-d'")
    return x


def on_off(value: str) -> bool:
    if value not in ("on", "off"):
        raise ValueError(f"{value!r}: give on or off")
    return value == "on"


def learning_rate(value: float) -> float:
    """A learning rate: a positive number up to :data:`MAX_LR`."""
    if not (math.isfinite(value) and 0 < value <= MAX_LR):
        raise ValueError(f"{value} is not a number > 0 and <= {MAX_LR:g} ({LR_WHY})")
    return value
