"""Every command of tinit, once: the CLI registers them from this table (in this order in
`tinit --help`), `tinit sweep` gets its list of sweepable commands from it, and the
tests take their commands from the app built from it.

A command is a row here and its module ``tinit/cli/<name>.py``: the function the row
names (a body ``f(opts)`` taking the call's :class:`~tinit.cli.configs.Options`) and the
module's ``OPTIONS`` (the shared options it takes outside its groups, and its own). The
row says which option groups it takes (:data:`tinit.cli.options.GROUPS`), which options
of them it leaves out, which it takes as a list, and its own defaults and help where
it needs them; :func:`command` makes the Typer command. Adding a command is that module
and a row here."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..criteria import CHECK_HEAD_DIMS, CHECK_MODEL, CHECK_RUN
from . import (
    attention_scale,
    audit,
    check,
    claims,
    coord_check,
    depth_sweep,
    grad_norms,
    inits,
    lr_sweep,
    norms,
    params,
    sweep,
    train,
    variance,
)
from .configs import Options
from .options import GROUPS, Option, Param


@dataclass(frozen=True)
class Command:
    name: str  # as typed: tinit NAME
    body: Callable[[Options], None]  # the command: its docstring is its help
    options: tuple[Option | Param, ...]  # its module's OPTIONS: taken before the groups', in this order
    short_help: str  # its line in `tinit --help`
    #: its place in `tinit sweep COMMAND`'s list (the commands whose grid splits into points:
    #: it passes a plan to runner.execute); None: it cannot be swept
    sweep: int | None = None
    #: it takes another command and that command's options after its own (tinit sweep)
    passes_options: bool = False
    #: the option groups it takes (tinit.cli.options.GROUPS), in --help's order after its own options
    groups: tuple[str, ...] = ()
    #: options of those groups it leaves out, or (``only``) the ones it keeps, by parameter
    skip: frozenset[str] = frozenset()
    only: frozenset[str] = frozenset()
    #: options of those groups it takes as a comma list (their list form: n_layers: --layers 1,2,4, as layers)
    lists: frozenset[str] = frozenset()
    #: its own defaults, by the parameter it takes (train: d_model 48; depth-sweep: layers "1,2,...")
    defaults: dict[str, Any] = field(default_factory=dict)
    #: its own help of an option that means something narrower for it, by parameter
    help: dict[str, str] = field(default_factory=dict)

    @property
    def context_settings(self) -> dict[str, Any] | None:
        """Click's settings: a command that passes options on accepts what it does not know."""
        return {"allow_extra_args": True, "ignore_unknown_options": True} if self.passes_options else None


def with_values(body: Callable, **values: Any) -> Callable:
    """``body`` called with ``values`` besides the call's Options (tinit sweep gets the list
    of sweepable commands from the table, not by importing it)."""
    return functools.update_wrapper(functools.partial(body, **values), body)


def _params(group: str) -> frozenset[str]:
    return frozenset(o.param for o in GROUPS[group])


#: the groups of a command of tinit's own model (tinit.cli.options.GROUPS)
MODEL_RUN = ("model", "init", "run", "output")
TRAINING = ("data", "train", "model", "init", "run", "output")
#: sized for a 2-core CPU: a 4-layer, d=48 model on a 64-token Markov language reaches its
#: entropy floor in 300 steps of 16 x 32 tokens (seconds per run); the dtype, streaming and
#: branches are the training's own (float32 master weights, held blocks, model branches)
TRAINING_CPU = {"d_model": 48, "vocab_size": 64, "seq_len": 32, "batch": 16}
NOT_TRAINED = frozenset({"dtype", "stream", "branch", "branch_var"})
OUTPUT = frozenset({"out", "format", "quiet"})
CHECK_DEFAULTS = {**{k: CHECK_MODEL[k] for k in ("n_layers", "d_model", "n_heads")}, **CHECK_RUN,
                  "head_dims": ",".join(map(str, CHECK_HEAD_DIMS))}  # fmt: skip

