"""Check a scheme against a model before anything runs: every rule (std, truncation
bound) of every parameter the model has, and every multiplier, at every layer.

A user's formula (``--init-file``) may be undefined somewhere the load-time probe did
not look (``log(L - 7)`` at L = 7, ``log(l)`` at block 0 of a multiplier); without this
check the run would stop at that block with a traceback. The formulas are evaluated
over all layers at once (:meth:`tinit.model.formula.Formula.values`), so a check costs
a few array operations per rule whatever the depth.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import numpy as np
import torch

from .config import InitConfig, ModelConfig
from .draws import environment
from .formula import Formula, FormulaError
from .schemes import Scheme


@functools.lru_cache(maxsize=64)
def _block_params(cfg: ModelConfig, init: InitConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(role, shape) of each parameter of one block (built on the meta device: no memory)."""
    from .block import Block
    from .roles import role_of

    with torch.device("meta"):
        block = Block(cfg, 0, seed=init.seed, init=init)
    return tuple((role_of(name)[0], tuple(p.shape)) for name, p in block.named_parameters())


def _outer_params(cfg: ModelConfig) -> Iterator[tuple[str, int, tuple[int, ...]]]:
    """(role, layer, shape) of the parameters outside the blocks (see Transformer)."""
    d, L, V = cfg.d_model, cfg.n_layers, cfg.vocab_size
    yield "embed", -1, (V, d)
    if cfg.positions == "learned":
        yield "pos", -1, (cfg.max_seq_len, d)
    if cfg.placement.final_norm:
        yield "norm", L, (d,)
        if cfg.norm == "layernorm":
            yield "bias", L, (d,)
    if not cfg.tie_embeddings:
        yield "head", L, (V, d)
        if cfg.bias:
            yield "bias", L, (V,)


def _values(formula: Formula, env: dict, what: str) -> np.ndarray:
    try:
        return formula.values(**env)
    except FormulaError as exc:
        raise FormulaError(f"{what}: {exc}") from None


def _first_bad(values: np.ndarray, bad: np.ndarray, layers: np.ndarray) -> str | None:
    if not bad.any():
        return None
    i = int(np.flatnonzero(bad)[0])
    return f"{values[i]:g} at layer {int(layers[i])}"


def _check_rule(scheme: Scheme, role: str, env: dict, layers: np.ndarray, L: int) -> None:
    rule = scheme.rule(role)
    if rule.dist == "zero":
        return
    where = f"{scheme.name}: role {role}"
    std = _values(rule.std, env, where)
    bad = ~np.isfinite(std) if rule.dist == "const" else ~(np.isfinite(std) & (std >= 0))
    first = _first_bad(std, bad, layers)
    if first is not None:
        kind = "value" if rule.dist == "const" else "std"
        raise FormulaError(f"{where}: {kind} {rule.std} is {first} of L={L} (a finite number >= 0 is needed)")
    if rule.bound is not None:
        bound = _values(rule.bound, {**env, "std": std}, f"{where} bound")
        first = _first_bad(bound, ~(np.isfinite(bound) & (bound > 0)), layers)
        if first is not None:
            need = "a finite number > 0 is needed"
            raise FormulaError(f"{where}: bound {rule.bound} is {first} of L={L} ({need})")


def check_scheme(cfg: ModelConfig, init: InitConfig) -> None:
    """Raise :class:`FormulaError` (naming the scheme, the rule and the layer) when any
    rule or multiplier of ``init``'s scheme is undefined, not finite, or a negative std
    anywhere in the model ``cfg``; return quietly otherwise."""
    scheme, L = init.definition, cfg.n_layers
    blocks = np.arange(L, dtype=np.float64)
    base = environment(cfg, init, 0)
    mults = [("stream multiplier", scheme.stream_mult), ("branch multiplier", scheme.branch_mult)]
    mults += [("attention scale", scheme.attn_scale)] if scheme.attn_scale is not None else []
    mults += list(zip(("x0 mix lambda", "x0 mix mu"), scheme.x0_mix or (), strict=False))
    for what, formula in mults:
        v = _values(formula, {**base, "l": blocks}, f"{scheme.name}: {what}")
        first = _first_bad(v, ~np.isfinite(v), blocks)
        if first is not None:
            raise FormulaError(f"{scheme.name}: {what} {formula} is {first} of L={L} (not a finite number)")
    edge = environment(cfg, init, -1)
    for what, formula in (("embedding multiplier", scheme.embed_mult),
                          ("logit multiplier", scheme.logit_mult)):  # fmt: skip
        v = float(_values(formula, edge, f"{scheme.name}: {what}"))
        if not np.isfinite(v):
            raise FormulaError(f"{scheme.name}: {what} {formula} is {v:g} (not a finite number)")
    for role, shape in dict.fromkeys(_block_params(cfg, init)):
        env = {**environment(cfg, init, 0, shape), "l": blocks}
        _check_rule(scheme, role, env, blocks, L)
    for role, layer, shape in _outer_params(cfg):
        where = np.array([float(layer)])
        _check_rule(scheme, role, {**environment(cfg, init, layer, shape), "l": where}, where, L)


def _groups(cfg: ModelConfig, init: InitConfig) -> set[str]:
    """The parameter groups (:func:`tinit.model.param_rules.group_of`) the model ``cfg`` has."""
    out = {"hidden_matrix" if len(shape) >= 2 else "hidden_vector" for _, shape in _block_params(cfg, init)}
    outer = {"embed": "embedding", "pos": "embedding", "head": "readout", "norm": "final_vector",
             "bias": "final_vector"}  # fmt: skip
    return out | {outer[role] for role, _, _ in _outer_params(cfg)}


def check_param_rules(cfg: ModelConfig, init: InitConfig) -> None:
    """Raise :class:`FormulaError` (naming the scheme, the group and the key) when an
    optimizer rule of ``init``'s scheme is undefined or out of range at the shape of
    ``cfg`` (its L, d, d_ff, V, tying): a learning-rate or eps multiplier must be a finite
    number > 0, a weight-decay multiplier a finite number >= 0. Only the groups the model
    has are checked (a tied head has no readout). The file's own check looked at three
    fixed shapes; this one looks at the run's, before the first step."""
    rules = init.definition.param_rules
    if rules is None:
        return
    env = environment(cfg, init, -1)
    have = _groups(cfg, init)
    shape = f"L={cfg.n_layers}, d={cfg.d_model}, {'tied' if cfg.tie_embeddings else 'untied'} head"
    for group, rule in rules.groups:
        if group not in have:
            continue
        for key in ("lr", "weight_decay", "eps"):
            formula = getattr(rule, key)
            where = f"{init.definition.name}: optimizer.{group}.{key}"
            v = float(_values(formula, env, f"{where} at {shape}"))
            if not (np.isfinite(v) and (v > 0 or (key == "weight_decay" and v == 0))):
                need = "a finite number >= 0" if key == "weight_decay" else "a finite number > 0"
                raise FormulaError(f"{where} {formula} is {v:g} at {shape} (the multiplier must be {need})")
