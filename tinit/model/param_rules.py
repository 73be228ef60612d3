"""A parametrization's optimizer rules, applied: per-group learning rate, weight decay
and Adam eps.

muP, CompleteP, depth-muP and Megatron's muP are not inits alone: each codebase also
scales the optimizer per parameter group (its rules are declared with the scheme, as
:class:`~tinit.model.schemes.ParamRules` in :mod:`tinit.model.catalogue`, each naming the
upstream file it follows). :func:`optimizer_groups` is the one place they are applied:
``tinit train``, ``lr-sweep`` and ``coord-check`` build their AdamW from it. Output and
branch multipliers (muP's readout 1/m, CompleteP's (L/L0)^-alpha) are not optimizer
rules: the model's forward applies them, so they are never applied here too.

Every parameter falls into one group of :data:`~tinit.model.schemes.PARAM_GROUPS` by
where it sits and its shape: inside a block a matrix is ``hidden_matrix`` and anything
else (norm gains, biases, ReZero's gain) ``hidden_vector``; outside the blocks the
token and position embeddings are ``embedding`` (a tied head is the token embedding),
the untied head's matrix ``readout``, the rest (final norm, head bias) ``final_vector``.
Weight decay reaches matrices only, as in tinit's trainer before the rules existed; a
rule multiplies it.

>>> from tinit.model import InitConfig, ModelConfig, Transformer
>>> cfg = ModelConfig(n_layers=2, d_model=128, n_heads=2, vocab_size=64)
>>> m = Transformer(cfg, InitConfig("mup", base_width=32))
>>> [(g["name"], g["lr"]) for g in optimizer_groups(m, lr=1e-2)][:2]
[('embedding', 0.01), ('hidden_matrix', 0.0025)]
"""

from __future__ import annotations

import math
from typing import Any

from .config import ConfigError, InitConfig
from .draws import environment, evaluate
from .schemes import PARAM_GROUPS, GroupRule, ParamRules


def group_of(name: str, ndim: int) -> str:
    """The parameter group of the model's parameter ``name`` with ``ndim`` dimensions."""
    if name.startswith("blocks."):
        return "hidden_matrix" if ndim >= 2 else "hidden_vector"
    owner = name.split(".")[0]
    if owner in ("embed", "pos"):
        return "embedding"
    if owner == "head" and ndim >= 2:
        return "readout"
    return "final_vector"


def multipliers(rules: ParamRules | None, cfg, init: InitConfig) -> dict[str, tuple[float, float, float]]:
    """(lr, weight decay, eps) multipliers of every group for a model ``cfg`` under
    ``rules`` (all 1 without rules)."""
    env = environment(cfg, init, -1)
    out = {}
    for group in PARAM_GROUPS:
        r = rules.rule(group) if rules is not None else GroupRule()
        what = f"{init.scheme}: optimizer rule of {group}"
        keys = ("lr", "weight_decay", "eps")
        out[group] = tuple(evaluate(getattr(r, k), env, f"{what} ({k})") for k in keys)
    return out


def optimizer_groups(
    model,
    init: InitConfig | None = None,
    *,
    lr: float,
    weight_decay: float = 0.0,
    eps: float = 1e-8,
    rules: bool = True,
) -> list[dict[str, Any]]:
    """Torch param-group dicts for ``model`` (a :class:`~tinit.model.transformer.Transformer`)
    under its scheme's optimizer rules (``init`` defaults to the model's own): one dict per
    non-empty group, in :data:`PARAM_GROUPS` order, each with ``params``, ``name``, ``lr``,
    ``weight_decay`` (0 for vectors) and ``eps``. ``rules=False`` or a scheme without rules:
    the base values for every group (one learning rate). A ConfigError naming ``lr``,
    ``eps`` or ``weight_decay`` for a value torch would refuse only when it steps (or not
    at all: a NaN lr)."""
    for name, value, strict in (("lr", lr, True), ("eps", eps, True), ("weight_decay", weight_decay, False)):
        real = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not (real and (value > 0 if strict else value >= 0)):
            raise ConfigError(name, f"must be a finite number {'>' if strict else '>='} 0, got {value!r}")
    if not isinstance(rules, bool):
        raise ConfigError("param_rules", f"must be True or False, got {rules!r}")
    init = init if init is not None else model.init
    scheme_rules = init.definition.param_rules if rules else None
    mult = multipliers(scheme_rules, model.cfg, init)
    params: dict[str, list] = {g: [] for g in PARAM_GROUPS}
    for name, p in model.named_parameters():
        if p.requires_grad:
            params[group_of(name, p.dim())].append(p)
    out = []
    for group in PARAM_GROUPS:
        if not params[group]:
            continue
        m_lr, m_wd, m_eps = mult[group]
        matrices = group in ("embedding", "hidden_matrix", "readout")
        decay = weight_decay * m_wd if matrices else 0.0
        g = {"params": params[group], "name": group, "lr": lr * m_lr, "weight_decay": decay,
             "eps": eps * m_eps}  # fmt: skip
        _check_group(g, init)
        out.append(g)
    return out


#: The largest learning rate, lr x weight decay and eps an optimizer group may get: torch
#: converts Adam's step, lr / (1 - beta1) = 10 lr at the first step, and these to float32
#: (at most 3.4e38); beyond, the step raises an overflow error instead of diverging.
MAX_GROUP_VALUE = 1e30


def _check_group(g: dict[str, Any], init: InitConfig) -> None:
    """A group's lr, lr x weight decay and eps are finite numbers in [0, MAX_GROUP_VALUE]
    (a rule's multiplier at this model's shape may make them huge, negative or NaN). A
    ConfigError names --init-file for the user's scheme, else --lr."""
    values = {"lr": g["lr"], "lr x weight decay": g["lr"] * g["weight_decay"], "eps": g["eps"]}
    for what, v in values.items():
        if not (math.isfinite(v) and 0 <= v <= MAX_GROUP_VALUE):
            user = any(s.name == init.scheme for s in init.schemes)
            raise ConfigError("init_file" if user else "lr",
                              f"{init.scheme}'s optimizer rules give the {g['name']} group {what} = {v:g} at "
                              f"this model's shape: not a number from 0 to {MAX_GROUP_VALUE:g}")  # fmt: skip


def describe_groups(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What config.json records of :func:`optimizer_groups`' answer: each group's name,
    learning rate, weight decay, eps and number of tensors and parameters."""
    return [
        {"name": g["name"], "lr": g["lr"], "weight_decay": g["weight_decay"], "eps": g["eps"],
         "tensors": len(g["params"]), "params": sum(p.numel() for p in g["params"])}
        for g in groups
    ]  # fmt: skip


def rules_summary(init: InitConfig, rules: bool = True) -> str:
    """One line for the terminal: which optimizer rules a run of ``init`` applies."""
    r = init.definition.param_rules
    if r is None:
        return f"{init.scheme}: no optimizer rules (one learning rate)"
    if not rules:
        return f"{init.scheme}: optimizer rules off (--param-rules off: one learning rate)"
    return f"{init.scheme}: {r.describe()} ({r.upstream.split(' ')[0]})"


__all__ = ["describe_groups", "group_of", "multipliers", "optimizer_groups", "rules_summary"]
