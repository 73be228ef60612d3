"""``tinit train``, ``tinit lr-sweep`` and ``tinit claims``: training runs of tinit's
model, from the same options and the same ``--init`` schemes as the measurements at
initialization."""

import dataclasses
import functools
import inspect
import math
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..model.config import ConfigError
from . import app
from .clickcompat import ParameterSource, get_current_context
from .options import FIELD_OPTIONS, MODEL, SharedOptions, shared_options

if TYPE_CHECKING:
    from ..experiments.training.train import TrainConfig

TRAIN, DATA = "Training", "Data"

#: Small enough for a 2-core CPU: a 4-layer, d=48 model on a 64-token Markov language
#: reaches its entropy floor in 300 steps of 16 x 32 tokens (seconds per run).
CPU_DEFAULTS = {"d_model": 48, "heads": 4, "vocab": 64, "seq_len": 32, "batch": 16}
#: Training runs choose these themselves (float32 master weights, held blocks, model branches).
NOT_FOR_TRAINING = ("dtype", "stream", "branch", "branch_var")


def _floats(value: str, option: str) -> list[float]:
    try:
        out = [float(v) for v in str(value).split(",")]
    except ValueError:
        out = []
    if not out or not all(math.isfinite(v) and v > 0 for v in out):
        raise typer.BadParameter(
            f"{value!r}: give a comma list of positive numbers", param_hint=f"'{option}'"
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


def _ints(value: str, option: str) -> list[int]:
    try:
        out = [int(v) for v in str(value).split(",")]
    except ValueError:
        out = []
    if not out or any(v < 0 for v in out):
        raise typer.BadParameter(
            f"{value!r}: give a comma list of whole numbers >= 0", param_hint=f"'{option}'"
        )
    return _once(out, value, option)


#: Config fields of the training commands -> their options (the shared ones are in FIELD_OPTIONS).
TRAIN_FIELDS = {
    "data": "--data", "markov_k": "--markov-k", "eval_batches": "--eval-batches", "steps": "--steps",
    "lr": "--lr", "warmup": "--warmup", "min_lr_ratio": "--min-lr-ratio", "weight_decay": "--weight-decay",
    "grad_clip": "--grad-clip", "eval_every": "--eval-every", "diverge_margin": "--diverge-margin",
    "probe_points": "--probe-points", "shallow": "--shallow", "deep": "--deep", "seeds": "--seeds",
    "high_lr": "--high-lr", "tol": "--tol", "n_layers": "--layers", "param_rules": "--param-rules",
    "eps": "--adam-eps",
}  # fmt: skip


def configs_or_exit(build):
    """Call ``build``; a ConfigError becomes a one-line usage error naming the option."""
    try:
        return build()
    except ConfigError as exc:
        hint = TRAIN_FIELDS.get(exc.field) or FIELD_OPTIONS.get(exc.field, exc.field)
        raise typer.BadParameter(exc.message, param_hint=f"'{hint}'") from None


def _positive(value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"{value} is not a positive number")
    return value


def _on_off(value: str) -> str:
    if value not in ("on", "off"):
        raise typer.BadParameter(f"{value!r}: give on or off")
    return value


def _o(*decls, help, panel=TRAIN, **kw):
    return typer.Option(*decls, help=help, rich_help_panel=panel, show_default=True, **kw)


#: Options every training command takes: name -> (annotation, default).
TRAIN_OPTIONS: dict[str, tuple[Any, Any]] = {
    "data": (
        Annotated[
            str,
            _o(
                "--data",
                help="markov: a seeded sparse Markov chain with an exact entropy rate (--vocab "
                "tokens, --markov-k successors each); stdlib: the Python standard library's .py files "
                "as bytes (vocab 256); or a FILE: text (bytes), .npy tokens or raw uint16 .bin "
                "(nanoGPT), memory-mapped. The last 10% of a file is held out.",
                panel=DATA,
                metavar="markov|stdlib|FILE",
            ),
        ],
        "markov",
    ),
    "markov_k": (
        Annotated[
            int, _o("--markov-k", help="Successors per token of the Markov language.", panel=DATA, min=1)
        ],
        4,
    ),
    "eval_batches": (
        Annotated[
            int, _o("--eval-batches", help="Held-out batches per evaluation (fixed set).", panel=DATA, min=1)
        ],
        4,
    ),
    "steps": (Annotated[int, _o("--steps", help="Optimizer steps per run.", min=1)], 300),
    "weight_decay": (
        Annotated[float, _o("--weight-decay", help="AdamW decoupled weight decay (matrices only).", min=0.0)],
        0.1,
    ),
    "min_lr_ratio": (
        Annotated[
            float,
            _o("--min-lr-ratio", help="Cosine decay ends at this fraction of the peak lr.", min=0.0, max=1.0),
        ],
        0.1,
    ),
    "grad_clip": (
        Annotated[float, _o("--grad-clip", help="Max global gradient norm; 0: no clipping.", min=0.0)],
        1.0,
    ),
    "eval_every": (
        Annotated[
            int,
            _o(
                "--eval-every",
                help="Held-out loss every N steps (and at 0 and the last "
                "step); eval_loss is blank in train.csv elsewhere.",
                min=1,
            ),
        ],
        25,
    ),
    "diverge_margin": (
        Annotated[
            float,
            _o(
                "--diverge-margin",
                help="A run whose training loss is non-finite or "
                "exceeds its first step's loss by this many nats is stopped and marked diverged.",
                callback=_positive,
            ),
        ],
        1.0,
    ),
    "probe_points": (
        Annotated[
            int,
            _o(
                "--probe-points",
                help="Variance profiles (at the 2L additions) at this "
                "many evenly spaced steps, 0 and the last included.",
                min=0,
            ),
        ],
        3,
    ),
    "param_rules": (
        Annotated[
            str,
            _o(
                "--param-rules",
                help="on: apply each scheme's optimizer rules (mup: hidden-matrix lr / m; completep, "
                "depth-mup: their depth rules and Adam eps; megatron-mup: lr and eps / m); off: the same "
                "init trained with one lr. Schemes without rules (gpt2, naive, ...) train with one lr "
                "either way.",
                metavar="on|off",
                callback=_on_off,
            ),
        ],
        "on",
    ),
    "compile": (
        Annotated[bool, _o("--compile", help="torch.compile the model (for long GPU runs).")],
        False,
    ),
    "no_autocast": (
        Annotated[
            bool,
            _o(
                "--no-autocast",
                help="Train in float32 on CUDA too (default: bf16 "
                "autocast on CUDA; the CPU always runs float32).",
            ),
        ],
        False,
    ),
}


def train_options(*, defaults: dict[str, Any] | None = None):
    """Add :data:`TRAIN_OPTIONS` to a command; its body receives them as ``topts`` (a dict)."""
    defaults = defaults or {}

    def wrap(func):
        sig = inspect.signature(func)
        own = [p for p in sig.parameters.values() if p.name != "topts"]
        added = [
            inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=defaults.get(n, d), annotation=a)
            for n, (a, d) in TRAIN_OPTIONS.items()
        ]

        @functools.wraps(func)
        def command(**kwargs):
            topts = {n: kwargs.pop(n) for n in TRAIN_OPTIONS}
            return func(topts=topts, **kwargs)

        command.__signature__ = sig.replace(parameters=own + added)
        return command

    return wrap


