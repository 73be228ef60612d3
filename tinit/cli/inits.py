"""``tinit inits [NAME]``: the init catalogue, or one scheme's std per role and layer."""

from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from .configs import Options, configs_or_exit
from .options import Param

if TYPE_CHECKING:
    import pandas as pd


def _rule_lines(formula: str, multipliers: str) -> str:
    """A scheme's rules, one role group a line, its role list spaced ("o, down: ...") so
    that a narrow terminal wraps between words; then its multipliers."""
    lines = []
    for part in formula.split("; "):
        roles, sep, rule = part.partition(": ")
        lines.append(roles.replace(",", ", ") + sep + rule)
    if multipliers != "none":
        lines += [f"multiplier: {m}" for m in multipliers.split("; ")]
    return "\n".join(lines)


def catalogue_table(df: "pd.DataFrame"):
    """One row per scheme: the placement it presumes, its v_2L(L) (what a reader picks
    a scheme by), its rules and multipliers; every cell wraps between words only."""
    from ..results.tables import summary_table

    t = summary_table(
        "Init catalogue",
        "v_2L(L): the stream variance after L layers (pre-norm style "
        "additions, s^2: a branch's variance); tinit inits NAME: one scheme's std per role "
        "and layer; the upstream code each follows (repository@commit, file) in inits.csv",
    )
    for col in ("scheme", "placement", "v_2L(L)", "rules (std per role) and multipliers"):
        t.add_column(col, overflow="ellipsis")
    for r in df.itertuples(index=False):
        place = (r.placement or "any") + (" + QK-norm" if r.qk_norm else "")
        t.add_row(r.name + (f" ({r.aliases})" if r.aliases else ""), place, r.closed_form or "-",
                  _rule_lines(r.formula, r.multipliers))  # fmt: skip
    return t


def stds_table(df: "pd.DataFrame", title: str):
    """One row per role: distribution, multiplier and the std at the first, second and
    last layer (all layers are in init_stds.csv)."""
    from ..results.tables import fmt, summary_table

    t = summary_table(title, "std: the rule's value (trunc: before truncation); all layers in init_stds.csv")
    for col in ("role", "dist", "l=first", "l=1", "l=last", "mult"):
        t.add_column(col, justify="left" if col in ("role", "dist") else "right", no_wrap=True)
    for role, d in df.groupby("role", sort=False):
        d = d.sort_values("layer")
        v = d["std"].to_numpy()
        t.add_row(role, d["distribution"].iloc[0], fmt(v[0]), fmt(v[1]) if len(v) > 2 else "",
                  fmt(v[-1]) if len(v) > 1 else "", fmt(float(d["multiplier"].iloc[0])))  # fmt: skip
    return t


OPTIONS = (
    Param(
        "name",
        Annotated[
            str | None, typer.Argument(help="A scheme: show its std per role and layer.", metavar="NAME")
        ],
        None,
    ),
)


def inits(opts: Options) -> None:
    """Print the init catalogue (name, roles touched, formula, multipliers, presumed
    placement; the upstream code each follows, repository@commit and file, and sources in
    inits.csv) and write inits.csv; or, with NAME, that scheme's
    std per role and layer at the current shape, written to init_stds.csv (columns
    scheme, role, layer, std, distribution, multiplier, bound, std_drawn).
    """
    name, sigma = opts.name, opts.sigma
    from ..experiments.measure.inits import run_inits
    from ..model.catalogue import known, names
    from ..model.draws import ffn_of
    from ..model.structure import apply_scheme, describe_structure
    from .runner import Outputs, execute

    custom = opts.custom_schemes
    if custom:
        name = name or custom[0].name
    if name is not None and not known(name, custom):
        raise typer.BadParameter(f"unknown init scheme {name!r}; choose from {', '.join(names(custom))}",
                                 param_hint="'NAME'")  # fmt: skip
    model, init_cfg = configs_or_exit(lambda: (opts.model_config(), opts.init_config()))
    if name is None:
        outputs = Outputs(tables=lambda r: [catalogue_table(r["inits"])])
    else:
        s = init_cfg.lookup(name)
        built = apply_scheme(model, s, init_cfg.schemes)
        title = (f"{name}: std per role at L={built.n_layers}, d={built.d_model}, "
                 f"d_ff={ffn_of(built, s)[1]}, sigma={sigma}")  # fmt: skip
        notes = [Text(f"{s.name}: {s.description}"), Text(f"structure: {describe_structure(s, built)}"),
                 Text(f"multipliers: {s.multipliers()}; v_2L: {s.closed_form or '-'}"),
                 Text(f"not modelled: {s.not_modelled or '-'}"),
                 Text("upstream: " + ("; ".join(s.upstream) or "-"))]  # fmt: skip
        outputs = Outputs(tables=lambda r: [stds_table(r["init_stds"], title), *notes])
    execute(
        "inits",
        opts,
        lambda progress, on_partial: run_inits(model, init_cfg, name, progress, on_partial),
        outputs,
    )
