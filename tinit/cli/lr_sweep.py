"""``tinit lr-sweep``: the final loss against the peak learning rate at several depths
and widths, and whether the optimum moves with either (the muP / CompleteP question)."""

import typer

from . import options as opt
from .configs import Options
from .training import (
    checkpoint_text,
    checkpointing,
    data_args,
    grid,
    parse_widths,
    rules_notes,
    variance_figure,
)

OPTIONS = (opt.SEEDS, opt.SAVE_STEPS)


def lr_sweep(opts: Options) -> None:
    """Sweep the peak learning rate at several depths and widths: final held-out loss
    against log2 lr, one curve per depth and width, each seed's optimum lr* (parabola
    through the best grid point and its neighbours), and the drift of log2 lr* along
    width (at each depth) and depth (at each width): the mean of the per-seed
    least-squares slopes d log2 lr* / d log2 x with its standard error over seeds, and a
    verdict (transfers / drifts / not resolved) that states its criterion. 0 means the
    optimum transfers: the muP (width) and CompleteP (depth) question. With several
    schemes, lr_drift_compare.csv says whose optimum moves less, or that the seeds do not
    resolve it. Schemes train with their optimizer rules (--param-rules).

    Writes the files of `tinit train` plus lr_optimum.csv (seed-mean curves),
    lr_optimum_seeds.csv, lr_drift.csv, lr_drift_compare.csv, lr_sweep.png and
    lr_transfer.png (lr* against width and depth, error bars over seeds); with
    --save-steps, each run's checkpoints as `tinit train` writes them.
    """
    from ..experiments.training.lr_sweep import run_lr_sweep
    from ..results.plot_lr_transfer import drift_tables, plot_lr_transfer
    from ..results.plot_train import plot_loss_curves, plot_lr_sweep
    from ..results.report_train import train_table
    from .configs import configs_or_exit
    from .runner import Outputs, execute

    ds = parse_widths(opts)
    # several widths each take their default FFN width (a preset's d_ff is one width's)
    opts = opts.replace(d_model=ds[0], **({"d_ff": None} if len(ds) > 1 else {}))
    train_grid, title = grid(opts, ds)
    data = train_grid.data
    saves, writer = checkpointing(opts)
    for w in ds[1:]:  # every width a valid model (heads, RoPE's even head size)
        configs_or_exit(lambda w=w: opts.model_config(d_model=w))
    if len(ds) > 1:
        title = title.replace(f"d={ds[0]}", f"d={','.join(map(str, ds))}")

    def figures(r) -> dict:
        import pandas as pd

        drift = r.frames.get("lr_drift", pd.DataFrame(columns=["init", "norm_position", "warmup", "slope"]))
        out = {"lr_sweep": plot_lr_sweep(r["summary"], r["lr_optimum"], drift, data.floor, title)}
        if "lr_drift" in r.frames:
            lrs = [float(v) for v in r["runs"]["peak_lr"]]
            out["lr_transfer"] = plot_lr_transfer(r["lr_optimum_seeds"], drift, title, (min(lrs), max(lrs)))
        out["loss_curves"] = plot_loss_curves(r["train"], data.floor, title)
        return {**out, **variance_figure(r, title)}

    def plan():
        from ..experiments.training.lr_sweep import lr_sweep_plan

        if saves:  # (a point's worker has no run folder of the command's to write them into)
            raise typer.BadParameter("writes into tinit lr-sweep's run folder; tinit sweep's points save no "
                                     "checkpoints: run tinit lr-sweep --save-steps",
                                     param_hint="'--save-steps'")  # fmt: skip
        return lr_sweep_plan(train_grid, data_args(opts))

    execute(
        "lr-sweep",
        opts,
        lambda progress, on_partial=None, run_dir=None: run_lr_sweep(
            train_grid, progress, on_partial, on_checkpoint=writer(run_dir), save_steps=saves
        ),
        Outputs(
            figures=figures,
            tables=lambda r: [
                train_table(r["summary"], f"tinit lr-sweep ({title})"),
                *drift_tables(r.frames),
                *checkpoint_text(r),
            ],
            notes=rules_notes(opts),
        ),
        plan=plan,
        wants_run_dir=True,
    )
