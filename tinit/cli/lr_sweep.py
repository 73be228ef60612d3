"""``tinit lr-sweep``: the final loss against the peak learning rate at several depths
and widths, and whether the optimum moves with either (the muP / CompleteP question)."""

from typing import Annotated

import typer

from . import options as opt
from .configs import Options
from .options import TRAIN
from .training import data_args, grid, parse_widths, rules_notes, variance_figure


def lr_sweep(
    ctx: typer.Context,
    layers: opt.Depths = "2,4,8",
    seeds: Annotated[
        int, typer.Option("--seeds", help="Seeds per configuration.", min=1, max=opt.MAX_SEEDS,
                          rich_help_panel=TRAIN,
                          show_default=True)
    ] = 1,
    lr: Annotated[
        str, typer.Option("--lr", help="Peak learning rates, a comma list.", metavar="1e-3,...",
                          rich_help_panel=TRAIN, show_default=True)
    ] = "1e-3,3e-3,1e-2,3e-2",
    warmup: Annotated[str, typer.Option("--warmup", help="Warmup steps, a comma list.", metavar="30,...",
                                        rich_help_panel=TRAIN, show_default=True)] = "30",
    data: opt.Data = "markov",
    markov_k: opt.MarkovK = 4,
    eval_batches: opt.EvalBatches = 4,
    steps: opt.Steps = 200,
    weight_decay: opt.WeightDecay = 0.1,
    min_lr_ratio: opt.MinLrRatio = 0.1,
    grad_clip: opt.GradClip = 1.0,
    eval_every: opt.EvalEvery = 25,
    diverge_margin: opt.DivergeMargin = 1.0,
    probe_points: opt.ProbePoints = 3,
    param_rules: opt.ParamRules = "on",
    compile: opt.Compile = False,
    no_autocast: opt.NoAutocast = False,
    # small enough for a 2-core CPU: a 4-layer, d=48 model on a 64-token Markov language
    # reaches its entropy floor in 300 steps of 16 x 32 tokens (seconds per run); the dtype,
    # streaming and branches are the training's own (float32 master weights, held blocks,
    # model branches)
    preset: opt.PresetName = None,
    widths: opt.Widths = "48",
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
    init: opt.Init = "scaled",
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
    lr_transfer.png (lr* against width and depth, error bars over seeds).
    """
    opts = Options(locals())
    from ..experiments.training.lr_sweep import run_lr_sweep
    from ..results.plot_lr_transfer import drift_tables, plot_lr_transfer
    from ..results.plot_train import plot_loss_curves, plot_lr_sweep
    from ..results.report_train import train_table
    from .configs import configs_or_exit
    from .runner import Outputs, execute

    ds = parse_widths(opts, ctx)
    # several widths each take their default FFN width (a preset's d_ff is one width's)
    opts = opts.replace(d_model=ds[0], **({"d_ff": None} if len(ds) > 1 else {}))
    args, data, title = grid(ctx, opts)
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

        model, init, run, tcfg, _data, *axes = args
        return lr_sweep_plan(model, init, run, tcfg, data_args(opts), data.floor, *axes, ds)

    execute(
        "lr-sweep",
        opts,
        lambda progress, on_partial=None: run_lr_sweep(*args, progress, on_partial, ds),
        Outputs(
            figures=figures,
            tables=lambda r: [train_table(r["summary"], f"tinit lr-sweep ({title})"),
                              *drift_tables(r.frames)],
            notes=rules_notes(opts),
        ),
        plan=plan,
    )
