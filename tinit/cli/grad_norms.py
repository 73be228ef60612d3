"""``tinit grad-norms``: per-layer gradient norms at init, pre- vs post-norm."""

from typing import Annotated, Literal

import typer

from . import options as opt
from .common import describe
from .configs import Options, configs_or_exit
from .options import Param

GRADIENTS = "Gradients"


OPTIONS = (
    Param(
        "batches",
        Annotated[
            int,
            typer.Option(
                "--batches",
                help="Average the gradients over N seeded batches before taking norms.",
                min=1,
                max=opt.MAX_BATCHES,
                rich_help_panel=GRADIENTS,
            ),
        ],
        1,
    ),
    Param(
        "tensor",
        Annotated[
            Literal["down", "o", "both"],
            typer.Option(
                "--tensor",
                help="Which matrix grad_norms.png shows (both: a panel each).",
                rich_help_panel=GRADIENTS,
            ),  # fmt: skip
        ],
        "both",
    ),
)


def grad_norms(opts: Options) -> None:
    """Measure the gradient norm of every weight and of the residual stream at every
    addition at init, naive vs depth-scaled and pre- vs post-norm, next to the
    identity-path prediction (pre-norm: gain 1; post-norm: product of 1/sqrt(var)).

    Writes grad_norms.csv, stream_grads.csv, summary.csv, grad_norms.png,
    stream_grads.png and config.json to a new run folder.
    """
    batches, tensor = opts.batches, opts.tensor
    from ..experiments.measure.grad_norms import require_gradients, run_grad_norms
    from ..results.plot_grad_norms import grad_norms_table, plot_grad_norms, plot_stream_grads
    from .runner import Outputs, execute

    model, init_cfg, run = configs_or_exit(
        lambda: (opts.model_config(), opts.init_config(), opts.run_config(batches=batches, tensor=tensor))
    )
    configs_or_exit(lambda: require_gradients(model, run))  # before the run folder exists
    title = describe(opts, model) + (f", {batches} batches" if batches > 1 else "")
    execute(
        "grad-norms",
        opts,
        lambda progress, on_partial=None: run_grad_norms(
            model, init_cfg, run, opts.inits, opts.placements, batches, progress, on_partial
        ),
        Outputs(
            figures=lambda r: {
                "grad_norms": plot_grad_norms(r["grad_norms"], tensor, title),
                "stream_grads": plot_stream_grads(r["stream_grads"], title),
            },
            tables=lambda r: [grad_norms_table(r["summary"], f"Gradient norms at init ({title})")],
        ),
        plan=lambda: _plan(model, init_cfg, run, opts.inits, opts.placements, batches),
    )


def _plan(*args):
    # only `tinit sweep` plans: a plain run does not import the other experiments
    from ..experiments.measure.grad_norms import grad_norms_plan

    return grad_norms_plan(*args)
