"""What the training commands (train, lr-sweep, claims) share after parsing: their lists
of values, the data and the model's vocabulary, the training config, the grid and its
title. (Not a command module: the commands import it, never each other.)"""

import math
from typing import TYPE_CHECKING

import typer

from ..model.checks import LR_WHY, MAX_LR
from ..model.config import ConfigError
from .configs import Options, configs_or_exit

if TYPE_CHECKING:
    from ..experiments.training.trainer import TrainConfig


def checkpointing(opts: Options):
    """--save-steps: (the steps, ``run_dir -> on_checkpoint``: a CheckpointWriter into the
    run folder, or None without steps). A bad list exits 2 naming --save-steps."""
    from ..experiments.training.saving import parse_save_steps
    from ..results.checkpoints import CheckpointWriter

    saves = configs_or_exit(lambda: parse_save_steps(opts.values.get("save_steps"), opts.steps))
    return saves, (lambda run_dir: CheckpointWriter(run_dir) if saves else None)


def checkpoint_text(result) -> list:
    """The terminal's line sizing the checkpoints written (none: no line)."""
    from rich.text import Text

    from ..results.checkpoints import checkpoint_lines

    return [Text(line) for line in checkpoint_lines(result.meta.get("checkpoints", []))]


def floats(value: str, option: str, most: float = math.inf, why: str = "") -> list[float]:
    """A comma list of positive numbers up to ``most``, each once."""
    try:
        out = [float(v) for v in str(value).split(",")]
    except ValueError:
        out = []
    if not out or not all(math.isfinite(v) and 0 < v <= most for v in out):
        upto = f" <= {most:g}{why}" if math.isfinite(most) else ""
        raise typer.BadParameter(
            f"{value!r}: give a comma list of positive numbers{upto}", param_hint=f"'{option}'"
        )
    return _once(out, value, option)


def ints(value: str, option: str) -> list[int]:
    """A comma list of whole numbers >= 0, each once."""
    try:
        out = [int(v) for v in str(value).split(",")]
    except ValueError:
        out = []
    if not out or any(v < 0 for v in out):
        raise typer.BadParameter(
            f"{value!r}: give a comma list of whole numbers >= 0", param_hint=f"'{option}'"
        )
    return _once(out, value, option)


def _once(values: list, text: str, option: str) -> list:
    """The values, each once: a repeated one would run twice and be counted as a seed."""
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise typer.BadParameter(
            f"{text!r}: {', '.join(f'{v:g}' for v in repeated)} is given twice; give each value once "
            "(--seeds N for repeated runs)", param_hint=f"'{option}'",
        )  # fmt: skip
    return values


def warmups_within(opts: Options, warmups: list[int], steps: int) -> list[int]:
    """The warmups, each reaching its peak lr by the last step (a warmup of w steps reaches
    it at step w): a --warmup longer than --steps is refused (the lr it reports as the peak
    would never be reached); the default warmup of a shorter run is cut to --steps."""
    long = [w for w in warmups if w > steps]
    if long and (opts.given("warmups") or opts.given("warmup")):
        raise typer.BadParameter(
            f"{long[0]} is longer than --steps {steps}: the peak lr would never be reached; give a "
            f"warmup <= {steps}", param_hint="'--warmup'",
        )  # fmt: skip
    return list(dict.fromkeys(min(w, steps) for w in warmups))


def parse_widths(opts: Options) -> list[int]:
    """lr-sweep's and coord-check's --d-model: the width axis (the library's parser), each
    width divisible by --heads; a list takes each width's default FFN width (so --d-ff
    goes with one width only; a --preset's d_ff, not given by the user, is left to the
    caller to drop)."""
    from ..experiments.configs import parse_widths as width_axis

    out = configs_or_exit(lambda: width_axis(opts.widths))
    bad = [w for w in out if w % opts.n_heads]
    if bad:
        raise typer.BadParameter(f"{bad[0]} is not divisible by --heads {opts.n_heads}",
                                 param_hint="'--d-model'")  # fmt: skip
    if len(out) > 1 and opts.d_ff is not None and (opts.ctx is None or opts.given("d_ff")):
        raise typer.BadParameter("a list of widths takes each width's default FFN width; leave --d-ff out",
                                 param_hint="'--d-ff'")  # fmt: skip
    return out