MEASURING: tuple[Command, ...] = (
    Command("variance", variance.variance, variance.OPTIONS,
            "Residual-stream variance at every addition vs v_2L = v0 + 2L s^2 (the main job).", sweep=2,
            groups=MODEL_RUN),
    Command("grad-norms", grad_norms.grad_norms, grad_norms.OPTIONS,
            "Per-layer gradient norms and stream gradients at init vs the identity-path prediction.",
            sweep=3, groups=MODEL_RUN),
    Command("depth-sweep", depth_sweep.depth_sweep, depth_sweep.OPTIONS,
            "v_2L (and gradient ratio) against depth L: does the init transfer from 12 to 80 layers "
            "(v_2L within 10%)?", sweep=1, groups=MODEL_RUN, lists=frozenset({"n_layers"}),
            defaults={"layers": "1,2,4,8,12,24,48,80", "seeds": 3},
            help={"seeds": "Independent seeds per depth (weights and tokens re-drawn): --seed, --seed+1, ...",
                  "grads": "Also measure the gradients (grad_ratio); --no-grads: grad_ratio left empty, "
                  "about 3x faster."}),
    Command("attention-scale", attention_scale.attention_scale, attention_scale.OPTIONS,
            "Attention-logit variance, entropy and max weight vs head size, with and without 1/sqrt(d_h).",
            groups=MODEL_RUN,
            only=OUTPUT | {"preset", "n_heads", "vocab_size", "norm", "positions", "attention", "sigma",
                           "seed", "seq_len", "batch", "device", "dtype", "tf32", "threads"},
            help={"head_dims": "Head sizes d_h, a comma list. --heads is held fixed, so the model input has "
                  "d_model = heads * d_h."}),
    Command("norms", norms.norms, norms.OPTIONS,
            "RMSNorm vs LayerNorm: invariances, forward/backward time, saved bytes, parameters.",
            groups=("model", "train", "init", "run", "output"), lists=frozenset({"d_model"}),
            only=OUTPUT | {"d_model", "warmup", "compile", "seed", "device", "dtype", "threads"},
            defaults={"widths": "256,1024,4096", "warmup": 3, "compile": None, "threads": 1},
            help={"widths": "Normalised widths d, a comma list.", "warmup": "Untimed calls before timing.",
                  "compile": "Also time torch.compile'd norms (default: on with CUDA, off on the CPU, where "
                  "inductor's C++ build takes 15-60 s). A failed compile is recorded as unavailable.",
                  "threads": "CPU threads while timing. One gives steady numbers on a shared or busy CPU; "
                  "give more to time multi-threaded kernels."}),
    Command("params", params.params, params.OPTIONS,
            "Exact parameter accounting: components, tied vs untied head, the 8d/3 FFN rule.",
            groups=("model", "run", "output"),
            skip=frozenset({"attention", "no_attn_scale", "branch", "branch_var", "batch", "device", "dtype",
                            "stream", "tf32"})),
    Command("check", check.check, check.OPTIONS,
            "The init primer's five claims, each measured, with pass/fail (exit 1 if any fails).",
            groups=MODEL_RUN,
            skip=frozenset({"pre_norm", "post_norm", "norm_positions", "branch", "branch_var", "init",
                            "init_file", "base_width", "base_depth"}),
            defaults=CHECK_DEFAULTS, help={"head_dims": "Head sizes d_h of item (e), a comma list."}),
    Command("train", train.train, train.OPTIONS,
            "Train the grid schemes x norm positions x depths x seeds x lrs x warmups.",
            groups=TRAINING, skip=NOT_TRAINED, lists=frozenset({"n_layers", "lr", "warmup"}),
            defaults={**TRAINING_CPU, "layers": "4", "lrs": "1e-2", "warmups": "30"}),
    Command("lr-sweep", lr_sweep.lr_sweep, lr_sweep.OPTIONS,
            "Final loss against log2 lr per depth and width: does the optimum lr move?", sweep=4,
            groups=TRAINING, skip=NOT_TRAINED, lists=frozenset({"n_layers", "d_model", "lr", "warmup"}),
            defaults={**TRAINING_CPU, "layers": "2,4,8", "widths": "48", "lrs": "1e-3,3e-3,1e-2,3e-2",
                      "warmups": "30", "steps": 200, "init": "scaled"}),
    Command("claims", claims.claims, claims.OPTIONS,
            "The init primer's training claims, each over seeds, with a verdict.",
            groups=TRAINING, defaults={**TRAINING_CPU, "steps": 200, "seeds": 5, "lr": 1e-2, "warmup": 50},
            # each claim chooses its depths, schemes (a user's --init-file has no claim to
            # test), placements, norm, FFN and tying
            skip=NOT_TRAINED | {"n_layers", "d_ff", "norm", "ffn", "untie", "pre_norm", "post_norm",
                                "norm_positions", "init", "init_file", "base_width", "base_depth",
                                "param_rules"},
            help={"seeds": "Seeds per configuration (>= 2: each verdict needs a standard error).",
                  "lr": "Ordinary peak lr.", "warmup": "Ordinary warmup steps (and the unstable setting's "
                  "comparison)."}),
    Command("coord-check", coord_check.coord_check, coord_check.OPTIONS,
            "Activation RMS per layer against width and depth over the first training steps: "
            "which schemes keep their coordinates Theta(1)?", sweep=5,
            groups=("train", "model", "init", "run", "output"),
            # of the training options, those of its few Adam steps on one batch
            skip=NOT_TRAINED | {"preset"} | (_params("train") - {"steps", "lr", "param_rules", "eps"}),
            lists=frozenset({"n_layers", "d_model"}),
            # d = 64..512 and L = 2, 8 at 3 seeds in about a minute of CPU on 2 cores (one fixed
            # batch of 4 x 32 tokens; a layer's RMS averages 128 x d coordinates)
            defaults={"widths": "64,128,256,512", "layers": "2,8", "vocab_size": 256, "seq_len": 32,
                      "batch": 4, "init": "gpt2,mup", "seeds": 3, "steps": 4},
            help={"seeds": "Seeds per (scheme, width, depth): --seed, --seed+1, ...",
                  "steps": "Optimizer steps; the RMS is recorded at steps 0..N.",
                  "lr": "Constant Adam learning rate (the scheme's rules scale it per group).",
                  "param_rules": "on: each scheme's optimizer rules (muP's lr / m on hidden matrices); off: "
                  "one lr for every parameter, to show what the rules do."}),
    Command("inits", inits.inits, inits.OPTIONS,
            "The init catalogue (every scheme, its rules and source), or one scheme's stds.",
            # the options that change a rule's value
            groups=("model", "init", "run", "output"),
            only=OUTPUT | {"preset", "n_layers", "d_model", "n_heads", "d_ff", "vocab_size", "ffn",
                           "positions", "untie", "n_kv_heads", "init_file", "base_width", "base_depth",
                           "sigma", "embed_std", "seq_len", "threads"}),
    Command("audit", audit.audit, audit.OPTIONS,
            "Measure the init of a model tinit did not build (HF config or your module).",
            # none of the options of tinit's own model (shape, placement, QK-norm, GQA, init
            # scheme and its base sizes): the audited model has its own (an option accepted and
            # ignored would mislead); --init-file is taken: its scheme may be named by --expect
            # and --init; --sigma, --vocab and --data mean what they mean for the audited model
            groups=("model", "data", "init", "run", "output"),
            only=OUTPUT | {"vocab_size", "data", "init_file", "sigma", "seed", "seq_len", "batch", "device",
                           "dtype", "threads"},
            defaults={"seq_len": 128, "vocab_size": None, "data": None, "sigma": None},
            help={"vocab_size": "Vocabulary size of the random tokens (default: the model's).",
                  "data": "With --checkpoint: the tokens, as tinit train reads them (stdlib, a text file, a "
                  "nanoGPT .bin: its first held-out batch; a text tokenized by an HF folder's own tokenizer "
                  "when it has one, offline); default: uniform random ids from --seed.",
                  "sigma": "Base std for --expect/--init (default: the model's initializer_range, else "
                  "0.02)."}),
)  # fmt: skip

