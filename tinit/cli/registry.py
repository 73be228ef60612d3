"""Every command of tinit, once: the CLI registers them from this table (in this order in
`tinit --help`), `tinit sweep` takes its list of sweepable commands from it, and the
tests take their commands from the app built from it.

A command is a row here (the option groups it takes, the options of them it leaves out,
its own defaults) and the function of the same name in the module of tinit.cli named
like it (``lr-sweep``: ``tinit.cli.lr_sweep.lr_sweep``), which takes the call's
``Options``; the options only it takes are that module's ``OPTIONS``
(:func:`tinit.cli.options.command` builds the Typer command). Adding one is that module
and a row here."""

from dataclasses import dataclass, field
from typing import Any

from ..criteria import CHECK_MODEL, CHECK_RUN


@dataclass(frozen=True)
class Command:
    name: str  # as typed: tinit NAME
    short_help: str  # its line in `tinit --help`
    #: its place in `tinit sweep COMMAND`'s list (the commands whose grid splits into points:
    #: it passes a plan to runner.execute); None: it cannot be swept
    sweep: int | None = None
    #: it takes another command and that command's options after its own (tinit sweep)
    passes_options: bool = False
    #: the option groups it takes (tinit.cli.options.GROUPS), in --help's order after its own options
    groups: tuple[str, ...] = ()
    #: options of those groups it leaves out, or (``only``) the ones it keeps
    skip: frozenset[str] = frozenset()
    only: frozenset[str] = frozenset()
    #: shared options it takes in another form, by the parameter they replace (d_model: "widths")
    replace: dict[str, str] = field(default_factory=dict)
    #: its own defaults of shared options (train: d_model 48), by parameter name
    defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def module(self) -> str:
        """The module of tinit.cli that defines it (``lr-sweep``: ``tinit.cli.lr_sweep``)."""
        return self.name.replace("-", "_")

    @property
    def function(self) -> str:
        """The function of that module that is the command: named like the module."""
        return self.module


#: the groups of a command of tinit's own model (tinit.cli.options.GROUPS)
MODEL_RUN = ("model", "init", "run", "output")
TRAINING = ("data", "train", "model", "init", "run", "output")
#: sized for a 2-core CPU: a 4-layer, d=48 model on a 64-token Markov language reaches its
#: entropy floor in 300 steps of 16 x 32 tokens (seconds per run); the dtype, streaming and
#: branches are the training's own (float32 master weights, held blocks, model branches)
TRAINING_CPU = {"d_model": 48, "vocab_size": 64, "seq_len": 32, "batch": 16}
NOT_TRAINED = frozenset({"dtype", "stream", "branch", "branch_var"})
OUTPUT = frozenset({"out", "format", "quiet"})
CHECK_DEFAULTS = {**{k: CHECK_MODEL[k] for k in ("n_layers", "d_model", "n_heads")}, **CHECK_RUN}

