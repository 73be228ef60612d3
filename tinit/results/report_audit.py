"""What ``tinit audit`` shows: the terminal table of deviating parameter groups, and
audit.md (verdict first, then the deviating groups, the figures, a paragraph per
finding). Works on the frames and meta alone (no import of the experiments)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from rich.table import Table

from ..model.placements import normed_stream_names
from .palette import ROLE_STYLES
from .style import (
    coincidence_note,
    coincidences,
    footnote,
    key_legend,
    new_figure_with_key,
    styled,
    suptitle,
    wants_log,
)
from .tables import fmt, summary_table

EXIT_DEVIATING = 3

VERDICT_MEANING = {
    "ok": "matches the expected std (|z| <= z_max or within rtol) or constant",
    "off-scheme": "a std (or constant) other than the scheme's",
    "pytorch-default": "nn.Linear left at PyTorch's kaiming-uniform default (std 1/sqrt(3 fan_in))"
    " or nn.Embedding at N(0, 1): nobody re-initialised it",
    "zero": "every element 0",
    "constant": "every element the same non-zero value",
    "non-finite": "NaN or inf present",
    "unchecked": "role unknown: no expectation (but none of the scheme-free failures either)",
}


def verdict(meta: dict) -> tuple[bool, str]:
    """(passed, one sentence) from the audit's meta."""
    n, bad = meta.get("n_params", 0), meta.get("n_deviating", 0)
    unchecked = meta.get("n_unchecked", 0)
    crit = f"|z| <= {meta.get('z_max', 5):g} or within {100 * meta.get('rtol', 0.01):g}% of the expected std"
    # a parameter with no expectation was not checked: PASS counts only those that were
    skipped = f"; {unchecked} unchecked (role unknown)" if unchecked else ""
    chk = (meta.get("stream_check") or {}).get("as-built") or {}
    stream = ""
    if chk and not chk.get("agrees"):
        err = chk.get("max_rel_err")
        stream = (" The stream measurement does not describe this model: stream_in + branch differs from "
                  f"block {chk.get('worst_layer')}'s output" + (f" by {err:.3g}" if err is not None else "")
                  + " (name the additions with --sites).")  # fmt: skip
    params = f"{n - unchecked} checked parameters" if unchecked else f"{n} parameters"
    if bad == 0:
        return True, f"PASS: all {params} match {meta.get('expect_source')} ({crit}){skipped}.{stream}"
    source = meta.get("expect_source")
    return False, f"FAIL: {bad} of {params} deviate from {source} ({crit}){skipped}.{stream}"


def stream_answer(r, why: bool = True) -> str:
    """The stream's answer for one summary row ``r`` (a configuration of the audit):
    v_0, v_2L, their ratio, and what the law v_0 + sum s_k^2 predicts from the measured
    branch variances, with its relative error (the terminal and audit.md say the same)."""
    reason = ""
    if why:
        reason = "; " + (
            "post-norm: the law uses each addition's measured input variance"
            if r.norm_position in normed_stream_names()
            else "the gap is the stream-branch cross terms 2 cov(x, F)"
        )
    return (
        f"v_0 = {fmt(r.v0)}, v_2L = {fmt(r.v_final)} ({fmt(r.v_final_rel, 3)} x v_0);"
        f" mean branch variance {fmt(r.branch_var_mean, 3)}; the law v_0 + sum s_k^2 predicts"
        f" {fmt(r.pred_cumulative_final)} ({100 * r.rel_err_cumulative:+.1f}%{reason};"
        f" largest |corr| {fmt(r.max_abs_cross_corr, 2)})."
    )


def stream_lines(summary: pd.DataFrame | None) -> list[str]:
    """The terminal's stream answer, one line per configuration (as-built, the --init
    re-draw), after the weight verdict."""
    if summary is None or not len(summary):
        return []
    return [
        f"Stream ({r.init}, L={r.n_layers}): {stream_answer(r, why=False)}"
        for r in summary.itertuples(index=False)
    ]


def _std_range(lo: float, hi: float) -> str:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "-"
    return fmt(lo, 3) if math.isclose(lo, hi, rel_tol=1e-3) else f"{fmt(lo, 3)}..{fmt(hi, 3)}"


def deviating_groups(groups: pd.DataFrame) -> pd.DataFrame:
    return groups[groups["verdict"] != "ok"]


