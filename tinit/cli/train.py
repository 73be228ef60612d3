"""``tinit train``: training runs of tinit's model, from the same options and the same
``--init`` schemes as the measurements at initialization."""

from typing import Annotated

import typer
from rich.text import Text

from . import options as opt
from .configs import Options, configs_or_exit
from .options import TRAIN
from .training import grid, rules_notes, variance_figure


def train(
    ctx: typer.Context,
    layers: opt.Depths = "4",
    seeds: Annotated[
        int,
        typer.Option(
            "--seeds",
            help="Seeds per configuration: --seed, --seed+1, ... (init and "
            "batch order re-drawn; the data stays that of --seed).",
            min=1, max=opt.MAX_SEEDS, rich_help_panel=TRAIN, show_default=True,
        ),
    ] = 1,
    lr: Annotated[str, typer.Option("--lr", help="Peak learning rates, a comma list.", metavar="1e-2,...",
                                    rich_help_panel=TRAIN, show_default=True)] = "1e-2",
    warmup: Annotated[str, typer.Option("--warmup", help="Warmup steps, a comma list.", metavar="30,...",
                                        rich_help_panel=TRAIN, show_default=True)] = "30",
    data: opt.Data = "markov",
    markov_k: opt.MarkovK = 4,
    eval_batches: opt.EvalBatches = 4,
    steps: opt.Steps = 300,
    weight_decay: opt.WeightDecay = 0.1,
    min_lr_ratio: opt.MinLrRatio = 0.1,
    grad_clip: opt.GradClip = 1.0,
    eval_every: opt.EvalEvery = 25,
    diverge_margin: opt.DivergeMargin = 1.0,
    probe_points: opt.ProbePoints = 3,
    save_steps: Annotated[
        str | None,
        typer.Option(
            "--save-steps",
            help="Save each run's weights at these steps (0: the init; final: the last step) as "
            "safetensors with a JSON of the model, scheme and seed, in checkpoints/ of the run folder "
            "(tinit audit --checkpoint reads them).",
            metavar="0,100,final", rich_help_panel=TRAIN,
        ),
    ] = None,
    param_rules: opt.ParamRules = "on",
    compile: opt.Compile = False,
    no_autocast: opt.NoAutocast = False,
    # small enough for a 2-core CPU: a 4-layer, d=48 model on a 64-token Markov language
    # reaches its entropy floor in 300 steps of 16 x 32 tokens (seconds per run); the dtype,
    # streaming and branches are the training's own (float32 master weights, held blocks,
    # model branches)
    preset: opt.PresetName = None,
    d_model: opt.DModel = 48,
    n_heads: opt.Heads = 4,
    d_ff: opt.DFF = None,
    vocab_size: opt.Vocab = 64,
    norm: opt.Norm = "rmsnorm",
    ffn: opt.Ffn = "swiglu",
    positions: opt.Positions = "rope",
    attention: opt.Attention = "causal",
    untie: opt.Untie = False,
    bias: opt.Bias = False,
    no_attn_scale: opt.NoAttnScale = False,
    pre_norm: opt.PreNorm = False,
    post_norm: opt.PostNorm = False,
    norm_positions: opt.NormPositions = None,
    qk_norm: opt.QKNorm = None,
    n_kv_heads: opt.KVHeads = None,
    init: opt.Init = "both",
    init_file: opt.InitFile = None,
    base_width: opt.BaseWidth = 256,
    base_depth: opt.BaseDepth = 1,
    sigma: opt.Sigma = "0.02",
    embed_std: opt.EmbedStd = None,
    seed: opt.Seed = 0,
    seq_len: opt.SeqLen = 32,
    batch: opt.Batch = 16,
    device: opt.Device = "auto",
    tf32: opt.TF32 = False,
    threads: opt.Threads = None,
    out: opt.Out = None,
    format: opt.Format = "png",
    quiet: opt.Quiet = False,
) -> None:
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
    opts = Options(locals())
    from ..experiments.training.saving import parse_save_steps
    from ..experiments.training.train import run_train
    from ..results.checkpoints import CheckpointWriter, checkpoint_lines
    from ..results.plot_train import plot_final_vs_depth, plot_loss_curves, train_table
    from ..results.report_compare import compare_table
    from .runner import Outputs, execute

    args, data, title = grid(ctx, opts)
    saves = configs_or_exit(lambda: parse_save_steps(save_steps, opts.steps))

    def experiment(progress, on_partial=None, run_dir=None):
        writer = CheckpointWriter(run_dir) if saves and run_dir is not None else None
        saving = saves if writer else None
        return run_train(*args, progress, on_partial, on_checkpoint=writer, save_steps=saving)

    execute(
        "train",
        opts,
        experiment,
        Outputs(
            figures=lambda r: {
                "loss_curves": plot_loss_curves(r["train"], data.floor, title),
                # against depth only when there is more than one depth to set side by side
                **({"final_vs_depth": plot_final_vs_depth(r["summary"], data.floor, title)}
                   if r["summary"]["n_layers"].nunique() > 1 else {}),  # fmt: skip
                **variance_figure(r, title),
            },
            tables=lambda r: [train_table(r["summary"], f"tinit train ({title})")]
            + ([compare_table(r["compare"])] if "compare" in r.frames else [])
            + [Text(line) for line in checkpoint_lines(r.meta.get("checkpoints", []))],
            notes=rules_notes(opts),
        ),
    )
