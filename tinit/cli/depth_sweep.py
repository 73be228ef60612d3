"""``tinit depth-sweep``: final stream variance against depth, naive vs depth-scaled."""

from typing import Annotated

import typer

from . import options as opt
from .common import describe
from .configs import Options, configs_or_exit
from .options import Param

SWEEP = "Sweep"


OPTIONS = (
    opt.MF_DRAWS,
    opt.SEEDS,
    opt.GRADS,
    Param(
        "transfer_from",
        Annotated[
            int | None,
            typer.Option(
                "--transfer-from",
                help="Shallow depth of the transfer check (a swept depth below the deepest); default 12 "
                "when swept, else the shallowest.",
                min=1,
                rich_help_panel=SWEEP,
                show_default=False,
            ),
        ],
        None,
    ),
)


def depth_sweep(opts: Options) -> None:
    """Sweep the depth L: final stream variance v_2L (and the first/last-layer W_down
    gradient ratio) at each L, naive vs depth-scaled init and pre- vs post-norm, with
    a least-squares slope of v_2L against L beside the theory (2 mean(s^2) naive, 0
    scaled), the per-depth law v_2L = v0 + 2L mean(s^2) at each depth (holds: within
    10%), and the transfer check from 12 (--transfer-from) to the deepest L, 80
    by default: transfers when v_2L(80) / v_2L(12) is within 1 +- 10% (yes: even
    at +-2 standard errors; unclear: the interval straddles the band), printed beside
    whether the change is statistically resolved (beyond 2 standard errors).

    Writes depth_sweep.csv, depth_sweep_summary.csv, depth_sweep_fit.csv,
    depth_sweep.png and config.json to a new run folder.
    """
    layers, seeds, grads, transfer_from = opts.layers, opts.seeds, opts.grads, opts.transfer_from
    from ..experiments.configs import parse_layers
    from ..experiments.measure.depth_sweep import depth_sweep_plan, run_depth_sweep, transfer_reference
    from ..experiments.measure.grad_norms import require_gradients
    from .runner import Outputs, execute

    depths = configs_or_exit(lambda: parse_layers(layers))
    ref = configs_or_exit(lambda: transfer_reference(depths, transfer_from))
    model, init_cfg, run = configs_or_exit(
        lambda: (
            opts.model_config(n_layers=depths[-1]),
            opts.init_config(),
            opts.run_config(layers=layers, depths=depths, seeds=seeds, grads=grads, transfer_from=ref),
        )
    )
    if grads:
        configs_or_exit(lambda: require_gradients(model, run))  # before the run folder exists
    title = describe(opts, model).replace(f"L={model.n_layers}", f"L={_depths(depths)}")
    title += f", {seeds} seed{'s' if seeds > 1 else ''}"
    execute(
        "depth-sweep",
        opts,
        lambda progress, on_partial=None: run_depth_sweep(
            model,
            init_cfg,
            run,
            depths,
            seeds,
            opts.inits,
            opts.placements,
            grads,
            progress,
            on_partial,
            ref,
        ),
        Outputs(
            # (the plotting module, and matplotlib, are imported when drawn: `tinit sweep`
            # imports them while its workers measure)
            figures=lambda r: {
                "depth_sweep": _plots().plot_depth_sweep(
                    r["depth_sweep_summary"], r["depth_sweep_fit"], title, r["depth_sweep_theory"]
                )
            },
            tables=lambda r: [
                _plots().depth_sweep_table(
                    r["depth_sweep_fit"], r["depth_sweep_summary"], f"Transfer ({title})"
                ),
                _plots().depth_sweep_slope_table(
                    r["depth_sweep_fit"], r["depth_sweep_summary"], "Slope against L"
                ),
                *_predicted(r["depth_sweep_fit"]),
            ],
        ),
        plan=lambda: depth_sweep_plan(
            model, init_cfg, run, depths, seeds, opts.inits, opts.placements, grads, ref
        ),
    )


def _depths(depths: list[int]) -> str:
    return ",".join(map(str, depths)) if len(depths) <= 10 else f"{depths[0]}..{depths[-1]} ({len(depths)})"


def _predicted(fit) -> list:
    table = _plots().depth_sweep_prediction_table(fit, "Large-width prediction of the transfer")
    return [] if table is None else [table]


def _plots():
    from ..results import plot_depth_sweep

    return plot_depth_sweep
