"""``tinit coord-check``: every layer's activation scale against width and depth over
the first steps of training, per scheme, with a verdict (microsoft/mup's coord check,
both axes)."""

from typing import Annotated, Literal

import typer

from . import options as opt
from .configs import Options, configs_or_exit
from .training import parse_widths

CHECK = "Coordinate check"


def _opt(*decls, help, panel=CHECK, **kw):
    return typer.Option(*decls, help=help, rich_help_panel=panel, show_default=True, **kw)


def coord_check(
    widths: opt.Widths = "64,128,256,512",
    layers: opt.Depths = "2,8",
    seeds: Annotated[
        int, _opt("--seeds", help="Seeds per (scheme, width, depth): --seed, --seed+1, ...", min=1,
             max=opt.MAX_SEEDS)
    ] = 3,
    steps: Annotated[
        int, _opt("--steps", help="Optimizer steps; the RMS is recorded at steps 0..N.", min=1)
    ] = 4,
    lr: Annotated[
        float,
        _opt(
            "--lr",
            help="Constant Adam learning rate (the scheme's rules scale it per group).",
            callback=opt.learning_rate,
        ),
    ] = 1e-2,
    param_rules: Annotated[
        Literal["on", "off"],
        _opt(
            "--param-rules",
            help="on: each scheme's optimizer rules (muP's lr / m on hidden matrices); "
            "off: one lr for every parameter, to show what the rules do.",
        ),
    ] = "on",
    # CPU defaults: d = 64..512 and L = 2, 8 at 3 seeds in about a minute of CPU on 2 cores
    # (one fixed batch of 4 x 32 tokens; a layer's RMS averages 128 x d coordinates); float32
    # weights, held blocks and model branches are the training's own
    n_heads: opt.Heads = 4,
    d_ff: opt.DFF = None,
    vocab_size: opt.Vocab = 256,
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
    init: opt.Init = "gpt2,mup",
    init_file: opt.InitFile = None,
    base_width: opt.BaseWidth = 256,
    base_depth: opt.BaseDepth = 1,
    sigma: opt.Sigma = "0.02",
    embed_std: opt.EmbedStd = None,
    seed: opt.Seed = 0,
    seq_len: opt.SeqLen = 32,
    batch: opt.Batch = 4,
    device: opt.Device = "auto",
    tf32: opt.TF32 = False,
    threads: opt.Threads = None,
    out: opt.Out = None,
    format: opt.Format = "png",
    quiet: opt.Quiet = False,
) -> None:
    """Train each scheme for --steps Adam steps on one fixed batch of the Markov language
    at every width x depth x seed, and record the RMS of every layer's output in each
    step's forward pass (the embedding, each block's attention and FFN branch, the stream
    after each block, the logits): microsoft/mup's coord check, which records the mean
    |x| after 1, 2, 3 steps, with the depth axis added. A scheme is width-stable
    (depth-stable) when the log-log slope of every quantity's RMS against width (depth)
    is within 0.25 of 0 at every step (the logits: at most 0.25, they may vanish).
    Placement: --norm-position (or --pre-norm/--post-norm) when given, else each scheme's
    own (mup-example: post-norm, as mup's Transformer example), pre-norm for those that
    presume none (tinit's mup, CompleteP).

    Writes coord_check.csv (one row per scheme, width, depth, seed, step, layer,
    quantity), coord_check_fit.csv (slopes against width and depth per scheme, step and
    quantity, with their SE over seeds, and the verdicts), coord_check.png (against
    width), coord_check_depth.png (against depth), coord_check_layers_*.png (one line
    per layer, mup's view) and config.json.
    """
    opts = Options(locals())
    from ..experiments.measure.depth_sweep import parse_layers
    from ..experiments.training.coord_check import CoordConfig, coord_check_plan, make_grid, run_coord_check
    from ..experiments.training.coord_fit import summary
    from .runner import Outputs, execute

    widths = parse_widths(opts)
    depths = configs_or_exit(lambda: parse_layers(layers))
    model, init_cfg, run, coord = configs_or_exit(
        lambda: (
            opts.model_config(n_layers=depths[-1], d_model=widths[-1]),
            opts.init_config(),
            opts.run_config(widths=widths, depths=depths, seeds=seeds),
            CoordConfig(steps=steps, lr=lr, param_rules=param_rules == "on"),
        )
    )
    positions = opts.placements
    configs_or_exit(
        lambda: make_grid(model, init_cfg, run, opts.inits, positions, widths, depths, seeds, opts.d_ff,
                          coord)
    )
    title = coord_title(opts, model, widths, depths, seeds, lr, param_rules, steps)

    def figures(r):
        from ..results.plot_coord_check import coord_figures

        return coord_figures(r["coord_check"], r["coord_check_fit"], title)

    def tables(r):
        from ..results.plot_coord_check import coord_table

        return [coord_table(summary(r["coord_check_fit"]), f"tinit coord-check ({title})")]

    execute(
        "coord-check",
        opts,
        lambda progress, on_partial=None: run_coord_check(
            model,
            init_cfg,
            run,
            coord,
            opts.inits,
            positions,
            widths,
            depths,
            seeds,
            opts.d_ff,
            progress,
            on_partial,
        ),
        Outputs(figures=figures, tables=tables),
        plan=lambda: coord_check_plan(
            model, init_cfg, run, coord, opts.inits, positions, widths, depths, seeds, opts.d_ff
        ),  # fmt: skip
    )


def coord_title(opts: Options, model, widths, depths, seeds: int, lr: float, rules: str,
                steps: int) -> str:  # fmt: skip
    """What every figure and the table say the run was (a scheme that builds its own FFN
    is named beside --ffn)."""
    init = opts.init_config()
    own = [f"{n}: {s.ffn}" for n in opts.inits if (s := init.lookup(n)).ffn is not None]
    parts = [
        f"L={','.join(map(str, depths))}", f"d={','.join(map(str, widths))}", f"heads={model.n_heads}",
        model.norm, model.ffn + (f" ({'; '.join(own)})" if own else ""), f"sigma={opts.sigma}",
        *([] if opts.embed_std is None else [f"embed std {opts.embed_std:g}"]),
        f"{'tied' if model.tie_embeddings else 'untied'} head", f"{seeds} seed{'s' if seeds > 1 else ''}",
        f"Adam lr {lr:g} (rules {rules})", f"{steps} step{'s' if steps > 1 else ''}",
        f"batch {opts.batch} x seq {opts.seq_len}", f"V={model.vocab_size}",
    ]  # fmt: skip
    return ", ".join(parts)