COMMANDS: tuple[Command, ...] = (
    Command("variance",
            "Residual-stream variance at every addition vs v_2L = v0 + 2L s^2 (the main job).", sweep=2,
            groups=MODEL_RUN),
    Command("grad-norms",
            "Per-layer gradient norms and stream gradients at init vs the identity-path prediction.",
            sweep=3, groups=MODEL_RUN),
    Command("depth-sweep",
            "v_2L (and gradient ratio) against depth L: does the init transfer from 12 to 80 layers "
            "(v_2L within 10%)?", sweep=1, groups=MODEL_RUN, skip=frozenset({"n_layers"}),
            defaults={"layers": "1,2,4,8,12,24,48,80"}),
    Command("attention-scale",
            "Attention-logit variance, entropy and max weight vs head size, with and without 1/sqrt(d_h).",
            groups=MODEL_RUN,
            only=OUTPUT | {"preset", "n_heads", "vocab_size", "norm", "positions", "attention", "sigma",
                           "seed", "seq_len", "batch", "device", "dtype", "tf32", "threads"}),
    Command("norms", "RMSNorm vs LayerNorm: invariances, forward/backward time, saved bytes, parameters.",
            groups=("init", "run", "output"), only=OUTPUT | {"seed", "device", "dtype"}),
    Command("params", "Exact parameter accounting: components, tied vs untied head, the 8d/3 FFN rule.",
            groups=("model", "run", "output"),
            skip=frozenset({"attention", "no_attn_scale", "branch", "branch_var", "batch", "device", "dtype",
                            "stream", "tf32"})),
    Command("check", "The init primer's five claims, each measured, with pass/fail (exit 1 if any fails).",
            groups=MODEL_RUN,
            skip=frozenset({"pre_norm", "post_norm", "norm_positions", "branch", "branch_var", "init",
                            "init_file", "base_width", "base_depth"}),
            defaults=CHECK_DEFAULTS),
    Command("train", "Train the grid schemes x norm positions x depths x seeds x lrs x warmups.",
            groups=TRAINING, skip=NOT_TRAINED | {"n_layers"}, defaults={**TRAINING_CPU, "layers": "4"}),
    Command("lr-sweep", "Final loss against log2 lr per depth and width: does the optimum lr move?", sweep=4,
            groups=TRAINING, skip=NOT_TRAINED | {"n_layers"}, replace={"d_model": "widths"},
            defaults={**TRAINING_CPU, "layers": "2,4,8", "widths": "48", "steps": 200, "init": "scaled"}),
    Command("claims", "The init primer's training claims, each over seeds, with a verdict.",
            groups=TRAINING, defaults={**TRAINING_CPU, "steps": 200},
            # each claim chooses its depths, schemes (a user's --init-file has no claim to
            # test), placements, norm, FFN and tying
            skip=NOT_TRAINED | {"n_layers", "d_ff", "norm", "ffn", "untie", "pre_norm", "post_norm",
                                "norm_positions", "init", "init_file", "base_width", "base_depth",
                                "param_rules"}),
    Command("coord-check", "Activation RMS per layer against width and depth over the first training steps: "
            "which schemes keep their coordinates Theta(1)?", sweep=5,
            groups=("coord", "model", "init", "run", "output"),
            skip=NOT_TRAINED | {"preset", "n_layers", "d_model"},
            # d = 64..512 and L = 2, 8 at 3 seeds in about a minute of CPU on 2 cores (one fixed
            # batch of 4 x 32 tokens; a layer's RMS averages 128 x d coordinates)
            defaults={"widths": "64,128,256,512", "layers": "2,8", "vocab_size": 256, "seq_len": 32,
                      "batch": 4, "init": "gpt2,mup"}),
    Command("inits", "The init catalogue (every scheme, its rules and source), or one scheme's stds.",
            # the options that change a rule's value
            groups=("model", "init", "run", "output"),
            only=OUTPUT | {"preset", "n_layers", "d_model", "n_heads", "d_ff", "vocab_size", "ffn",
                           "positions", "untie", "n_kv_heads", "init_file", "base_width", "base_depth",
                           "sigma", "embed_std", "seq_len", "threads"}),
    Command("audit", "Measure the init of a model tinit did not build (HF config or your module).",
            # none of the options of tinit's own model (shape, placement, QK-norm, GQA, init
            # scheme and its base sizes): the audited model has its own (an option accepted and
            # ignored would mislead); --init-file is taken: its scheme may be named by --expect
            # and --init
            groups=("init", "run", "output"),
            only=OUTPUT | {"init_file", "seed", "seq_len", "batch", "device", "dtype", "threads"},
            defaults={"seq_len": 128}),
    Command("sweep", "Run a command's grid as independent points over local workers or a SLURM job array.",
            passes_options=True),
)  # fmt: skip

#: The commands `tinit sweep` runs as points, depth-sweep (its main use) first.
SWEEPABLE: tuple[str, ...] = tuple(
    c.name
    for c in sorted((c for c in COMMANDS if c.sweep is not None), key=lambda c: c.sweep)  # type: ignore[arg-type, return-value]
)
