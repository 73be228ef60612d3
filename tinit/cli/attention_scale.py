"""``tinit attention-scale``: attention-logit variance and softmax sharpness at init,
with and without the 1/sqrt(d_h) scale."""

from typing import TYPE_CHECKING

import typer

from ..model.config import ConfigError
from . import options as opt
from .common import positive_int_list
from .configs import Options, configs_or_exit

if TYPE_CHECKING:
    import pandas as pd
    from rich.table import Table


def attention_scale_table(frame: "pd.DataFrame", title: str = "") -> "Table":
    """One row per (input, d_h, scale): logit variance against theory, and the softmax's
    relative entropy and largest weight."""
    from ..results.tables import error_style, fmt, fmt_column, pct, summary_table

    t = summary_table(
        title, "err = measured / theory - 1 (se: standard error); H = entropy / log(visible keys)"
    )
    for col in ("input", "d_h", "scale", "logit var", "theory", "err", "err/se", "H", "max p"):
        t.add_column(col, justify="left" if col in ("input", "scale") else "right", no_wrap=True)
    records = frame.to_dict("records")
    zs = [
        (r["logit_var"] - r["pred_logit_var"]) / r["logit_var_se"] if r["logit_var_se"] > 0 else float("nan")
        for r in records
    ]
    var, pred, z_col = fmt_column(frame["logit_var"]), fmt_column(frame["pred_logit_var"]), fmt_column(zs, 2)
    h_col, p_col = fmt_column(frame["entropy_rel"], 3), fmt_column(frame["max_weight"], 3)
    for i, r in enumerate(records):
        t.add_row(
            r["input"], str(r["head_dim"]), "1/sqrt(d_h)" if r["scaled"] else "none",
            var[i], pred[i], f"[{error_style(r['rel_err'])}]{pct(r['rel_err'])}[/]", z_col[i], h_col[i],
            p_col[i],
        )  # fmt: skip
    model = frame[frame["input"] == "model"]
    if len(model):
        lo, hi = model["input_ms"].min(), model["input_ms"].max()
        ms = fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}..{fmt(hi)}"
        errs = ", ".join(pct(e) for e in model.loc[~model["scaled"], "rel_err_ms"])
        t.caption += (
            f"\nmodel: the normalised stream's mean square is m = {ms} (the norm's eps), "
            f"not 1; against theory x m^2 the errors are {errs}"
        )
    return t


OPTIONS = (opt.HEAD_DIMS,)


def attention_scale(opts: Options) -> None:
    """Attention logits at init for each head size d_h: their variance without and with
    the 1/sqrt(d_h) scale, the softmax entropy (relative to its maximum) and the largest
    attention weight, for unit-variance q, k (theory d_h and 1) and for the model's own
    W_Q, W_K on the normalised stream (theory d_h (d sigma^2)^2 and (d sigma^2)^2).

    Writes attention_scale.csv, attention_scale.png and config.json to a new run folder.
    """
    head_dims, n_heads, positions, sigma = opts.head_dims, opts.n_heads, opts.positions, opts.sigma
    from ..experiments.measure.attention_scale import check_head_dims, run_attention_scale
    from ..results.plot_attention_scale import plot_attention_scale
    from .runner import Outputs, execute

    try:
        dims = check_head_dims(positive_int_list(head_dims, "--head-dims"), positions)
    except ConfigError as exc:
        raise typer.BadParameter(exc.message, param_hint="'--head-dims'") from None
    model, init_cfg, run = configs_or_exit(
        lambda: (
            opts.model_config(d_model=n_heads * dims[0], d_ff=None),
            opts.init_config(),
            opts.run_config(head_dims=dims),
        )
    )
    title = (
        f"{model.n_heads} heads (model input: d = {model.n_heads} x d_h), sigma={sigma}, "
        f"{model.norm}, {model.positions}, {model.attention}, batch {run.batch} x seq {run.seq_len}, "
        f"{run.dtype}, seed {init_cfg.seed}"
    )
    execute(
        "attention-scale",
        opts,
        lambda progress, on_partial=None: run_attention_scale(
            model, init_cfg, run, dims, progress, on_partial=on_partial
        ),
        Outputs(
            figures=lambda r: {"attention_scale": plot_attention_scale(r["attention_scale"], title)},
            tables=lambda r: [
                attention_scale_table(r["attention_scale"], f"Attention logits at init ({title})")
            ],
        ),
    )
