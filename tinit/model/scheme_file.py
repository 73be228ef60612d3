"""A user's own init scheme, declared in TOML, parsed beside the catalogue.

::

    name = "my-init"                       # required; must not shadow a catalogue name
    description = "gpt2, but per layer"   # optional
    placement = "pre"                      # optional: pre, post, sandwich, reordered, none
    qk_norm = true                         # optional
    qk_norm_span = "head"                  # optional structure of the model it runs: "head" or "full",
    tied = false                           #   the head never (false) or always (true) tied,
    bias = true                            #   biases, norm = "rmsnorm" | "layernorm", norm_eps,
    bias_like = ["o"]                      #   rope_base, biases drawn like weights
    stream_mult = "1"                      # optional multipliers (formulas)
    branch_mult = "1"
    embed_mult = "1"

    [roles]                                # roles left out keep the naive rule
    o = "sigma / sqrt(2 * (l + 1))"        # a formula: normal with this std
    down = { std = "sigma / sqrt(2 * L)", dist = "trunc", bound = "3 * std" }
    up = { dist = "zero" }

    [optimizer.hidden_matrix]              # optional optimizer rules per parameter group
    lr = "d0 / d"                          # multipliers of the base lr, weight decay, eps
    weight_decay = "d / d0"                # (groups: embedding, hidden_matrix, hidden_vector,
                                           #  readout, final_vector; see tinit.model.param_rules)

A key its companion makes void is refused, not dropped: ``qk_norm_span`` beside
``qk_norm = false``, ``bias_like`` beside ``bias = false``.

Formulas use numbers, + - * / ^, sqrt, log, exp, min, max and the variables of
:data:`tinit.model.formula.VARIABLES`; they are parsed with a whitelist, never
evaluated as Python. Every error is a :class:`~tinit.model.formula.FormulaError` (the
library's one error type for schemes) whose message names the file and what is wrong
(the role, the key); the command line turns it into a one-line usage error.
The result is a frozen :class:`~tinit.model.schemes.Scheme`: it pickles, and the run's
InitConfig carries it (no process-global registration).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ..userfile import UserFileError, parse_toml, read_text
from .catalogue import check_user_scheme
from .draws import resolve
from .formula import VARIABLES, Formula, FormulaError
from .placements import PLACEMENTS
from .roles import LINEAR_ROLES, ROLES
from .schemes import (
    DISTRIBUTIONS,
    PARAM_GROUPS,
    ParamRules,
    Rule,
    Scheme,
    param_rules,
    scheme,
)

#: The structure a scheme may declare (tinit.model.structure): key -> what it takes.
_STRUCTURE = {"tied": "true or false", "bias": "true or false", "norm": "rmsnorm or layernorm",
              "qk_norm_span": "head or full", "norm_eps": "a number > 0", "rope_base": "a number > 0",
              "bias_like": f"a list of roles ({', '.join(LINEAR_ROLES)})"}  # fmt: skip
_TOP = {"name", "description", "placement", "qk_norm", "stream_mult", "branch_mult", "embed_mult", "roles",
        "sources", "optimizer", *_STRUCTURE}  # fmt: skip
_RULE_VARS = tuple(v for v in VARIABLES if v != "std")
#: A scheme's name: it becomes part of folder names (tinit sweep's points) and CSV cells.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")


def _bad(path, what: str, msg: str) -> FormulaError:
    return FormulaError(f"{path}: {what}: {msg}")


def _rule(path, role: str, value) -> Rule:
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        value = {"std": value}
    if not isinstance(value, dict):
        raise _bad(path, f"role {role}", "give a formula string or a table {std, dist, bound}")
    unknown = set(value) - {"std", "dist", "bound"}
    if unknown:
        raise _bad(path, f"role {role}", f"unknown key(s) {', '.join(sorted(unknown))} (std, dist, bound)")
    dist = value.get("dist", "const" if role in ("norm", "bias", "gain") else "normal")
    if dist not in DISTRIBUTIONS:
        raise _bad(path, f"role {role}", f"dist {dist!r} is not one of {', '.join(DISTRIBUTIONS)}")
    if dist == "zero":
        value = {"std": 0, **value}
    if "std" not in value:
        raise _bad(path, f"role {role}", "needs a std formula")
    if (dist == "trunc") != ("bound" in value):
        raise _bad(path, f"role {role}", "a bound goes with dist = 'trunc' (and only with it)")
    try:
        std = Formula(value["std"], allowed=_RULE_VARS)
        bound = Formula(value["bound"]) if "bound" in value else None
        return Rule(std, dist, bound)
    except FormulaError as exc:
        raise _bad(path, f"role {role}", str(exc)) from None


def _probe_values(path, s: Scheme, role: str) -> None:
    """Evaluate a rule over a spread of shapes and every layer: negative, non-finite or
    undefined stds are errors now, not in the middle of a run."""
    for L, d in ((1, 64), (12, 256), (80, 8192)):
        for layer in sorted({0, L // 2, L - 1}):
            env = {"l": layer, "L": L, "d": d, "d_ff": 4 * d, "d_h": 64, "fan_in": d, "fan_out": 4 * d,
                   "sigma": 0.02, "sigma_emb": 0.02, "V": 32000, "d0": 256, "L0": 1}  # fmt: skip
            try:
                resolve(s, role, {k: float(v) for k, v in env.items()})
            except FormulaError as exc:  # the message names the scheme and the role
                raise FormulaError(f"{path}: {exc}") from None


def _param_rules(path, table) -> ParamRules:
    """The ``[optimizer.<group>]`` tables: lr, weight_decay, eps multipliers (formulas)."""
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise _bad(path, "optimizer", "give [optimizer.<group>] tables of lr, weight_decay, eps formulas")
    unknown = set(table) - set(PARAM_GROUPS)
    if unknown:
        raise _bad(path, "optimizer", f"unknown group(s) {', '.join(sorted(unknown))} "
                   f"(choose from {', '.join(PARAM_GROUPS)})")  # fmt: skip
    try:
        rules = param_rules(str(path), "", **{g: {k: str(v) for k, v in t.items()} for g, t in table.items()})
    except FormulaError as exc:
        raise _bad(path, "optimizer", str(exc)) from None
    for L, d in ((1, 64), (12, 256), (80, 8192)):  # undefined or non-positive now, not mid-run
        env = {"L": L, "d": d, "d_ff": 4 * d, "d_h": 64, "V": 32000, "d0": 256, "L0": 1, "tied": 1}
        for group, r in rules.groups:
            for key in ("lr", "weight_decay", "eps"):
                try:
                    v = getattr(r, key)(**{k: float(x) for k, x in env.items()})
                except FormulaError as exc:
                    raise _bad(path, f"optimizer.{group}.{key}", str(exc)) from None
                if not v > 0 and not (key == "weight_decay" and v == 0):
                    raise _bad(path, f"optimizer.{group}.{key}", f"{getattr(r, key)} = {v:g} at L={L}, d={d} "
                               "(a multiplier must be positive)")  # fmt: skip
    return rules


def _structure(path, data: dict) -> dict:
    """The structure keys the file declares (the model its scheme runs: tying, biases,
    norm, QK-norm span, eps, RoPE base), each checked, as Scheme fields."""
    out = {}
    for key, allowed in _STRUCTURE.items():
        if key not in data:
            continue
        v = data[key]
        if key in ("tied", "bias"):
            ok = isinstance(v, bool)  # a TOML boolean, unquoted
        elif key == "norm":
            ok = v in ("rmsnorm", "layernorm")
        elif key == "qk_norm_span":
            ok = v in ("head", "full")
        elif key == "bias_like":
            ok = isinstance(v, list) and all(r in LINEAR_ROLES for r in v)
            v = tuple(v) if ok else v
        else:
            ok = isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < float("inf")
            v = float(v) if ok else v
        if not ok:
            raise _bad(path, key, f"{data[key]!r} is not {allowed}")
        out[key] = v
    # a key the other key makes void would be dropped without a word: refused instead
    if out.get("bias") is False and out.get("bias_like"):
        raise _bad(path, "bias_like", f"{list(out['bias_like'])} draws biases like weights, but bias = false "
                   "builds none: drop one of the two")  # fmt: skip
    if data.get("qk_norm") is False and "qk_norm_span" in out:
        raise _bad(path, "qk_norm_span", f"{out['qk_norm_span']!r} spans a QK-norm, but qk_norm = false runs "
                   "none: drop one of the two")  # fmt: skip
    return out


def parse_scheme(data: dict, path: str | Path = "<toml>", text: str = "") -> Scheme:
    """The scheme a parsed TOML document declares (``path`` names it in errors; ``text``,
    the document's TOML, is kept as the scheme's ``toml``)."""
    unknown = set(data) - _TOP
    if unknown:
        allowed = ", ".join(sorted(_TOP))
        raise _bad(path, "top level", f"unknown key(s) {', '.join(sorted(unknown))} ({allowed})")
    name = data.get("name")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name.strip()):
        raise _bad(path, "name", f"{name!r}: give the scheme a name of up to 64 letters, digits, _ - . +, "
                   "starting with a letter or digit (it names folders and CSV cells)")  # fmt: skip
    qk_norm = data.get("qk_norm", False)
    if not isinstance(qk_norm, bool):  # bool("false") is True: only a TOML boolean is a boolean
        raise _bad(path, "qk_norm", f"{qk_norm!r} is not true or false (a TOML boolean, unquoted)")
    placement = data.get("placement")
    if placement is not None and (not isinstance(placement, str) or placement not in PLACEMENTS):
        raise _bad(path, "placement", f"{placement!r} is not one of {', '.join(PLACEMENTS)}")
    roles = data.get("roles", {})
    if not isinstance(roles, dict):
        raise _bad(path, "roles", "must be a table: role = formula")
    rules = {}
    for role, value in roles.items():
        if role not in ROLES or role == "gain":
            allowed = ", ".join(r for r in ROLES if r != "gain")
            raise _bad(path, f"role {role}", f"unknown role (choose from {allowed})")
        rules[role] = _rule(path, role, value)
    kw = {}
    for key in ("stream_mult", "branch_mult", "embed_mult"):
        if key in data:
            try:
                kw[key] = Formula(data[key], allowed=_RULE_VARS)
            except FormulaError as exc:
                raise _bad(path, key, str(exc)) from None
    if "optimizer" in data:
        kw["param_rules"] = _param_rules(path, data["optimizer"])
    kw.update(_structure(path, data))
    try:
        s = scheme(name.strip(), str(data.get("description", f"user scheme from {Path(path).name}")),
                   [str(path)], rules, placement=placement, qk_norm=qk_norm,
                   depth_factor=None, closed_form="", **kw)  # fmt: skip
        check_user_scheme(s)
    except FormulaError as exc:
        raise _bad(path, "name" if "taken" in str(exc) else "scheme", str(exc)) from None
    for role in rules:
        _probe_values(path, s, role)
    return dataclasses.replace(s, toml=text) if text else s


def load_scheme(path: str | Path) -> Scheme:
    """Read, parse and check the scheme of the TOML file ``path``. Raises FormulaError
    (the file cannot be read, is not TOML, or declares a bad scheme)."""
    path = Path(path)
    try:  # (a regular file of at most 1 MiB, nested at most 32 levels: tinit.userfile)
        text = read_text(path)
        data = parse_toml(text, path)
    except UserFileError as exc:
        raise FormulaError(str(exc)) from None
    return parse_scheme(data, path, text)