def rules_notes(opts: Options) -> list[str]:
    """The terminal's lines on the optimizer rules each scheme trained with."""
    import dataclasses

    from ..model.param_rules import rules_summary

    init = opts.init_config()
    on = bool(opts.values.get("param_rules", True))
    lines = [rules_summary(dataclasses.replace(init, scheme=name), on) for name in opts.inits]
    return ["Optimizer rules (config.json: param_groups, per run):", *(f"  {x}" for x in lines)]


def data_args(opts: Options) -> dict:
    """The arguments of ``load_data`` (what a sweep's point reloads the data from)."""
    return {
        "source": opts.data,
        "vocab": opts.vocab_size,
        "seq_len": opts.seq_len,
        "batch": opts.batch,
        "seed": opts.seed,
        "eval_batches": opts.eval_batches,
        "markov_k": opts.markov_k,
    }


def train_config(opts: Options, lr: float, warmup: int) -> "TrainConfig":
    """The optimizer and schedule: the training options by field name, at this lr and warmup."""
    from ..experiments.training.trainer import TrainConfig

    return opts.config(TrainConfig, lr=lr, warmup=warmup)


def data_for(opts: Options):
    """Load the data (a ConfigError names --data); the model's vocabulary follows it
    for bytes and token files."""
    from ..experiments.training.data import load_data

    return load_data(**data_args(opts))


def model_vocab(opts: Options, data) -> int:
    """The model's vocabulary: the data's (the Markov language's is --vocab; a file's is
    its largest token id + 1, bytes 256), or --vocab when given and at least that (the
    model then has rows the data never uses)."""
    if data.chain is not None or not opts.given("vocab_size"):
        return data.vocab
    if opts.vocab_size < data.vocab:
        tokens = data.info.get("format") in ("npy", "uint16 bin")
        why = "its largest token id + 1" if tokens else "bytes"
        raise ConfigError("vocab_size", f"{opts.vocab_size} is less than the data's vocabulary, {data.vocab} "
                          f"({why}); leave --vocab out to use that")  # fmt: skip
    return opts.vocab_size


def grid(opts: Options, widths: list[int] | None = None):
    """The grid run_train / run_lr_sweep train (at ``widths``; None: the model's) and the
    runs' title."""
    from ..experiments.configs import parse_layers
    from ..experiments.training.grid import TrainGrid

    lrs = floats(opts.lrs, "--lr", MAX_LR, f" ({LR_WHY})")
    warmups = ints(opts.warmups, "--warmup")
    warmups = warmups_within(opts, warmups, opts.steps)
    depths = configs_or_exit(lambda: parse_layers(opts.layers))

    def build():
        data = data_for(opts)
        model = opts.model_config(n_layers=depths[-1], vocab_size=model_vocab(opts, data))
        init = opts.init_config()
        return data, model, init, opts.run_config(seeds=opts.seeds), train_config(opts, lrs[0], warmups[0])

    data, model, init, run, tcfg = configs_or_exit(build)
    seed_list = list(range(opts.seed, opts.seed + opts.seeds))
    # norm positions: the user's, else each scheme its own placement (pre and post when it has none)
    axes = (opts.inits, opts.placements, depths, seed_list, lrs, warmups, widths)
    return TrainGrid(model, init, run, tcfg, data, *axes), describe(opts, model, data, tcfg)


def describe(opts: Options, model, data, train: "TrainConfig") -> str:
    src = data.info.get("source")
    return (
        f"{src} data (V={data.vocab}), d={model.d_model}, heads={model.n_heads}, {model.norm}, {model.ffn}, "
        f"batch {opts.batch} x seq {opts.seq_len}, {train.steps} steps"
    )


def variance_figure(result, title: str) -> dict:
    """variance_during_training.png when any profile was recorded (--probe-points > 0)."""
    from ..results.plot_train import plot_variance_during_training

    variance = result.frames.get("variance_during_training")
    if variance is None or not len(variance):
        return {}
    return {"variance_during_training": plot_variance_during_training(variance, title)}