def train_config(topts: dict, lr: float, warmup: int) -> "TrainConfig":
    from ..experiments.training.train import TrainConfig

    return TrainConfig(
        steps=topts["steps"],
        lr=lr,
        warmup=warmup,
        min_lr_ratio=topts["min_lr_ratio"],
        weight_decay=topts["weight_decay"],
        grad_clip=topts["grad_clip"],
        eval_every=topts["eval_every"],
        diverge_margin=topts["diverge_margin"],
        probe_points=topts["probe_points"],
        param_rules=topts["param_rules"] == "on",
        autocast=not topts["no_autocast"],
        compile=topts["compile"],
    )


def data_args(opts: SharedOptions, topts: dict) -> dict:
    """The arguments of ``load_data`` (what a sweep's point reloads the data from)."""
    return {"source": topts["data"], "vocab": opts.vocab, "seq_len": opts.seq_len, "batch": opts.batch,
            "seed": opts.seed, "eval_batches": topts["eval_batches"], "markov_k": topts["markov_k"]}


def data_for(opts: SharedOptions, topts: dict):
    """Load the data (a ConfigError names --data); the model's vocabulary follows it
    for bytes and token files."""
    from ..experiments.training.data import load_data

    return load_data(**data_args(opts, topts))


def model_vocab(opts: SharedOptions, data) -> int:
    """The model's vocabulary: the data's (the Markov language's is --vocab; a file's is
    its largest token id + 1, bytes 256), or --vocab when given and at least that (the
    model then has rows the data never uses)."""
    ctx = get_current_context(silent=True)
    source = ctx.get_parameter_source("vocab") if ctx is not None else None
    if data.chain is not None or source in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP):
        return data.vocab
    if opts.vocab < data.vocab:
        tokens = data.info.get("format") in ("npy", "uint16 bin")
        why = "its largest token id + 1" if tokens else "bytes"
        raise ConfigError("vocab_size", f"{opts.vocab} is less than the data's vocabulary, {data.vocab} "
                          f"({why}); leave --vocab out to use that")  # fmt: skip
    return opts.vocab


