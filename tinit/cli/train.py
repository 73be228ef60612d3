"""``tinit train``: training runs of tinit's model, from the same options and the same
``--init`` schemes as the measurements at initialization."""

from . import options as opt
from .configs import Options
from .training import checkpoint_text, checkpointing, grid, rules_notes, variance_figure

OPTIONS = (opt.SEEDS, opt.SAVE_STEPS)


def train(opts: Options) -> None:
    """Train tinit's model with AdamW (linear warmup, cosine decay, gradient clipping) over
    the grid --init schemes x norm positions x --layers x --lr x --warmup x --seeds, on
    held weights.

    Writes train.csv (per step: configuration, step, tokens, lr, train loss, eval loss
    every --eval-every, grad norm, status), update_ratios.csv (per step and layer,
    ||dW||/||W|| of W_O and W_down), variance_during_training.csv, runs.csv, summary.csv
    (final eval loss mean and SE over seeds, diverged count, tokens/s), with two or more
    schemes compare.csv (each against the first, paired by seed, with a verdict),
    loss_curves.png, with two or more depths final_vs_depth.png, and config.json.
    """
    from ..experiments.training.train import run_train
    from ..results.plot_train import plot_final_vs_depth, plot_loss_curves
    from ..results.report_compare import compare_table
    from ..results.report_train import train_table
    from .runner import Outputs, execute

    train_grid, title = grid(opts)
    data = train_grid.data
    saves, writer = checkpointing(opts)

    def experiment(progress, on_partial, run_dir):
        return run_train(train_grid, progress, on_partial, on_checkpoint=writer(run_dir), save_steps=saves)

    execute(
        "train",
        opts,
        experiment,
        Outputs(
            figures=lambda r: {
                "loss_curves": plot_loss_curves(r["train"], data.floor, title),
                # against depth only when there is more than one depth to set side by side
                **(
                    {"final_vs_depth": plot_final_vs_depth(r["summary"], data.floor, title)}
                    if r["summary"]["n_layers"].nunique() > 1
                    else {}
                ),  # fmt: skip
                **variance_figure(r, title),
            },
            tables=lambda r: (
                [train_table(r["summary"], f"tinit train ({title})")]
                + ([compare_table(r["compare"])] if "compare" in r.frames else [])
                + checkpoint_text(r)
            ),
            notes=rules_notes(opts),
        ),
        wants_run_dir=True,
    )
