"""The training configs, importable without torch: their fields carry the options that
set them (:mod:`tinit.model.flags`), which ``tinit --help`` reads. :class:`TrainConfig`
is every training command's optimizer and schedule (train, lr-sweep, claims);
:class:`CoordConfig` coord-check's few steps."""

import math
from dataclasses import dataclass, field

from ...model.checks import check_lr, learning_rate, on_off, positive
from ...model.config import ConfigError
from ...model.flags import TRAIN, Many, flag


@dataclass(frozen=True)
class TrainConfig:
    """The optimizer, schedule and bookkeeping of a training run."""

    steps: int = field(default=300, metadata=flag(
        '--steps', panel=TRAIN, min=1, help="Optimizer steps per run.",
    ))  # fmt: skip
    # peak learning rate
    lr: float = field(default=1e-2, metadata=flag(
        "--lr", panel=TRAIN, callback=learning_rate, help="Peak learning rate.",
        many=Many("lrs", "Peak learning rates, a comma list.", "1e-2,..."),
    ))  # fmt: skip
    # steps of linear warmup from lr/warmup to lr; 0: none
    warmup: int = field(default=30, metadata=flag(
        "--warmup", panel=TRAIN, min=0, help="Warmup steps: the lr rises linearly to its peak over them.",
        many=Many("warmups", "Warmup steps, a comma list.", "30,..."),
    ))  # fmt: skip
    # decoupled, on matrices only (norm gains and biases are not decayed)
    weight_decay: float = field(default=0.1, metadata=flag(
        "--weight-decay", panel=TRAIN, min=0.0, help="AdamW decoupled weight decay (matrices only).",
    ))  # fmt: skip
    min_lr_ratio: float = field(default=0.1, metadata=flag(
        "--min-lr-ratio", panel=TRAIN, min=0.0, max=1.0,
        help="Cosine decay ends at this fraction of the peak lr.",
    ))  # fmt: skip
    # AdamW's eps (torch's default); a scheme's optimizer rules scale it per group
    eps: float = field(default=1e-8, metadata=flag(
        "--adam-eps", panel=TRAIN, callback=positive,
        help="AdamW's eps, added to the root of the second moment; a scheme's optimizer rules scale it per "
        "group (completep, depth-mup: by depth; megatron-mup: / m).",
    ))  # fmt: skip
    beta1: float = 0.9
    beta2: float = 0.95
    # max global gradient norm; 0: no clipping (the norm is still recorded)
    grad_clip: float = field(default=1.0, metadata=flag(
        "--grad-clip", help="Max global gradient norm; 0: no clipping.", panel=TRAIN, min=0.0,
    ))  # fmt: skip
    eval_every: int = field(default=25, metadata=flag(
        "--eval-every", panel=TRAIN, min=1,
        help="Held-out loss every N steps (and at 0 and the last step); eval_loss is blank in train.csv "
        "elsewhere.",
    ))  # fmt: skip
    # nats above the first step's loss that mark a run diverged
    diverge_margin: float = field(default=1.0, metadata=flag(
        "--diverge-margin", panel=TRAIN, callback=positive,
        help="A run whose training loss is non-finite or exceeds its first step's loss by this many nats is "
        "stopped and marked diverged.",
    ))  # fmt: skip
    probe_points: int = field(default=3, metadata=flag(
        "--probe-points", panel=TRAIN, min=0,
        help="Variance profiles (at the 2L additions) at this many evenly spaced steps, 0 and the last "
        "included.",
    ))  # fmt: skip
    # apply the scheme's optimizer rules (muP's lr / m, ...); False: one lr
    param_rules: bool = field(default=True, metadata=flag(
        "--param-rules", type=str, default="on", panel=TRAIN, parser=on_off, metavar="on|off",
        help="on: train each scheme with its optimizer rules (mup: hidden-matrix lr / m and weight decay "
        "x m; completep, depth-mup: their depth rules and Adam eps; megatron-mup: hidden lr and eps / m; "
        "config.json records every group's lr); off: the same init with one lr. Schemes without rules (gpt2, "
        "naive, ...) train with one lr either way.",
    ))  # fmt: skip
    compile: bool = field(default=False, metadata=flag(
        "--compile/--no-compile", type=bool | None, panel=TRAIN,
        help="torch.compile the model (for long GPU runs).",
    ))  # fmt: skip
    autocast: bool = field(default=True, metadata=flag(
        "--no-autocast", param="no_autocast", negates=True, panel=TRAIN,
        help="Train in float32 on CUDA too (default: bf16 autocast on CUDA; the CPU always runs float32).",
    ))  # fmt: skip

    def __post_init__(self) -> None:
        for name in ("steps", "eval_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(name, f"must be a whole number >= 1, got {v!r}")
        for name in ("warmup", "probe_points"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(name, f"must be a whole number >= 0, got {v!r}")
        check_lr("lr", self.lr)
        for name in ("lr", "eps"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
                raise ConfigError(name, f"must be a positive number, got {v!r}")
        for name in ("beta1", "beta2"):  # Adam's moment decays: torch refuses others only at step time
            v = getattr(self, name)
            if not (isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < 1):
                raise ConfigError(name, f"must be a number in [0, 1), got {v!r}")
        if not isinstance(self.param_rules, bool):
            raise ConfigError("param_rules", f"must be true or false, got {self.param_rules!r}")
        for name in ("min_lr_ratio", "weight_decay", "grad_clip", "diverge_margin"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
                raise ConfigError(name, f"must be a finite number >= 0, got {v!r}")
        if self.min_lr_ratio > 1:
            raise ConfigError("min_lr_ratio", f"must be <= 1, got {self.min_lr_ratio}")
        if self.diverge_margin <= 0:
            raise ConfigError("diverge_margin", f"must be a positive number, got {self.diverge_margin}")


@dataclass(frozen=True)
class CoordConfig:
    """The training of a coordinate check and its data (the Markov language). Its options
    are TrainConfig's of the same names (``--steps --lr --param-rules --adam-eps``, with
    coord-check's own defaults: tinit.cli.registry)."""

    steps: int = 4  # optimizer steps; the RMS is recorded at steps 0..N
    lr: float = 1e-2  # constant Adam lr (mup's Transformer example checks Adam at 0.01)
    param_rules: bool = True  # the scheme's optimizer rules (per-group lr); off: one lr ("on"/"off" too)
    eps: float = 1e-8  # AdamW's eps, scaled per group by the scheme's rules
    markov_k: int = 4  # successors per token of the Markov language

    def __post_init__(self) -> None:
        if self.param_rules in ("on", "off"):  # as --param-rules says it
            object.__setattr__(self, "param_rules", self.param_rules == "on")
        if not isinstance(self.param_rules, bool):
            raise ConfigError("param_rules", f"must be True or False ('on', 'off'), got {self.param_rules!r}")
        if isinstance(self.markov_k, bool) or not isinstance(self.markov_k, int) or self.markov_k < 1:
            raise ConfigError("markov_k", f"must be a whole number >= 1, got {self.markov_k!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ConfigError("steps", f"must be a whole number >= 1, got {self.steps!r}")
        check_lr("lr", self.lr)
        eps = self.eps
        if isinstance(eps, bool) or not (isinstance(eps, int | float) and math.isfinite(eps) and eps > 0):
            raise ConfigError("eps", f"must be a positive number, got {self.eps!r}")