def _setup(opts: SharedOptions, topts: dict, layers: str, lrs: list[float], warmups: list[int], **extra):
    from ..experiments.measure.depth_sweep import parse_layers

    depths = configs_or_exit(lambda: parse_layers(layers))

    def build():
        data = data_for(opts, topts)
        model = opts.model_config(n_layers=depths[-1], vocab_size=model_vocab(opts, data))
        return (
            data,
            model,
            opts.init_config(),
            opts.run_config(**extra),
            train_config(topts, lrs[0], warmups[0]),
        )

    data, model, init, run, train = configs_or_exit(build)
    return depths, data, model, init, run, train


def _grid(opts: SharedOptions, topts: dict, layers: str, lr: str, warmup: str, seeds: int):
    """The arguments of run_train / run_lr_sweep before ``progress`` (model, init, run,
    training config, data, schemes, norm positions, depths, seeds, lrs, warmups), the
    data and the runs' title."""
    lrs, warmups = _floats(lr, "--lr"), _ints(warmup, "--warmup")
    depths, data, model, init, run, tcfg = _setup(opts, topts, layers, lrs, warmups, seeds=seeds)
    seed_list = list(range(opts.seed, opts.seed + seeds))
    grid = (model, init, run, tcfg, data, opts.inits, opts.norm_positions, depths, seed_list, lrs, warmups)
    return grid, data, _describe(opts, model, data, tcfg)


def _describe(opts: SharedOptions, model, data, train: "TrainConfig") -> str:
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


LAYERS_HELP = "Depths: a comma list (4,8,24), start:stop:step, or start:stop:xFACTOR."


def rules_notes(opts: SharedOptions, topts: dict) -> list[str]:
    """The terminal's lines on the optimizer rules each scheme trained with."""
    from ..model.param_rules import rules_summary

    init = opts.init_config()
    on = topts["param_rules"] == "on"
    lines = [rules_summary(dataclasses.replace(init, recipe=name), on) for name in opts.inits]
    return ["Optimizer rules (config.json: param_groups per run):", *(f"  {x}" for x in lines)]


