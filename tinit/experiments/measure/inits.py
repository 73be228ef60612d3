"""The init catalogue as tables: every scheme (``inits``), or one scheme's std per
role and layer at a given shape (``init_stds``). Nothing is built or drawn: the
numbers are the scheme's rules evaluated (:mod:`tinit.model.schemes`)."""

from __future__ import annotations

import dataclasses

import pandas as pd

from ...model.catalogue import get_scheme, names
from ...model.config import GATED_FFNS, InitConfig, ModelConfig, RunConfig
from ...model.draws import environment, evaluate, ffn_of, resolve
from ...model.init import role_shape_of
from ...model.schemes import MATRIX_ROLES
from ...model.structure import apply_scheme, structure_record
from ..configs import check_configs
from ..driver import Run
from ..result import ExperimentResult, Partial, Progress

INITS_COLUMNS = [
    "name", "description", "roles", "formula", "multipliers", "placement", "qk_norm", "architecture",
    "closed_form", "not_modelled", "upstream", "sources", "aliases",
]  # fmt: skip
STDS_COLUMNS = ["scheme", "role", "layer", "std", "distribution", "multiplier", "bound", "std_drawn"]


def catalogue_frame(schemes: list[str] | None = None, custom=()) -> pd.DataFrame:
    """One row per scheme: name, description, roles it changes, their rules, its
    multipliers, the placement (and QK-norm) it presumes, the architecture its codebase
    runs, its closed form v_2L(L), and the upstream code it follows (repository @
    commit, file)."""
    rows = []
    for name in schemes or names(custom):
        s = get_scheme(name, custom)
        rows.append({
            "name": s.name, "description": s.description, "roles": ",".join(s.touched) or "-",
            "formula": s.formula(), "multipliers": s.multipliers(), "placement": s.placement or "",
            "qk_norm": s.qk_norm, "architecture": s.architecture(), "closed_form": s.closed_form,
            "not_modelled": s.not_modelled,
            "upstream": "; ".join(s.upstream), "sources": "; ".join(s.sources),
            "aliases": ",".join(s.aliases),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=INITS_COLUMNS)


def _layers(role: str, L: int) -> list[int]:
    if role in ("embed", "pos"):
        return [-1]
    if role == "head":
        return [L]
    return list(range(L))


def stds_frame(model: ModelConfig, init: InitConfig) -> pd.DataFrame:
    """One row per (role, layer) of the scheme ``init.scheme`` at the shape ``model``:
    the rule's std (or constant), its distribution, the truncation bound, the std the
    draws really have (a truncated normal's is smaller), and the multiplier on the
    role's output path: the branch multiplier g for block matrices, the embedding
    multiplier for ``embed``/``pos``, the logit multiplier for ``head``."""
    s = init.definition
    L = model.n_layers
    gated = ffn_of(model, s)[0] in GATED_FFNS
    roles = [
        r
        for r in MATRIX_ROLES
        if not (r == "pos" and model.positions != "learned")
        and not (r == "head" and model.tie_embeddings)
        and not (r == "gate" and not gated)
    ]
    if s.branch_learned:
        roles.append("gain")
    rows = []
    for role in roles:
        for layer in _layers(role, L):
            env = environment(model, init, layer, role_shape_of(model, role, init))
            draw = resolve(s, role, env)
            if role in ("embed", "pos"):
                mult = evaluate(s.embed_mult, env, s.name)
            elif role == "head":
                mult = evaluate(s.logit_mult, env, s.name)
            else:
                mult = evaluate(s.branch_mult, env, s.name)
            rows.append({"scheme": init.scheme, "role": role, "layer": layer, "std": draw.std,
                         "distribution": draw.dist, "multiplier": mult, "bound": draw.bound,
                         "std_drawn": draw.std_drawn})  # fmt: skip
    return pd.DataFrame(rows, columns=STDS_COLUMNS)


def run_inits(
    model: ModelConfig | None = None,
    init: InitConfig | None = None,
    scheme: str | None = None,
    progress: Progress | None = None,
    on_partial: Partial | None = None,
) -> ExperimentResult:
    """Frames ``inits`` (the catalogue) or, with ``scheme``, ``init_stds`` (that
    scheme's std per role and layer at the shape ``model``)."""
    model, init = model or ModelConfig(), init or InitConfig()
    if scheme is not None:  # the model the scheme runs (as ModelConfig.from_scheme), the user's on top
        model = apply_scheme(model, scheme, init.schemes)
    meta = {"model": model.to_dict(), "init": init.to_dict(), "scheme": scheme}
    if scheme is None:
        frames = {"inits": catalogue_frame(custom=init.schemes)}
    else:
        meta["structure"] = {scheme: structure_record(scheme, model, init.schemes)}
        # a rule undefined at some layer of this shape is bad input, found before the table
        check_configs(model, init, RunConfig(seq_len=model.max_seq_len), [(scheme, model.norm_position)])
        frames = {"init_stds": stds_frame(model, dataclasses.replace(init, scheme=scheme))}
    driver = Run(meta, lambda: frames, NOT_APPLICABLE, progress=progress)
    driver.tick()  # one unit: the rules evaluated, nothing drawn (nothing to keep on a failure)
    return driver.result()


#: Only a truncated normal has a truncation bound: the other draws' ``bound`` is empty.
NOT_APPLICABLE = {"init_stds": {"bound": lambda df: df["distribution"] != "trunc"}}


def catalogue_markdown() -> str:
    """The catalogue as the README's markdown table (tests check that README holds
    exactly this text, so the two cannot drift)."""
    lines = [
        "| scheme | roles it changes | rules | multipliers | architecture (modelled) | not modelled "
        "| v_2L(L) | upstream |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in catalogue_frame(names()).itertuples(index=False):
        name = f"`{r.name}`" + (f" (alias `{r.aliases}`)" if r.aliases else "")
        cells = [name, r.roles.replace(",", ", "), r.formula, r.multipliers, r.architecture,
                 r.not_modelled or "-", r.closed_form or "-", r.upstream.replace("; ", "<br>")]  # fmt: skip
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