#: The commands `tinit sweep` runs as points, depth-sweep (its main use) first.
SWEEPABLE: tuple[str, ...] = tuple(
    c.name
    for c in sorted((c for c in MEASURING if c.sweep is not None), key=lambda c: c.sweep)  # type: ignore[arg-type, return-value]
)

COMMANDS: tuple[Command, ...] = (
    *MEASURING,
    Command("sweep", with_values(sweep.sweep, sweepable=SWEEPABLE), sweep.OPTIONS,
            "Run a command's grid as independent points over local workers or a SLURM job array.",
            passes_options=True,
            help={"command": f"The command to sweep: {', '.join(SWEEPABLE)}; its options follow it."}),
)  # fmt: skip


def parameters(row: Command) -> tuple[list[inspect.Parameter], tuple[Option, ...]]:
    """A command's parameters, in --help's order (its module's OPTIONS, then the groups'
    in the row's order, each at the row's default and help), and the declared shared
    options among them (for Options: names and fields)."""
    params: list[inspect.Parameter] = []
    declared: list[Option] = []

    def take(o: Option | Param) -> None:
        if isinstance(o, Option):
            declared.append(o)
        params.append(o.param_of(row.defaults.get(o.param, o.default), row.help.get(o.param)))

    for o in row.options:
        take(o)
    for name in row.groups:
        for o in GROUPS[name]:
            if o.param in row.skip or (row.only and o.param not in row.only):
                continue
            take(o.many if o.param in row.lists and o.many is not None else o)
    return params, tuple(declared)


def command(row: Command) -> Callable:
    """The Typer command of a registry row: the parameters of :func:`parameters`, its help
    the body's docstring; a call makes the Options value and hands it to the body."""
    params, declared = parameters(row)

    def run(**values: Any) -> None:
        row.body(Options(values, declared))

    run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    run.__doc__, run.__name__ = row.body.__doc__, row.body.__name__
    return run


def options_of(name: str) -> tuple[Option, ...]:
    """The declared shared options of the command ``name`` (for an Options value made
    outside a call of it: tests, a library caller replaying a command line)."""
    return parameters(next(c for c in COMMANDS if c.name == name))[1]


def own_options(rows: Iterable[Command] = COMMANDS) -> dict[str, tuple[Param, ...]]:
    """Each command's own options (declared in its module), by command."""
    return {c.name: tuple(o for o in c.options if isinstance(o, Param)) for c in rows}