def _widths(value: str, opts: SharedOptions) -> list[int]:
    """--d-model of lr-sweep: a comma list of widths, each divisible by --heads."""
    try:
        out = [int(v) for v in str(value).split(",")]
    except ValueError:
        out = []
    if not out or any(v < 1 for v in out):
        raise typer.BadParameter(f"{value!r}: give a comma list of whole numbers >= 1",
                                 param_hint="'--d-model'")  # fmt: skip
    bad = [w for w in out if w % opts.heads]
    if bad:
        raise typer.BadParameter(f"{bad[0]} is not divisible by --heads {opts.heads}",
                                 param_hint="'--d-model'")  # fmt: skip
    if len(out) > 1 and opts.d_ff is not None:
        raise typer.BadParameter("a list of widths takes each width's default FFN width; leave --d-ff out",
                                 param_hint="'--d-ff'")  # fmt: skip
    return _once(out, value, "--d-model")


@app.command("train", short_help="Train the grid schemes x norm positions x depths x seeds x lrs x warmups.")
@shared_options(exclude=("layers", *NOT_FOR_TRAINING), defaults=CPU_DEFAULTS)
@train_options()
def train(
    *,
    opts: SharedOptions,
    topts: dict,
    layers: Annotated[str, _o("--layers", "-L", help=LAYERS_HELP, panel=MODEL)] = "4",
    seeds: Annotated[
        int,
        _o(
            "--seeds",
            help="Seeds per configuration: --seed, --seed+1, ... (init and "
            "batch order re-drawn; the data stays that of --seed).",
            min=1,
        ),
    ] = 1,
    lr: Annotated[str, _o("--lr", help="Peak learning rates, a comma list.", metavar="1e-2,...")] = "1e-2",
    warmup: Annotated[str, _o("--warmup", help="Warmup steps, a comma list.", metavar="30,...")] = "30",
) -> None:
    """Train tinit's model with AdamW (linear warmup, cosine decay, gradient clipping) over
    the grid --init schemes x norm positions x --layers x --lr x --warmup x --seeds, on
    held weights.

    Writes train.csv (per step: configuration, step, tokens, lr, train loss, eval loss
    every --eval-every, grad norm, status), update_ratios.csv (per step and layer,
    ||dW||/||W|| of W_O and W_down), variance_during_training.csv, runs.csv, summary.csv
    (final eval loss mean and SE over seeds, diverged count, tokens/s), loss_curves.png,
    final_vs_depth.png and config.json.
    """
    from ..experiments.training.train import run_train
    from ..results.plot_train import plot_final_vs_depth, plot_loss_curves, train_table
    from .runner import Outputs, execute

    grid, data, title = _grid(opts, topts, layers, lr, warmup, seeds)
    execute(
        "train",
        opts,
        lambda progress, on_partial=None: run_train(*grid, progress, on_partial),
        Outputs(
            figures=lambda r: {
                "loss_curves": plot_loss_curves(r["train"], data.floor, title),
                "final_vs_depth": plot_final_vs_depth(r["summary"], data.floor, title),
                **variance_figure(r, title),
            },
            tables=lambda r: [train_table(r["summary"], f"tinit train ({title})")],
            notes=rules_notes(opts, topts),
        ),
    )