def weights_table(groups: pd.DataFrame, title: str) -> Table:
    """Every group of parameters that is not ``ok``: pattern, role, verdict, measured vs expected."""
    t = summary_table(title, "z: (std - expected) / (expected sqrt(1/2n)); layers: block indices")
    for col in ("parameters", "role", "verdict", "n", "layers", "std", "expected", "max|z|"):
        left = col in ("parameters", "role", "verdict")
        t.add_column(col, justify="left" if left else "right", overflow="fold" if left else "ellipsis")
    bad = deviating_groups(groups)
    for r in bad.itertuples(index=False):
        style = "yellow" if r.verdict == "unchecked" else "red"
        t.add_row(
            r.pattern, r.role, f"[{style}]{r.verdict}[/]", str(r.count), r.layers,
            _std_range(r.std_min, r.std_max), _std_range(r.expected_min, r.expected_max), fmt(r.max_abs_z, 3),
        )  # fmt: skip
    if bad.empty:
        t.add_row(
            "(every parameter is ok)", "", "[green]ok[/]", str(int(groups["count"].sum())), "", "", "", ""
        )
    return t


@styled
def plot_weight_stds(weights: pd.DataFrame, title: str = "") -> Figure:
    """Measured std / expected std per layer for each Gaussian role (1 = as expected),
    each role in its own colour and marker (:data:`ROLE_STYLES`, never a configuration's
    colour); parameters whose verdict is not ok ringed in black; roles drawn on top of
    each other named under the figure. Log scale when the ratios span more than 30x; a
    zero matrix (ratio 0) is then drawn on the bottom edge."""
    from matplotlib.ticker import MaxNLocator

    fig, (ax,), key = new_figure_with_key(row_height=3.6, key_height=0.55)
    d = weights[(weights["expected_kind"] == "std") & (weights["expected"] > 0)]
    d = d.assign(ratio=d["std"] / d["expected"])
    log = wants_log(d["ratio"], ratio=30)
    floor = 0.5 * d.loc[d["ratio"] > 0, "ratio"].min() if log and (d["ratio"] > 0).any() else 0.0
    d = d.assign(y=d["ratio"].where(d["ratio"] > 0, floor))
    roles = list(d.groupby("role", sort=False))
    series = {}
    for i, (role, g) in enumerate(roles):
        g = g.sort_values("layer")
        color, marker = ROLE_STYLES.get(role, ("#bdbdbd", "X"))
        # open markers of decreasing size: roles at the same ratio nest instead of hiding
        ax.plot(g["layer"], g["y"], marker=marker, ls="-" if len(g) > 1 else "none", lw=1.2, mfc="none",
                mew=1.3, ms=max(9.0 - 0.6 * i, 4.5), label=role, color=color, gid=f"role:{role}")  # fmt: skip
        series[role] = g.set_index("layer")["y"]
    bad = d[d["verdict"] != "ok"]
    if len(bad):
        ax.plot(bad["layer"], bad["y"], ls="none", marker="o", ms=14, mfc="none", mec="k", mew=1.5,
                label="verdict not ok")  # fmt: skip
    ax.axhline(1.0, color="0.3", lw=1.0, ls="--", label="expected")
    ax.set_xlabel("layer (-1: embeddings, L: head)")
    ax.set_ylabel("measured std / expected std" + (" (0 drawn at the bottom)" if floor else ""))
    ax.set_title("Weight std against the expected init, per role")
    if log:
        ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    # roles measured at the same layers that lie on top of each other: named, not hidden
    layered = {r: v for r, v in series.items() if len(v) > 1}
    aligned = {}
    for r, v in layered.items():
        aligned.setdefault(tuple(v.index), {})[r] = v.to_numpy()
    groups = [g for same in aligned.values() for g in coincidences(same, ax)]
    key_legend(key, ax.get_legend_handles_labels()[0], ncol=6)
    suptitle(fig, title)
    footnote(fig, [coincidence_note(groups, "roles")])
    return fig


