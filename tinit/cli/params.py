"""``tinit params``: exact parameter accounting, tied vs untied, and the FFN check."""

from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from ..model.config import ModelConfig
from ..model.presets import get_preset
from . import options as opt
from .configs import Options, configs_or_exit
from .options import Param

if TYPE_CHECKING:
    import pandas as pd
    from rich.table import Table


def human(n: float) -> str:
    """1.5e9 -> '1.5B', 124439808 -> '124M' (three significant digits)."""
    for factor, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= factor:
            return f"{n / factor:.3g}{suffix}"
    return f"{n:.3g}"


def share(x: float) -> str:
    return "-" if x == 0 else "<0.1%" if x < 1e-3 else f"{100 * x:.1f}%"


def params_table(params: "pd.DataFrame", summary: "pd.DataFrame", title: str) -> "Table":
    """One row per component: per block, tied and untied totals, share of each."""
    import pandas as pd

    from ..results.tables import summary_table

    s = summary.iloc[0]
    t = summary_table(title, f"block components x {int(s['n_layers'])} layers")
    for col in ("component", "per block", "tied", "share", "untied", "share"):
        t.add_column(col, justify="left" if col == "component" else "right", no_wrap=True)
    tied = params[params["tying"] == "tied"].set_index("component")
    untied = params[params["tying"] == "untied"].set_index("component")
    for name in tied.index:
        per_block = tied.loc[name, "per_block"]
        t.add_row(
            name,
            "" if pd.isna(per_block) else f"{int(per_block):,}",
            f"{int(tied.loc[name, 'count']):,}",
            share(tied.loc[name, "fraction"]),
            f"{int(untied.loc[name, 'count']):,}",
            share(untied.loc[name, "fraction"]),
        )
    t.add_row("[bold]total", f"{int(s['per_block']):,}", f"[bold]{int(s['total_tied']):,}", "",
              f"[bold]{int(s['total_untied']):,}", "")  # fmt: skip
    return t


def params_lines(summary: "pd.DataFrame", ffn: "pd.DataFrame", preset: str | None) -> "list[Text]":
    """The saving, its fractions, the FFN check and the preset's caveats, one line each."""
    import pandas as pd

    s = summary.iloc[0]
    V, d, saved = int(s["vocab_size"]), int(s["d_model"]), int(s["saved"])
    lines = [f"Tied head: V·d = {V:,} × {d:,} = {int(s['saved_theory']):,} parameters saved"]
    if saved != int(s["saved_theory"]):
        lines.append(f"  (exactly {saved:,} with --bias: the untied head also has {V:,} biases)")
    if not pd.isna(s["reference_total"]):
        lines.append(
            f"{saved:,} saved, {100 * s['saved_frac_reference']:.1f}% of {human(s['reference_total'])}"
        )
    lines.append(
        f"This model: {int(s['total_untied']):,} untied -> {int(s['total_tied']):,} tied "
        f"({100 * s['saved_frac_untied']:.1f}% saved)"
    )
    classic, exact, nearest, rounded, own = (r for r in ffn.itertuples(index=False))
    lines.append(
        f"FFN: 3·d·(8d/3) {'=' if exact.equal else '!='} 2·d·4d = {classic.weights:,.0f} "
        f"at the unrounded d_ff = {exact.d_ff:.2f}"
    )
    for label, r in (
        ("nearest", nearest),
        ("8d/3 up to a multiple of 64", rounded),
        (f"this model, {own.ffn}", own),
    ):
        lines.append(f"  d_ff = {int(r.d_ff)} ({label}): {r.weights:,.0f}, {100 * (r.ratio - 1):+.2f}%")
    if preset is not None:
        p = get_preset(preset)
        if p.n_kv_heads:
            counted = int(s["n_kv_heads_model"]) if not pd.isna(s.get("n_kv_heads_model")) else None
            lines.append(
                f"{preset} uses GQA ({p.n_kv_heads} K/V heads): counted with --kv-heads {counted}"
                if counted
                else f"{preset} uses GQA ({p.n_kv_heads} K/V heads): this count is multi-head"
            )
            if not pd.isna(s["gqa_saving"]):
                lines.append(f"  with GQA: {int(s['total_gqa']):,} ({int(s['gqa_saving']):,} fewer)")
        ours = int(s["total"]) if pd.isna(s["total_gqa"]) else int(s["total_gqa"])
        if p.published_total:
            same = "matches" if ours == p.published_total else f"differs by {ours - p.published_total:+,}"
            lines.append(f"{preset}: published total {p.published_total:,}; this count {same}")
    return [Text(line) for line in lines]


def describe(model: ModelConfig, preset: str | None) -> str:
    return (
        (f"{preset}: " if preset else "")
        + f"L={model.n_layers}, d={model.d_model}, V={model.vocab_size}, heads={model.n_heads}, "
        f"d_ff={model.d_ff}, {model.ffn}, {model.norm}, {model.positions}"
        + (", bias" if model.bias else "")
        + (", post-norm" if model.norm_position == "post" else "")
    )


OPTIONS = (
    Param(
        "reference_total",
        Annotated[
            float | None,
            typer.Option(
                "--reference-total",
                help="Also give the tied-head saving as a fraction of this many parameters (e.g. 1.5e9).",
                callback=opt.positive,
                rich_help_panel="Counting",
                show_default=False,
            ),
        ],
        None,
    ),
)


def params(opts: Options) -> None:
    """Count every parameter of the configured model exactly: embedding, positions,
    per-block attention, FFN and norms, final norm, head; tied vs untied head (the
    saving V*d and its share), and the check that a gated FFN at d_ff = 8d/3 holds as
    many weights as the classic FFN at 4d. --post-norm counts the post-norm stack
    (no final norm).

    Writes params.csv, ffn.csv, summary.csv, params.png and config.json to a new run folder.
    """
    reference_total, preset = opts.reference_total, opts.preset
    from ..experiments.measure.params import run_params
    from ..results.plot_params import plot_params
    from .runner import Outputs, execute

    position = opts.placements[0] if opts.placements else "pre"
    model = configs_or_exit(lambda: opts.model_config(norm_position=position))
    kv = get_preset(preset).n_kv_heads if preset else None
    if model.n_kv_heads is not None and model.n_kv_heads != model.n_heads:
        kv = None  # the model is built (and counted) with its GQA already
    if kv and model.n_heads % kv:
        kv = None  # the heads were overridden: the preset's GQA grouping no longer applies
    title = describe(model, preset)
    execute(
        "params",
        opts,
        lambda progress, on_partial: run_params(
            model, reference_total=reference_total, n_kv_heads=kv, progress=progress, on_partial=on_partial
        ),
        Outputs(
            figures=lambda r: {"params": plot_params(r["params"], r["ffn"], r["summary"], title)},
            tables=lambda r: [
                params_table(r["params"], r["summary"], f"Parameters ({title})"),
                *params_lines(r["summary"], r["ffn"], preset),
            ],
        ),
    )