@app.command("lr-sweep", short_help="Final loss against log2 lr per depth and width: does the optimum move?")
@shared_options(exclude=("layers", "d_model", *NOT_FOR_TRAINING), defaults={**CPU_DEFAULTS, "init": "scaled"})
@train_options(defaults={"steps": 200})
def lr_sweep(
    *,
    opts: SharedOptions,
    topts: dict,
    layers: Annotated[str, _o("--layers", "-L", help=LAYERS_HELP, panel=MODEL)] = "2,4,8",
    d_model: Annotated[
        str,
        _o("--d-model", help="Widths d_model: a comma list (64,128,256); each takes its default FFN width.",
           panel=MODEL, metavar="48,..."),
    ] = str(CPU_DEFAULTS["d_model"]),
    seeds: Annotated[int, _o("--seeds", help="Seeds per configuration.", min=1)] = 1,
    lr: Annotated[
        str, _o("--lr", help="Peak learning rates, a comma list.", metavar="1e-3,...")
    ] = "1e-3,3e-3,1e-2,3e-2",
    warmup: Annotated[str, _o("--warmup", help="Warmup steps, a comma list.", metavar="30,...")] = "30",
) -> None:
    """Sweep the peak learning rate at several depths and widths: final held-out loss
    against log2 lr, one curve per depth and width, each seed's optimum lr* (parabola
    through the best grid point and its neighbours), and the drift of log2 lr* along
    width (at each depth) and depth (at each width): the mean of the per-seed
    least-squares slopes d log2 lr* / d log2 x with its standard error over seeds, and a
    verdict (transfers / drifts / not resolved) that states its criterion. 0 means the
    optimum transfers: the muP (width) and CompleteP (depth) question. With several
    schemes, lr_drift_compare.csv says whose optimum moves less, or that the seeds do not
    resolve it. Schemes train with their optimizer rules (--param-rules).

    Writes the files of `tinit train` plus lr_optimum.csv (seed-mean curves),
    lr_optimum_seeds.csv, lr_drift.csv, lr_drift_compare.csv, lr_sweep.png and
    lr_transfer.png (lr* against width and depth, error bars over seeds).
    """
    from ..experiments.training.lr_sweep import run_lr_sweep
    from ..results.plot_lr_transfer import drift_tables, plot_lr_transfer
    from ..results.plot_train import plot_loss_curves, plot_lr_sweep, train_table
    from .runner import Outputs, execute

    widths = _widths(d_model, opts)
    opts = dataclasses.replace(opts, d_model=widths[0])
    grid, data, title = _grid(opts, topts, layers, lr, warmup, seeds)
    for w in widths[1:]:  # every width a valid model (heads, RoPE's even head size)
        configs_or_exit(lambda w=w: opts.model_config(d_model=w))
    if len(widths) > 1:
        title = title.replace(f"d={widths[0]}", f"d={','.join(map(str, widths))}")

    def figures(r) -> dict:
        import pandas as pd

        drift = r.frames.get("lr_drift", pd.DataFrame(columns=["init", "norm_position", "warmup", "slope"]))
        out = {"lr_sweep": plot_lr_sweep(r["summary"], r["lr_optimum"], drift, data.floor, title)}
        if "lr_drift" in r.frames:
            lrs = [float(v) for v in r["runs"]["peak_lr"]]
            out["lr_transfer"] = plot_lr_transfer(r["lr_optimum_seeds"], drift, title, (min(lrs), max(lrs)))
        out["loss_curves"] = plot_loss_curves(r["train"], data.floor, title)
        return {**out, **variance_figure(r, title)}

    def plan():
        from ..experiments.points import lr_sweep_plan

        model, init, run, tcfg, _data, *axes = grid
        return lr_sweep_plan(model, init, run, tcfg, data_args(opts, topts), data.floor, *axes, widths)

    execute(
        "lr-sweep",
        opts,
        lambda progress, on_partial=None: run_lr_sweep(*grid, progress, on_partial, widths),
        Outputs(
            figures=figures,
            tables=lambda r: [train_table(r["summary"], f"tinit lr-sweep ({title})"),
                              *drift_tables(r.frames)],
            notes=rules_notes(opts, topts),
        ),
        plan=plan,
    )


#: claims chooses these per claim (depths, schemes and their base sizes, norm positions and
#: kinds, FFN, tying): a user's scheme (--init-file) has no claim to test
CHOSEN_BY_CLAIMS = ("layers", "init", "init_file", "base_width", "base_depth", "pre_norm", "post_norm",
                    "norm_position", "norm", "ffn", "d_ff", "untie")  # fmt: skip


