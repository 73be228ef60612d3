"""``tinit check``: the init primer's five "check yourself" items, measured, each with
a pass/fail against the theory; exit 1 if any fails."""

from typing import Annotated

import typer
from rich.text import Text

from ..criteria import CHECK_ALPHA, CHECK_DEEP_LAYERS
from . import options as opt
from .common import positive_int_list
from .configs import Options, configs_or_exit
from .options import Param

CHECK = "Check"


def _alpha(value: float) -> float:
    if not 0 < value < 1:
        raise typer.BadParameter(f"{value} is not a level strictly between 0 and 1")
    return value


OPTIONS = (
    Param(
        "deep_layers",
        Annotated[
            int,
            typer.Option(
                "--deep-layers",
                help="The long depth of item (b) (--layers is the short one).",
                min=1,
                rich_help_panel=CHECK,
            ),  # fmt: skip
        ],
        CHECK_DEEP_LAYERS,
    ),
    opt.HEAD_DIMS,
    Param(
        "alpha",
        Annotated[
            float,
            typer.Option(
                "--alpha",
                help="Level of every two-sided test (Bonferroni over maxima).",
                callback=_alpha,
                rich_help_panel=CHECK,
            ),  # fmt: skip
        ],
        CHECK_ALPHA,
    ),
)


def check(opts: Options) -> None:
    """Answer the five "check yourself" items of the init primer (Transformer Assembly &
    Weight Initialization, the text tinit is built around; README) with measurements:
    (a) v_2L = 1 + 2L sigma^2 and the independence of stream and branch; (b) depth-scaled
    init makes v_2L independent of L (--layers vs --deep-layers); (c) pre-norm keeps an
    unattenuated gradient path, post-norm does not; (d) tying saves V*d parameters;
    (e) the 1/sqrt(d_h) logit scale. Each claim passes or fails a stated statistical test;
    the command exits 1 if any fails.

    Writes check.csv, check.md (the report, figures embedded), the data behind the
    figures (variance.csv, stream_grads.csv, grad_summary.csv, params.csv,
    params_summary.csv, ffn.csv, attention_scale.csv), check_variance.png,
    stream_grads.png, params.png, attention_scale.png and config.json.
    """
    deep_layers, head_dims, alpha = opts.deep_layers, opts.head_dims, opts.alpha
    preset, sigma = opts.preset, opts.sigma
    from ..experiments.measure.attention_scale import check_head_dims
    from ..experiments.measure.check import run_check
    from ..experiments.measure.grad_norms import require_gradients
    from ..results.plot_attention_scale import plot_attention_scale
    from ..results.plot_grad_norms import plot_stream_grads
    from ..results.plot_params import plot_params
    from ..results.report_check import check_table, plot_check_variance, verdict, write_check_md
    from .runner import Outputs, execute

    dims = positive_int_list(head_dims, "--head-dims")
    model, init_cfg, run = configs_or_exit(
        lambda: (opts.model_config(), opts.init_config(), opts.run_config())
    )
    configs_or_exit(lambda: check_head_dims(dims, model.positions))  # before the run folder exists
    configs_or_exit(lambda: require_gradients(model, run))
    description = (
        (f"{preset}: " if preset else "")
        + f"L={model.n_layers} and {deep_layers}, d={model.d_model}, heads={model.n_heads}, "
        f"{model.norm}, {model.ffn}, sigma={sigma}, batch {run.batch} x seq {run.seq_len}, "
        f"{run.dtype}, seed {init_cfg.seed}"
    )
    result = execute(
        "check",
        opts,
        lambda progress, on_partial=None: run_check(
            model, init_cfg, run, deep_layers, dims, alpha, progress, on_partial
        ),
        Outputs(
            figures=lambda r: {
                "check_variance": plot_check_variance(r["variance"], alpha, description),
                "stream_grads": plot_stream_grads(r["stream_grads"], f"(c) L={model.n_layers}, naive init"),
                "params": plot_params(
                    r["params"][r["params"]["model"] != "configured"],
                    r["ffn"],
                    r["params_summary"].iloc[:1],
                    "(d) the primer's V=128000, d=2048",
                ),
                "attention_scale": plot_attention_scale(r["attention_scale"], "(e) unit q, k"),
            },
            tables=lambda r: [
                check_table(r["check"], f"tinit check ({description})"),
                Text(verdict(r["check"]), style="bold green" if r["check"]["passed"].all() else "bold red"),
            ],
            files=lambda r, run_dir: write_check_md(r["check"], r.meta, run_dir, opts.format, description),
        ),
    )
    if not result["check"]["passed"].astype(bool).all():
        raise typer.Exit(1)
