"""``tinit variance``: residual-stream variance at every addition vs the law."""

from ..experiments.points import variance_plan
from ..experiments.variance import run_variance
from ..model.config import ModelConfig
from ..results.plots import plot_variance
from ..results.tables import variance_table
from . import app
from .options import SharedOptions, shared_options
from .runner import Outputs, configs_or_exit, execute


def describe(opts: SharedOptions, model: ModelConfig) -> str:
    return (
        f"L={model.n_layers}, d={model.d_model}, heads={model.n_heads}, d_ff={model.d_ff}, "
        f"{model.norm}, {model.ffn}, sigma={opts.sigma}, batch {opts.batch} x seq {opts.seq_len}, "
        f"{opts.dtype}, seed {opts.seed}"
        + (f", Gaussian branches S2={model.branch_var:g}" if model.branch == "gaussian" else "")
    )


@app.command(
    "variance", short_help="Residual-stream variance at every addition vs v_2L = v0 + 2L s^2 (the main job)."
)
@shared_options(defaults={"layers": 12})
def variance(*, opts: SharedOptions) -> None:
    """Measure the residual-stream variance at every one of the 2L additions, naive vs
    depth-scaled init and pre- vs post-norm, against v_2L = v0 + 2L s^2.

    Writes variance.csv, summary.csv, variance.png and config.json to a new run folder.
    """
    model, init, run = configs_or_exit(lambda: (opts.model_config(), opts.init_config(), opts.run_config()))
    title = describe(opts, model)
    execute(
        "variance",
        opts,
        lambda progress: run_variance(model, init, run, opts.inits, opts.norm_positions, progress),
        Outputs(
            figures=lambda r: {"variance": plot_variance(r["variance"], title)},
            tables=lambda r: [variance_table(r["summary"], f"Residual-stream variance ({title})")],
        ),
        plan=lambda: variance_plan(model, init, run, opts.inits, opts.norm_positions),
    )
