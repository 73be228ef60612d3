"""``tinit depth-sweep``: final stream variance against depth, naive vs depth-scaled."""

from typing import Annotated

import typer

from ..experiments.depth_sweep import parse_layers, run_depth_sweep
from ..experiments.points import depth_sweep_plan
from ..results.plot_depth_sweep import depth_sweep_table, plot_depth_sweep
from . import app
from .options import MODEL, SharedOptions, shared_options
from .runner import Outputs, configs_or_exit, execute
from .variance import describe

SWEEP = "Sweep"
DEFAULT_LAYERS = "1,2,4,8,12,24,48,80"


@app.command(
    "depth-sweep",
    short_help="v_2L (and gradient ratio) against depth L: does the init transfer from 12 to 80 layers?",
)
@shared_options(exclude=("layers",))
def depth_sweep(
    *,
    opts: SharedOptions,
    layers: Annotated[
        str,
        typer.Option(
            "--layers",
            "-L",
            help="Depths to sweep: a comma list (1,2,4,12,80), an arithmetic range start:stop:step "
            "(12:96:12, stop included), a geometric range start:stop:xFACTOR (4:128:x2), or a mix.",
            rich_help_panel=MODEL,
            show_default=True,
        ),
    ] = DEFAULT_LAYERS,
    seeds: Annotated[
        int,
        typer.Option(
            "--seeds",
            help="Independent seeds per depth (weights and tokens re-drawn): --seed, --seed+1, ...",
            min=1,
            rich_help_panel=SWEEP,
            show_default=True,
        ),
    ] = 3,
    no_grads: Annotated[
        bool,
        typer.Option(
            "--no-grads",
            help="Skip the gradients (grad_ratio left empty); about 3x faster.",
            rich_help_panel=SWEEP,
        ),
    ] = False,
) -> None:
    """Sweep the depth L: final stream variance v_2L (and the first/last-layer W_down
    gradient ratio) at each L, naive vs depth-scaled init and pre- vs post-norm, with
    a least-squares slope of v_2L against L beside the theory (2 mean(s^2) naive, 0
    scaled) and the 12 -> 80 layer transfer check.

    Writes depth_sweep.csv, depth_sweep_summary.csv, depth_sweep_fit.csv,
    depth_sweep.png and config.json to a new run folder.
    """
    depths = configs_or_exit(lambda: parse_layers(layers))
    model, init, run = configs_or_exit(
        lambda: (
            opts.model_config(n_layers=depths[-1]),
            opts.init_config(),
            opts.run_config(layers=layers, depths=depths, seeds=seeds, grads=not no_grads),
        )
    )
    title = describe(opts, model).replace(f"L={model.n_layers}", f"L={_depths(depths)}")
    title += f", {seeds} seed{'s' if seeds > 1 else ''}"
    execute(
        "depth-sweep",
        opts,
        lambda progress: run_depth_sweep(
            model, init, run, depths, seeds, opts.inits, opts.norm_positions, not no_grads, progress
        ),
        Outputs(
            figures=lambda r: {
                "depth_sweep": plot_depth_sweep(r["depth_sweep_summary"], r["depth_sweep_fit"], title)
            },
            tables=lambda r: [
                depth_sweep_table(r["depth_sweep_fit"], r["depth_sweep_summary"], f"Depth sweep ({title})")
            ],
        ),
        plan=lambda: depth_sweep_plan(
            model, init, run, depths, seeds, opts.inits, opts.norm_positions, not no_grads
        ),
    )


def _depths(depths: list[int]) -> str:
    return ",".join(map(str, depths)) if len(depths) <= 10 else f"{depths[0]}..{depths[-1]} ({len(depths)})"
