"""``tinit claims``: the init primer's claims about training, each tested over seeds
with a verdict that states its criterion."""

from typing import Annotated

import typer

from . import options as opt
from .configs import Options, configs_or_exit
from .options import TRAIN
from .training import data_for, describe, model_vocab, train_config, variance_figure, warmups_within


def claims(
    ctx: typer.Context,
    shallow: Annotated[
        int, typer.Option("--shallow", help="Layers of the small model.", min=1, rich_help_panel=TRAIN,
                          show_default=True)
    ] = 4,
    deep: Annotated[
        int, typer.Option("--deep", help="Layers of the deep stacks.", min=1, rich_help_panel=TRAIN,
                          show_default=True)
    ] = 24,
    seeds: Annotated[
        int, typer.Option("--seeds", min=2, max=opt.MAX_SEEDS, rich_help_panel=TRAIN, show_default=True,
                          help="Seeds per configuration (>= 2: each verdict needs a standard error).")
    ] = 5,
    lr: Annotated[
        float, typer.Option("--lr", help="Ordinary peak lr.", callback=opt.learning_rate,
                            rich_help_panel=TRAIN, show_default=True)
    ] = 1e-2,
    warmup: Annotated[
        int, typer.Option("--warmup", min=0, rich_help_panel=TRAIN, show_default=True,
                          help="Ordinary warmup steps (and the unstable setting's comparison).")
    ] = 50,
    high_lr: Annotated[
        float, typer.Option("--high-lr", help="The deliberately unstable peak lr.",
                            callback=opt.learning_rate, rich_help_panel=TRAIN, show_default=True)
    ] = 1.5e-2,
    tol: Annotated[
        float, typer.Option("--tol", callback=opt.positive, rich_help_panel=TRAIN, show_default=True,
                            help="Smallest final-loss difference that counts (nats).")
    ] = 0.02,
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
    compile: opt.Compile = False,
    no_autocast: opt.NoAutocast = False,
    # small enough for a 2-core CPU: a 4-layer, d=48 model on a 64-token Markov language
    # reaches its entropy floor in 300 steps of 16 x 32 tokens (seconds per run); the dtype,
    # streaming and branches are the training's own (float32 master weights, held blocks,
    # model branches); each claim chooses its
    # depths, schemes (a user's --init-file has no claim to test), placements, norm, FFN and tying
    preset: opt.PresetName = None,
    d_model: opt.DModel = 48,
    n_heads: opt.Heads = 4,
    vocab_size: opt.Vocab = 64,
    positions: opt.Positions = "rope",
    attention: opt.Attention = "causal",
    bias: opt.Bias = False,
    no_attn_scale: opt.NoAttnScale = False,
    qk_norm: opt.QKNorm = None,
    n_kv_heads: opt.KVHeads = None,
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
    """Test the init primer's claims about training, each over --seeds seeds: deep post-norm
    needs warmup at a high lr; pre-norm trains the same deep stack without it; naive init
    falls behind the depth-scaled one at depth, which transfers from --shallow to --deep;
    RMSNorm loses nothing against LayerNorm; SwiGLU beats GELU at equal parameters; tying
    helps a small model. Each verdict (holds / fails / inconclusive) states its criterion
    (difference against 2 standard errors and --tol). A failing claim is a finding, not an
    error: the command exits 0 once every run is done.

    Writes claims.csv, claims.md, claims.png, claims_deep_curves.png,
    claims_shallow_curves.png, the files of `tinit train` and config.json.
    """
    opts = Options(locals())
    warmup = warmups_within(ctx, [warmup], steps)[0]
    opts = opts.replace(warmup=warmup)
    from ..experiments.training.claims import ClaimsConfig, run_claims
    from ..results.plot_train import plot_claims, plot_loss_curves
    from ..results.report_train import claims_table, write_claims_md
    from .runner import Outputs, execute

    def build():
        data = data_for(opts)
        model = opts.model_config(vocab_size=model_vocab(ctx, opts, data))
        ccfg = opts.config(ClaimsConfig)
        return data, model, opts.init_config(), opts.run_config(), train_config(opts, lr, warmup), ccfg

    data, model, init, run, tcfg, ccfg = configs_or_exit(build)
    title = describe(opts, model, data, tcfg) + f", {seeds} seeds"

    def curves(r, deep_stack: bool) -> dict:
        """claims_deep_curves / claims_shallow_curves, for a stack with runs (a stopped
        run may have none of the shallow ones yet)."""
        tr = r["train"]
        rows = tr[(tr["n_layers"] == deep) == deep_stack]
        if not len(rows):
            return {}
        name = "claims_deep_curves" if deep_stack else "claims_shallow_curves"
        # the figure's title says the depth (and every other setting all its runs share)
        return {name: plot_loss_curves(rows, data.floor, title)}

    execute(
        "claims",
        opts,
        lambda progress, on_partial=None: run_claims(
            model, init, run, tcfg, data, ccfg, progress, on_partial
        ),
        Outputs(
            figures=lambda r: {
                "claims": plot_claims(r["runs"], data.floor, f"Claims: {title}"),
                **curves(r, True),
                **curves(r, False),
                **variance_figure(r, title),
            },
            tables=lambda r: (
                [claims_table(r["claims"], f"tinit claims ({title})")] if "claims" in r.frames else []
            ),
            files=lambda r, d: (
                write_claims_md(r["claims"], r.meta, d, opts.format, title) if "claims" in r.frames else []
            ),
        ),
    )
