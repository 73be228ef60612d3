"""``tinit norms``: RMSNorm vs LayerNorm, behaviour (invariances) and cost (time, saved
bytes, parameters)."""

import math
from typing import TYPE_CHECKING, Annotated

import typer

from .common import positive_int_list
from .configs import Options
from .options import Param

if TYPE_CHECKING:
    import pandas as pd
    from rich.table import Table


def _bytes(n: float) -> str:
    if n is None or math.isnan(n):
        return "-"
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} GiB"


def behaviour_table(frame: "pd.DataFrame") -> "Table":
    from ..results.tables import fmt_column, summary_table

    t = summary_table(
        "RMSNorm vs LayerNorm: behaviour (eps = 0)",
        "scale: x -> 3x; shift: x -> x + 2; input mean 0.5; tol = 8 eps(dtype) max|y|. "
        "Pass: |dev| <= tol where invariant/agree, > tol where changes/differ",
    )
    for col in ("check", "norm", "impl", "expected", "max|dev|", "tol", "pass"):
        t.add_column(col, justify="right" if col in ("max|dev|", "tol") else "left", no_wrap=True)
    devs, tols = fmt_column(frame["max_abs_dev"], 3), fmt_column(frame["tolerance"], 2)
    for i, r in enumerate(frame.itertuples(index=False)):
        ok = "[green]pass[/]" if r.passed else "[red]FAIL[/]"
        dev, tol = devs[i], tols[i]
        check = "vs eager" if r.check.endswith("_vs_eager") else r.check
        t.add_row(check, r.norm, r.impl, r.expected, dev, tol, ok)
    return t


def ratio_table(ratio: "pd.DataFrame", timing: "pd.DataFrame", title: str) -> "Table":
    from ..results.tables import fmt_column, summary_table

    t = summary_table(
        title,
        "size: rows x d_model; times are medians; min: LN/RMS of the fastest samples; "
        "bwd: bytes saved for backward beyond the input and parameters",
    )
    for col in ("impl", "pass", "size", "RMS ms", "LN ms", "LN/RMS", "min", "RMS bwd", "LN bwd"):
        t.add_column(col, justify="left" if col in ("impl", "pass", "size") else "right", no_wrap=True)
    rms, ln = fmt_column(ratio["rmsnorm_ms"], 3), fmt_column(ratio["layernorm_ms"], 3)
    for i, r in enumerate(ratio.to_dict("records")):
        t.add_row(
            r["impl"], "fwd" if r["pass"] == "forward" else "fwd+bwd", f"{r['rows']}x{r['d_model']}",
            rms[i], ln[i], f"{r['time_ratio']:.2f}",
            f"{r['time_ratio_min']:.2f}", _bytes(r["rmsnorm_saved_bytes_extra"]),
            _bytes(r["layernorm_saved_bytes_extra"]),
        )  # fmt: skip
    for impl, err in (
        timing.loc[~timing["available"].astype(bool), ["impl", "error"]].drop_duplicates().values
    ):
        t.add_row(impl, "-", "-", "unavailable", "", "", "", "", style="yellow")
        t.caption += f"\n{impl}: {err}"
    return t


OPTIONS = (
    Param(
        "rows",
        Annotated[
            str,
            typer.Option(
                "--rows", help="Rows (tokens) per timed tensor, a comma list.", metavar="INT,INT,..."
            ),
        ],
        "256,1024",
    ),
    Param(
        "repeats",
        Annotated[
            int,
            typer.Option("--repeats", help="Timed samples per measurement; the median is reported.", min=1),
        ],
        10,
    ),
)


def norms(opts: Options) -> None:
    """RMSNorm vs LayerNorm. Behaviour: both invariant to x -> a x, only LayerNorm to
    x -> x + c, equal on zero-mean input. Cost: forward and forward+backward time of
    hand-written, torch.nn.functional and (optionally) compiled versions over --rows x
    --d-model, the LayerNorm/RMSNorm ratio, bytes saved for backward and parameters.

    Writes norms_behaviour.csv, norms_timing.csv, norms_ratio.csv, norms.png and
    config.json to a new run folder.
    """
    rows, widths, repeats = opts.rows, opts.widths, opts.repeats
    warmup, compile, threads = opts.warmup, opts.compile, opts.threads
    from ..experiments.bench.norms import run_norms
    from ..results.plot_norms import plot_norms
    from .runner import Outputs, execute

    rows_list = positive_int_list(rows, "--rows")
    d_list = positive_int_list(widths, "--d-model")

    def title(r) -> str:
        n = r.meta["torch_threads"]
        where = r.meta["device_name"]
        if not str(r.meta.get("device", "")).startswith("cuda"):  # CPU threads matter only on the CPU
            where += f" ({n} thread{'s' if n != 1 else ''})"
        return f"{opts.dtype} on {where}, median of {repeats}"

    execute(
        "norms",
        opts,
        lambda progress, on_partial=None: run_norms(
            opts.run_config(),
            rows_list,
            d_list,
            repeats,
            progress,
            seed=opts.seed,
            warmup=warmup,
            compile=compile,
            threads=threads,
            on_partial=on_partial,
        ),  # fmt: skip
        Outputs(
            figures=lambda r: {"norms": plot_norms(r["norms_timing"], r["norms_ratio"], title(r))},
            tables=lambda r: [
                behaviour_table(r["norms_behaviour"]),
                ratio_table(r["norms_ratio"], r["norms_timing"], f"RMSNorm vs LayerNorm: cost ({title(r)})"),
            ],
        ),
    )