def _md_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        cells = [fmt(v, 4) if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _finding(r) -> str:
    where = f"`{r.pattern}` (role {r.role}, {r.count} tensor{'s' if r.count > 1 else ''}, layers {r.layers})"
    std, exp = _std_range(r.std_min, r.std_max), _std_range(r.expected_min, r.expected_max)
    text = {
        "off-scheme": f"measured std {std} where the scheme expects {exp}"
        f" (largest |z| {fmt(r.max_abs_z, 3)})."
        + (
            " These matrices write into the residual stream: their std sets each branch's variance and so"
            " the growth of the stream with depth."
            if r.role in ("o", "down")
            else ""
        ),
        "pytorch-default": f"std {std}, no element beyond 1/sqrt(fan_in): the kaiming-uniform default of an"
        f" nn.Linear (or N(0, 1) of an nn.Embedding) that no init function touched; expected {exp}.",
        "zero": f"every element is 0 (expected {exp}). A zero stream-writing matrix silences its branch;"
        " a zero reader makes the matrices after it receive no gradient.",
        "constant": f"every element is the same non-zero value (expected {exp}):"
        " symmetric units stay symmetric.",
        "non-finite": "contains NaN or inf: every measurement downstream is meaningless.",
        "unchecked": "its role could not be told from the structure, so it has no expectation; its values"
        f" (std {std}) are reported, not judged. Name the sites with --sites if this is a branch weight.",
    }[r.verdict]
    return f"- **{r.verdict}**: {where}: {text}"


def write_audit_md(frames: dict[str, pd.DataFrame], meta: dict, run_dir: Path, figures: list[str]) -> Path:
    """audit.md: verdict, deviating groups, what was found, figures, findings."""
    passed, sentence = verdict(meta)
    groups = frames["weight_groups"]
    bad = deviating_groups(groups)
    lines = [f"# tinit audit: {meta.get('source', 'model')}", "", f"**{sentence}**", ""]
    lines += [
        f"Exit code {0 if passed else EXIT_DEVIATING}. Weights checked against {meta.get('expect_source')};"
        f" tokens: {meta.get('batch')} x {meta.get('seq_len')} uniform random ids (seed {meta.get('seed')}),"
        f" {meta.get('dtype')} on {meta.get('device')}.",
        "",
        "## Deviating groups",
        "",
    ]
    if bad.empty:
        lines.append("None: every parameter is `ok`.")
    else:
        shown = bad.assign(
            std=[_std_range(a, b) for a, b in zip(bad["std_min"], bad["std_max"], strict=True)],
            expected=[
                _std_range(a, b) for a, b in zip(bad["expected_min"], bad["expected_max"], strict=True)
            ],
        )[["pattern", "role", "verdict", "count", "layers", "std", "expected", "max_abs_z"]]
        lines.append(_md_table(shown))
    lines += ["", "## What was found", "", "```", *meta.get("sites", []), "```", ""]
    for label, chk in (meta.get("stream_check") or {}).items():
        err = chk.get("max_rel_err")
        if err is None:
            lines.append(f"- {label}: the block outputs could not be compared with stream_in + branch.")
        elif chk.get("agrees"):
            lines.append(
                f"- {label}: stream_in + branch equals every block's output (largest relative"
                f" difference {err:.2g} <= {chk['tolerance']:g}): the sites describe the residual."
            )
        else:
            lines.append(
                f"- {label}: **stream_in + branch disagrees with block {chk['worst_layer']}'s output**"
                f" (relative difference {err:.3g} > {chk['tolerance']:g}): the additions as found do"
                " not sum to the stream (scaled residual, post-norm, wrong --sites); the variance"
                " rows follow the reconstruction, not the model."
            )
    if "scheme" in meta:
        kept = meta.get("scheme_kept_as_built") or []
        lines.append(
            f"- scheme `{meta['scheme']}`: the same model re-initialised by tinit's scheme;"
            f" {meta.get('scheme_weights_deviating')} of its parameters deviate from that scheme"
            + (f"; {len(kept)} of unknown role kept as built" if kept else "")
            + "."
        )
    lines += ["", "## Figures", ""] + [f"![{f}]({f}.png)" for f in figures]
    lines += ["", "## Findings", ""]
    for r in bad.itertuples(index=False):
        lines.append(_finding(r))
    summ = frames.get("summary")
    if summ is not None and len(summ):
        for r in summ.itertuples(index=False):
            lines.append(f"- **stream ({r.init})**: {stream_answer(r)}")
    gs = frames.get("grad_summary")
    if gs is not None and len(gs):
        for r in gs.itertuples(index=False):
            lines.append(
                f"- **gradients ({r.init})**: initial loss {r.loss:.4g}"
                f" (ln V = {meta.get('ln_vocab', math.nan):.4g}"
                f" for uniform predictions); stream-gradient RMS at k=0 / at k=2L ="
                f" {fmt(r.stream_grad_ratio, 3)} (identity path predicts {fmt(r.pred_stream_grad_ratio, 3)});"
                " W_down gradient norm first/last"
                f" layer {fmt(r.down_ratio_first_last, 3)}, W_O {fmt(r.o_ratio_first_last, 3)}."
            )
    unknown = meta.get("n_unknown", 0)
    if unknown:
        lines.append(f"- {unknown} parameter(s) have role `unknown` (listed in weights.csv, never dropped).")
    lines += ["", "Verdicts: " + "; ".join(f"`{k}`: {v}" for k, v in VERDICT_MEANING.items()) + ".", ""]
    path = Path(run_dir) / "audit.md"
    path.write_text("\n".join(lines))
    return path
