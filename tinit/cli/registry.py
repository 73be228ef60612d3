"""Every command of tinit, once: the CLI registers them from this table (in this order in
`tinit --help`), `tinit sweep` takes its list of sweepable commands from it, and the
tests take their commands from the app built from it.

A command is the function of the same name in the module of tinit.cli named like it
(``lr-sweep``: ``tinit.cli.lr_sweep.lr_sweep``), whose keyword parameters are its options
(the shared ones annotated with the aliases of :mod:`tinit.cli.options`); adding one is
that module and a row here."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str  # as typed: tinit NAME
    short_help: str  # its line in `tinit --help`
    #: its place in `tinit sweep COMMAND`'s list (the commands whose grid splits into points:
    #: it passes a plan to runner.execute); None: it cannot be swept
    sweep: int | None = None
    #: it takes another command and that command's options after its own (tinit sweep)
    passes_options: bool = False

    @property
    def module(self) -> str:
        """The module of tinit.cli that defines it (``lr-sweep``: ``tinit.cli.lr_sweep``)."""
        return self.name.replace("-", "_")

    @property
    def function(self) -> str:
        """The function of that module that is the command: named like the module."""
        return self.module


COMMANDS: tuple[Command, ...] = (
    Command("variance",
            "Residual-stream variance at every addition vs v_2L = v0 + 2L s^2 (the main job).", sweep=2),
    Command("grad-norms",
            "Per-layer gradient norms and stream gradients at init vs the identity-path prediction.",
            sweep=3),
    Command("depth-sweep",
            "v_2L (and gradient ratio) against depth L: does the init transfer from 12 to 80 layers "
            "(v_2L within 10%)?", sweep=1),
    Command("attention-scale",
            "Attention-logit variance, entropy and max weight vs head size, with and without 1/sqrt(d_h)."),
    Command("norms", "RMSNorm vs LayerNorm: invariances, forward/backward time, saved bytes, parameters."),
    Command("params", "Exact parameter accounting: components, tied vs untied head, the 8d/3 FFN rule."),
    Command("check", "The init primer's five claims, each measured, with pass/fail (exit 1 if any fails)."),
    Command("train", "Train the grid schemes x norm positions x depths x seeds x lrs x warmups."),
    Command("lr-sweep", "Final loss against log2 lr per depth and width: does the optimum lr move?", sweep=4),
    Command("claims", "The init primer's training claims, each over seeds, with a verdict."),
    Command("coord-check", "Activation RMS per layer against width and depth over the first training steps: "
            "which schemes keep their coordinates Theta(1)?", sweep=5),
    Command("inits", "The init catalogue (every scheme, its rules and source), or one scheme's stds."),
    Command("audit", "Measure the init of a model tinit did not build (HF config or your module)."),
    Command("sweep", "Run a command's grid as independent points over local workers or a SLURM job array.",
            passes_options=True),
)  # fmt: skip

#: The commands `tinit sweep` runs as points, depth-sweep (its main use) first.
SWEEPABLE: tuple[str, ...] = tuple(
    c.name for c in sorted((c for c in COMMANDS if c.sweep is not None), key=lambda c: c.sweep)  # type: ignore[arg-type, return-value]
)
