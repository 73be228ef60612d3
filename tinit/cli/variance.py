"""``tinit variance``: residual-stream variance at every addition vs the law."""

from typing import Annotated

import typer

from . import options as opt
from .common import describe
from .configs import Options, configs_or_exit
from .options import Param

OPTIONS = (
    opt.MF_DRAWS,
    Param(
        "theory_only",
        Annotated[
            bool,
            typer.Option(
                "--theory-only",
                help="Write and print the large-width prediction alone (the mf_* columns; the measured ones "
                "empty): no model is built, so any depth and width run in seconds on the CPU.",
                rich_help_panel=opt.RUN,
            ),
        ],
        False,
    ),
)


def variance(opts: Options) -> None:
    """Measure the residual-stream variance at every one of the 2L additions for each
    init scheme (--init: a comma list or 'all'; default naive and depth-scaled) and norm
    placement, against each scheme's law and closed form (naive: v_2L = v0 + 2L s^2),
    with the tokens' similarity (rank collapse) at every addition.

    Beside the measurement, the large-width prediction of every addition from the init
    alone (the Gaussian recursion of the tokens' Gram matrix: mf_stream_var,
    mf_branch_var, mf_cos_sim); --theory-only writes it without building the model.

    Writes variance.csv, summary.csv, variance.png and config.json to a new run folder.
    """
    theory_only = opts.theory_only
    # torch, pandas and matplotlib load here, when the command runs, not for --help
    from ..experiments.measure.variance import run_variance
    from ..results.plots import plot_variance
    from .runner import Outputs, execute

    model, init_cfg, run = configs_or_exit(
        lambda: (opts.model_config(), opts.init_config(), opts.run_config())
    )
    title = describe(opts, model)
    execute(
        "variance",
        opts,
        lambda progress, on_partial=None: run_variance(
            model, init_cfg, run, opts.inits, opts.placements, progress, on_partial, theory_only
        ),
        Outputs(
            figures=lambda r: {"variance": plot_variance(r["variance"], title)},
            tables=lambda r: _tables(r, title, theory_only),
        ),
        plan=lambda: _plan(model, init_cfg, run, opts.inits, opts.placements, theory_only),
    )


def _tables(r, title: str, theory_only: bool) -> list:
    """The terminal's tables: the measurement against the laws (not --theory-only), the
    prediction (beside the measurement), and a note per overflow."""
    from ..results.tables import overflow_notes, prediction_table, variance_table

    tables = [] if theory_only else [variance_table(r["summary"], f"Residual-stream variance ({title})")]
    predicted = prediction_table(r["summary"], r["variance"], f"Large-width prediction ({title})")
    tables += [] if predicted is None else [predicted]
    return tables + overflow_notes(r["summary"], (r.meta.get("run") or {}).get("dtype"))


def _plan(*args):
    # only `tinit sweep` plans: a plain run does not import the other experiments
    from ..experiments.measure.variance import variance_plan

    return variance_plan(*args)
