"""``tinit coord-check``: every layer's activation scale against width and depth over
the first steps of training, per scheme, with a verdict (microsoft/mup's coord check,
both axes)."""

from . import options as opt
from .configs import Options, configs_or_exit
from .training import parse_widths

OPTIONS = (opt.SEEDS,)


def coord_check(opts: Options) -> None:
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
    layers, seeds = opts.layers, opts.seeds
    from ..experiments.configs import parse_layers
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
            opts.config(CoordConfig),
        )
    )
    # the grid, by the keywords of run_coord_check, coord_check_plan and make_grid
    grid = {"model": model, "init": init_cfg, "run": run, "coord": coord, "inits": opts.inits,
            "norm_positions": opts.placements, "widths": widths, "depths": depths, "seeds": seeds,
            "d_ff": opts.d_ff}  # fmt: skip
    configs_or_exit(lambda: make_grid(**grid))
    title = coord_title(opts, model, widths, depths, seeds, coord.lr, opts.param_rules, coord.steps)

    def figures(r):
        from ..results.plot_coord_check import coord_figures

        return coord_figures(r["coord_check"], r["coord_check_fit"], title)

    def tables(r):
        from ..results.plot_coord_check import coord_table

        return [coord_table(summary(r["coord_check_fit"]), f"tinit coord-check ({title})")]

    execute(
        "coord-check",
        opts,
        lambda progress, on_partial=None: run_coord_check(**grid, progress=progress, on_partial=on_partial),
        Outputs(figures=figures, tables=tables),
        plan=lambda: coord_check_plan(**grid),
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
