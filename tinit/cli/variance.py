"""``tinit variance``: residual-stream variance at every addition vs the law."""

from . import options as opt
from .common import describe
from .configs import Options, configs_or_exit


def variance(
    preset: opt.PresetName = None,
    n_layers: opt.Layers = 12,
    d_model: opt.DModel = 256,
    n_heads: opt.Heads = 4,
    d_ff: opt.DFF = None,
    vocab_size: opt.Vocab = 1024,
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
    branch: opt.Branch = "model",
    branch_var: opt.BranchVar = 1.0,
    init: opt.Init = "both",
    init_file: opt.InitFile = None,
    base_width: opt.BaseWidth = 256,
    base_depth: opt.BaseDepth = 1,
    sigma: opt.Sigma = "0.02",
    embed_std: opt.EmbedStd = None,
    seed: opt.Seed = 0,
    seq_len: opt.SeqLen = 128,
    batch: opt.Batch = 8,
    device: opt.Device = "auto",
    dtype: opt.DType = "float32",
    stream: opt.Stream = None,
    tf32: opt.TF32 = False,
    threads: opt.Threads = None,
    out: opt.Out = None,
    format: opt.Format = "png",
    quiet: opt.Quiet = False,
) -> None:
    """Measure the residual-stream variance at every one of the 2L additions for each
    init scheme (--init: a comma list or 'all'; default naive and depth-scaled) and norm
    placement, against each scheme's law and closed form (naive: v_2L = v0 + 2L s^2),
    with the tokens' similarity (rank collapse) at every addition.

    Writes variance.csv, summary.csv, variance.png and config.json to a new run folder.
    """
    opts = Options(locals())
    # torch, pandas and matplotlib load here, when the command runs, not for --help
    from ..experiments.measure.variance import run_variance
    from ..results.plots import plot_variance
    from ..results.tables import overflow_notes, variance_table
    from .runner import Outputs, execute

    model, init_cfg, run = configs_or_exit(
        lambda: (opts.model_config(), opts.init_config(), opts.run_config())
    )
    title = describe(opts, model)
    execute(
        "variance",
        opts,
        lambda progress, on_partial=None: run_variance(
            model, init_cfg, run, opts.inits, opts.placements, progress, on_partial
        ),
        Outputs(
            figures=lambda r: {"variance": plot_variance(r["variance"], title)},
            tables=lambda r: [variance_table(r["summary"], f"Residual-stream variance ({title})"),
                              *overflow_notes(r["summary"], (r.meta.get("run") or {}).get("dtype"))],
        ),
        plan=lambda: _plan(model, init_cfg, run, opts.inits, opts.placements),
    )


def _plan(*args):
    # only `tinit sweep` plans: a plain run does not import the other experiments
    from ..experiments.measure.variance import variance_plan

    return variance_plan(*args)
