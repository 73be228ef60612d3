"""``tinit claims``: the init primer's claims about training, each tested over seeds
with a verdict that states its criterion."""

from . import options as opt
from .configs import Options, configs_or_exit
from .options import TRAIN
from .training import (
    checkpoint_text,
    checkpointing,
    data_for,
    describe,
    model_vocab,
    train_config,
    variance_figure,
    warmups_within,
)

OPTIONS = (
    opt.option("shallow", int, "--shallow", help="Layers of the small model.", panel=TRAIN, default=4, min=1),
    opt.option("deep", int, "--deep", help="Layers of the deep stacks.", panel=TRAIN, default=24, min=1),
    opt.SEEDS,
    opt.option("high_lr", float, "--high-lr", help="The deliberately unstable peak lr.", panel=TRAIN,
               default=1.5e-2, callback=opt.learning_rate),
    opt.option("tol", float, "--tol", panel=TRAIN, default=0.02, callback=opt.positive,
               help="Smallest final-loss difference that counts (nats)."),
    opt.SAVE_STEPS,
)  # fmt: skip


def claims(opts: Options) -> None:
    """Test the init primer's claims about training, each over --seeds seeds: deep post-norm
    needs warmup at a high lr; pre-norm trains the same deep stack without it; naive init
    falls behind the depth-scaled one at depth, which transfers from --shallow to --deep;
    RMSNorm loses nothing against LayerNorm; SwiGLU beats GELU at equal parameters; tying
    helps a small model. Each verdict (holds / fails / inconclusive) states its criterion
    (difference against 2 standard errors and --tol). A failing claim is a finding, not an
    error: the command exits 0 once every run is done.

    Writes claims.csv, claims.md, claims.png, claims_deep_curves.png,
    claims_shallow_curves.png, the files of `tinit train` and config.json; with
    --save-steps, each run's checkpoints as `tinit train` writes them.
    """
    deep, seeds, lr, warmup = opts.deep, opts.seeds, opts.lr, opts.warmup
    data, steps = opts.data, opts.steps
    warmup = warmups_within(opts, [warmup], steps)[0]
    opts = opts.replace(warmup=warmup)
    from ..experiments.training.claims import ClaimsConfig, run_claims
    from ..results.plot_train import plot_claims, plot_loss_curves
    from ..results.report_train import claims_table, write_claims_md
    from .runner import Outputs, execute

    def build():
        data = data_for(opts)
        model = opts.model_config(vocab_size=model_vocab(opts, data))
        ccfg = opts.config(ClaimsConfig)
        return data, model, opts.init_config(), opts.run_config(), train_config(opts, lr, warmup), ccfg

    data, model, init, run, tcfg, ccfg = configs_or_exit(build)
    saves, writer = checkpointing(opts)
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
        lambda progress, on_partial=None, run_dir=None: run_claims(
            model, init, run, tcfg, data, ccfg, progress, on_partial, writer(run_dir), saves
        ),
        Outputs(
            figures=lambda r: {
                "claims": plot_claims(r["runs"], data.floor, f"Claims: {title}"),
                **curves(r, True),
                **curves(r, False),
                **variance_figure(r, title),
            },
            tables=lambda r: (
                ([claims_table(r["claims"], f"tinit claims ({title})")] if "claims" in r.frames else [])
                + checkpoint_text(r)
            ),
            files=lambda r, d: (
                write_claims_md(r["claims"], r.meta, d, opts.format, title) if "claims" in r.frames else []
            ),
        ),
        wants_run_dir=True,
    )
