"""``tinit variance``: residual-stream variance at every addition vs the law."""

from .common import describe
from .configs import Options, configs_or_exit


def variance(opts: Options) -> None:
    """Measure the residual-stream variance at every one of the 2L additions for each
    init scheme (--init: a comma list or 'all'; default naive and depth-scaled) and norm
    placement, against each scheme's law and closed form (naive: v_2L = v0 + 2L s^2),
    with the tokens' similarity (rank collapse) at every addition.

    Writes variance.csv, summary.csv, variance.png and config.json to a new run folder.
    """
    # torch, pandas and matplotlib load here, when the command runs, not for --help
    from ..experiments.measure.variance import run_variance
    from ..results.plots import plot_variance
    from ..results.tables import overflow_notes, variance_table
    from .runner import Outputs, execute

    model, init_cfg, run = configs_or_exit(
        lambda: (opts.model_config(), opts.init_config(), opts.run_config())
    )
    title = describe(opts, model)
    execute(
        "variance",
        opts,
        lambda progress, on_partial=None: run_variance(
            model, init_cfg, run, opts.inits, opts.placements, progress, on_partial
        ),
        Outputs(
            figures=lambda r: {"variance": plot_variance(r["variance"], title)},
            tables=lambda r: [
                variance_table(r["summary"], f"Residual-stream variance ({title})"),
                *overflow_notes(r["summary"], (r.meta.get("run") or {}).get("dtype")),
            ],
        ),
        plan=lambda: _plan(model, init_cfg, run, opts.inits, opts.placements),
    )


def _plan(*args):
    # only `tinit sweep` plans: a plain run does not import the other experiments
    from ..experiments.measure.variance import variance_plan

    return variance_plan(*args)