@app.command("claims", short_help="The init primer's training claims, each over seeds, with a verdict.")
@shared_options(exclude=(*CHOSEN_BY_CLAIMS, *NOT_FOR_TRAINING), defaults=CPU_DEFAULTS)
@train_options(defaults={"steps": 200})
def claims(
    *,
    opts: SharedOptions,
    topts: dict,
    shallow: Annotated[int, _o("--shallow", help="Layers of the small model.", min=1)] = 4,
    deep: Annotated[int, _o("--deep", help="Layers of the deep stacks.", min=1)] = 24,
    seeds: Annotated[
        int, _o("--seeds", help="Seeds per configuration (>= 2: each verdict needs a standard error).", min=2)
    ] = 5,
    lr: Annotated[float, _o("--lr", help="Ordinary peak lr.", callback=_positive)] = 1e-2,
    warmup: Annotated[
        int, _o("--warmup", help="Ordinary warmup steps (and the unstable setting's comparison).", min=0)
    ] = 50,
    high_lr: Annotated[
        float, _o("--high-lr", help="The deliberately unstable peak lr.", callback=_positive)
    ] = 1.5e-2,
    tol: Annotated[
        float, _o("--tol", help="Smallest final-loss difference that counts (nats).", callback=_positive)
    ] = 0.02,
) -> None:
    """Test the init primer's claims about training, each over --seeds seeds: deep post-norm
    needs warmup at a high lr; pre-norm trains the same deep stack without it; naive init
    falls behind the depth-scaled one at depth, which transfers from --shallow to --deep;
    RMSNorm loses nothing against LayerNorm; SwiGLU beats GELU at equal parameters; tying
    helps a small model. Each verdict (holds / fails / inconclusive) states its criterion
    (difference against 2 standard errors and --tol). A failing claim is a finding, not an
    error: the command exits 0 once every run is done.

    Writes claims.csv, claims.md, claims.png, claims_deep_curves.png,
    claims_shallow_curves.png, the files of `tinit train` and config.json.
    """
    from ..experiments.training.claims import ClaimsConfig, run_claims
    from ..results.plot_train import claims_table, plot_claims, plot_loss_curves, write_claims_md
    from .runner import Outputs, execute


    def build():
        data = data_for(opts, topts)
        model = opts.model_config(vocab_size=model_vocab(opts, data))
        ccfg = ClaimsConfig(shallow=shallow, deep=deep, seeds=seeds, high_lr=high_lr, warmup=warmup, tol=tol)
        return data, model, opts.init_config(), opts.run_config(), train_config(topts, lr, warmup), ccfg

    data, model, init, run, tcfg, ccfg = configs_or_exit(build)
    title = _describe(opts, model, data, tcfg) + f", {seeds} seeds"

    def curves(r, deep_stack: bool) -> dict:
        """claims_deep_curves / claims_shallow_curves, for a stack with runs (a stopped
        run may have none of the shallow ones yet)."""
        tr = r["train"]
        rows = tr[(tr["n_layers"] == deep) == deep_stack]
        if not len(rows):
            return {}
        name = "claims_deep_curves" if deep_stack else "claims_shallow_curves"
        # the figure's title says the depth (and every other setting all its runs share)
        return {name: plot_loss_curves(rows, data.floor, title)}

    execute(
        "claims",
        opts,
        lambda progress, on_partial=None: run_claims(
            model, init, run, tcfg, data, ccfg, progress, on_partial
        ),
        Outputs(
            figures=lambda r: {
                "claims": plot_claims(r["runs"], data.floor, f"Claims: {title}"),
                **curves(r, True),
                **curves(r, False),
                **variance_figure(r, title),
            },
            tables=lambda r: (
                [claims_table(r["claims"], f"tinit claims ({title})")] if "claims" in r.frames else []
            ),
            files=lambda r, d: (
                write_claims_md(r["claims"], r.meta, d, opts.format, title) if "claims" in r.frames else []
            ),
        ),
    )
