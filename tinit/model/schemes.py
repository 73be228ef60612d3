"""Init schemes as data, and the one function that resolves them.

A :class:`Scheme` says, for each weight *role* (:mod:`tinit.model.roles`), a std
rule (a :class:`~tinit.model.formula.Formula` over l, L, d, d_ff, d_h, fan_in,
fan_out, sigma, ...) and a distribution; its multipliers (on the residual stream, on
each branch, on the embedding output, on the logits); the architecture its codebase
runs (the norm placement and QK-norm it presumes when the user has not chosen; the
pieces tinit builds for it whatever the options say: a norm of the embedding, a
backout, q/k gains, soft-caps, (1 + w) norm gains, norms inside the branches, its own
FFN); and what its theory needs: how each branch's variance depends on depth
(``depth_factor``), from which :mod:`tinit.theory` builds v_2L(L).

:func:`resolve` is the one way to turn (scheme, role, the rule's variables) into what
is drawn: distribution, std, truncation bound and the std the draws really have.
tinit's own init, ``tinit inits``, ``audit --expect`` and ``audit --init`` all call it.
It lives, with the rule's variables (:func:`environment`), in :mod:`tinit.model.draws`,
which reads the schemes defined here.

A scheme is a frozen value that pickles (its formulas travel as text), so a run's
config carries a user's scheme (``--init-file``) to any process: there is no
process-global table of user schemes. The catalogue itself is
:mod:`tinit.model.catalogue`, each scheme as its upstream code runs it (repository @
commit and file in ``upstream``). Nothing outside these modules compares scheme
names: code asks the scheme.

The formulas follow each codebase's own file, named in every scheme's ``upstream``; where a
source left a choice open, the scheme's description says what tinit chose.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from .formula import VARIABLES, Formula, FormulaError
from .placements import PLACEMENTS
from .roles import LINEAR_ROLES, MATRIX_ROLES, ROLES

#: Distributions a rule may draw from. ``trunc``: normal truncated at +-bound (an
#: absolute value, a formula that may use ``std``), resampled until inside;
#: ``uniform``: U(-sqrt(3) std, sqrt(3) std); ``zero``: exactly 0; ``const``: the
#: value of the formula (norm gains, biases, learned gains).
DISTRIBUTIONS = ("normal", "trunc", "uniform", "zero", "const")
#: FFNs a scheme's codebase may run (its own, built whatever --ffn says): GeGLU
#: (Gemma: gelu-tanh gate), relu^2 (nanochat: W_down relu(W_up x)^2), ReLU
#: (microsoft/mup's Transformer example: torch's TransformerEncoderLayer FFN) and GELU
#: (torchscale: fc2 gelu(fc1 x)).
SCHEME_FFNS = ("geglu", "relu2", "relu", "gelu")
#: What a truncation bound may use: the rule's variables and the role's own std.
_BOUND_VARS = (*VARIABLES, "std")


@dataclass(frozen=True)
class Rule:
    """How one role is drawn: ``dist`` with std ``std`` (or value, for ``const``)."""

    std: Formula
    dist: str = "normal"
    bound: Formula | None = None  # trunc only: |w| <= bound (absolute; may use ``std``)

    def __post_init__(self) -> None:
        if self.dist not in DISTRIBUTIONS:
            raise FormulaError(f"distribution {self.dist!r} is not one of {', '.join(DISTRIBUTIONS)}")
        if (self.dist == "trunc") != (self.bound is not None):
            raise FormulaError("a truncation bound goes with dist = 'trunc' (and only with it)")

    def describe(self) -> str:
        if self.dist == "zero":
            return "0"
        if self.dist == "const":
            return f"= {self.std}"
        if self.dist == "trunc":
            return f"TN({self.std}, ±{self.bound})"
        if self.dist == "uniform":
            return f"U(std {self.std})"
        return f"N({self.std})"


def rule(std: str | float, dist: str = "normal", bound: str | float | None = None) -> Rule:
    if dist == "zero":
        std = 0
    return Rule(Formula(std), dist, None if bound is None else Formula(bound, allowed=_BOUND_VARS))


class RuleTable(Mapping):
    """A frozen role -> :class:`Rule` table that pickles (a ``MappingProxyType`` does not)."""

    __slots__ = ("_rules",)

    def __init__(self, rules: Mapping[str, Rule] | Iterable[tuple[str, Rule]] = ()):
        object.__setattr__(self, "_rules", dict(rules))

    def __setattr__(self, name, value):
        raise AttributeError("a RuleTable is frozen")

    def __getitem__(self, role: str) -> Rule:
        return self._rules[role]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rules)

    def __len__(self) -> int:
        return len(self._rules)

    def __reduce__(self):
        return (RuleTable, (tuple(self._rules.items()),))

    def __hash__(self) -> int:
        return hash(tuple(self._rules.items()))

    def __eq__(self, other) -> bool:
        return isinstance(other, RuleTable) and other._rules == self._rules

    def __repr__(self) -> str:
        return f"RuleTable({self._rules!r})"


#: The parameter groups an optimizer rule addresses (:mod:`tinit.model.param_rules`
#: sorts every parameter into one): the hidden matrices of the blocks (q, k, v, o,
#: gate, up, down), the blocks' vectors (norm gains, biases, learned branch gains), the
#: input embeddings (token and learned positions; a tied head is the token embedding),
#: the untied readout matrix, and the vectors outside the blocks (final norm, head bias).
PARAM_GROUPS = ("embedding", "hidden_matrix", "hidden_vector", "readout", "final_vector")
#: What an optimizer rule may use: the model's sizes and the bases, never a layer or a fan.
RULE_VARS = ("L", "d", "d_ff", "d_h", "V", "d0", "L0", "tied")


@dataclass(frozen=True)
class GroupRule:
    """Multipliers of the base learning rate, weight decay and Adam eps for one group
    (formulas over :data:`RULE_VARS`; the decay multiplies the base decay, which tinit
    applies to matrices only)."""

    lr: Formula = Formula("1", RULE_VARS)
    weight_decay: Formula = Formula("1", RULE_VARS)
    eps: Formula = Formula("1", RULE_VARS)

    def describe(self) -> str:
        keys = ("lr", "weight_decay", "eps")
        parts = [f"{k} x ({getattr(self, k)})" for k in keys if getattr(self, k).text != "1"]
        return ", ".join(parts) or "base"


@dataclass(frozen=True)
class ParamRules:
    """A parametrization's optimizer rules: a :class:`GroupRule` per parameter group
    (groups left out take the base values), the code it follows, and what tinit chose
    where the code and its paper differ. Applied by :func:`tinit.model.param_rules.optimizer_groups`."""

    groups: tuple[tuple[str, GroupRule], ...]
    upstream: str = ""
    note: str = ""

    def __post_init__(self) -> None:
        for name, _ in self.groups:
            if name not in PARAM_GROUPS:
                raise FormulaError(f"parameter group {name!r} is not one of {', '.join(PARAM_GROUPS)}")

    def rule(self, group: str) -> GroupRule:
        return dict(self.groups).get(group, GroupRule())

    def describe(self) -> str:
        return "; ".join(f"{g}: {r.describe()}" for g, r in self.groups if r.describe() != "base") or "none"


def param_rules(upstream: str = "", note: str = "", **groups: Mapping[str, str]) -> ParamRules:
    """Rules from ``group={"lr": formula, "weight_decay": ..., "eps": ...}`` keywords."""
    made = []
    for name, spec in groups.items():
        unknown = set(spec) - {"lr", "weight_decay", "eps"}
        if unknown:
            raise FormulaError(f"parameter group {name}: unknown key(s) {', '.join(sorted(unknown))} "
                               "(lr, weight_decay, eps)")  # fmt: skip
        made.append((name, GroupRule(**{k: Formula(v, RULE_VARS) for k, v in spec.items()})))
    return ParamRules(tuple(made), upstream, note)


@dataclass(frozen=True)
class Scheme:
    """One init scheme, with its multipliers, its codebase's architecture and theory."""

    name: str
    description: str
    sources: tuple[str, ...]  # papers and files, for the description
    rules: RuleTable  # every role (merged over the naive table)
    touched: tuple[str, ...] = ()  # roles that differ from naive, for the table
    upstream: tuple[str, ...] = ()  # "owner/repo@commit path (symbol)": the code it follows
    stream_mult: Formula = Formula("1")  # a: x <- a x + g F at every addition (DeepNet's alpha)
    branch_mult: Formula = Formula("1")  # g at each branch (CompleteP's (L/L0)^-alpha, ReZero's 0)
    branch_learned: bool = False  # g is a learned scalar per block (ReZero), initialised to branch_mult
    embed_mult: Formula = Formula("1")  # embedding output times this (Gemma's sqrt(d))
    logit_mult: Formula = Formula("1")  # logits times this (muP's readout 1/m)
    attn_scale: Formula | None = None  # logits q.k times this; None: 1/sqrt(d_h) (or 1 with --no-attn-scale)
    x0_mix: tuple[Formula, Formula] | None = None  # (lambda_l, mu_l): x <- lambda x + mu x0 before block l
    tied_embed: Rule | None = None  # the embedding's rule when the head is tied to it (torchtitan)
    embed_norm: bool = False  # RMS-normalise the embedding output (nanochat: x = norm(wte(idx)))
    backout: Formula | None = None  # x <- x - beta x_mid before the final norm (nanochat: x_mid after L//2)
    qk_gain: Formula | None = None  # q and k times this after QK-norm (nanochat's 1.2)
    attn_softcap: Formula | None = None  # attention logits c tanh(z / c) (Gemma 2)
    logit_softcap: Formula | None = None  # output logits c tanh(z / c) (Gemma 2, nanochat)
    ffn: str | None = None  # the FFN its codebase runs (SCHEME_FFNS), built whatever --ffn says
    d_ff: Formula | None = None  # that FFN's width; None: the model's d_ff
    norm_offset: float = 0.0  # norms scale by (offset + w); the gains' rule is w's (Gemma: 1, w = 0)
    subln: bool = False  # a norm inside each branch, before its output matrix (torchscale's sub-LN)
    placement: str | None = None  # presumed placement (a name of PLACEMENTS); None: the command's default
    qk_norm: bool = False  # presumed QK-norm (False: the codebase runs none, or leaves it open)
    # --- structure: the rest of the model its upstream runs (tinit.model.structure);
    # None: the upstream leaves it open (the command's default, the user's choice)
    qk_norm_span: str = "head"  # QK-norm over each head's d_h ("head") or the whole q and k ("full")
    tied: bool | None = None  # True: the upstream always ties the head to the embedding; False: never
    bias: bool | None = None  # its linear layers carry biases (True) or not (False)
    bias_like: tuple[str, ...] = ()  # roles whose bias is drawn by the weight's rule at the weight's fan_in
    # the rule of those biases when it is not the weight's (fairseq's q, k, v: nn.Linear's
    # U(+-1/sqrt(fan_in)) under Xavier weights), at the weight's shape; None: the weight's rule
    bias_rule: Rule | None = None
    norm: str | None = None  # "rmsnorm" or "layernorm"
    norm_eps: float | None = None  # the eps of its norms
    rope_base: float | None = None  # its RoPE frequency base
    not_modelled: str = ""  # what its upstream runs that tinit does not build (README, tinit inits)
    # theory: each branch's variance relative to an L-independent reference s^2 (the
    # depth dependence of its writing matrices' variances); None: no closed form
    depth_factor: tuple[Formula, Formula] | None = (Formula("1"), Formula("1"))
    # v_2L against L, as text, for the placement it presumes (None: pre-norm's laws);
    # summary.csv's closed_form of another placement follows that placement's laws
    # (tinit.theory.closed_form_text)
    closed_form: str = ""
    aliases: tuple[str, ...] = ()
    # the parametrization's optimizer rules (per-group lr, weight decay, Adam eps);
    # None: one learning rate for every parameter (an init, not a parametrization)
    param_rules: ParamRules | None = None
    # a user's scheme (--init-file): the TOML text it was parsed from, which a checkpoint
    # carries so that its audit rebuilds the scheme (not part of the scheme's identity)
    toml: str = field(default="", compare=False, repr=False)

    def rule(self, role: str) -> Rule:
        return self.rules[role]

    def multipliers(self) -> str:
        parts = []
        if self.stream_mult.text != "1":
            parts.append(f"stream x{self.stream_mult}")
        if self.branch_mult.text != "1" or self.branch_learned:
            parts.append(f"branch x{self.branch_mult}" + (" (learned)" if self.branch_learned else ""))
        if self.embed_norm:
            parts.append("embedding RMS-normed")
        if self.embed_mult.text != "1":
            parts.append(f"embedding x{self.embed_mult}")
        if self.logit_mult.text != "1":
            parts.append(f"logits x{self.logit_mult}")
        if self.attn_scale is not None:
            parts.append(f"q.k x{self.attn_scale}")
        if self.qk_gain is not None:
            parts.append(f"q, k x{self.qk_gain} after QK-norm")
        if self.attn_softcap is not None:
            parts.append(f"attention soft-cap {self.attn_softcap}")
        if self.logit_softcap is not None:
            parts.append(f"logit soft-cap {self.logit_softcap}")
        if self.x0_mix is not None:
            parts.append(f"x <- ({self.x0_mix[0]}) x + ({self.x0_mix[1]}) x0")
        if self.backout is not None:
            parts.append(f"backout x - {self.backout} x_mid")
        return "; ".join(parts) or "none"

    def architecture(self) -> str:
        """What the scheme's codebase runs besides its weights: the placement (and
        QK-norm) it presumes and the pieces tinit builds for it."""
        span = " across the full width" if self.qk_norm_span == "full" else ""
        parts = [(self.placement or "any") + (f" + QK-norm{span}" if self.qk_norm else "")]
        if self.norm is not None:
            parts.append(self.norm + (f" (eps {self.norm_eps:g})" if self.norm_eps is not None else ""))
        if self.tied is not None:
            parts.append("tied head" if self.tied else "untied head")
        if self.bias is not None:
            like = f" (nn.Linear's on {','.join(self.bias_like)})" if self.bias and self.bias_like else ""
            parts.append(("biases" + like) if self.bias else "no biases")
        if self.rope_base is not None:
            parts.append(f"RoPE base {self.rope_base:g}")
        if self.norm_offset:
            parts.append(f"norm gains ({self.norm_offset:g} + w)")
        if self.subln:
            parts.append("norm inside each branch (sub-LN)")
        if self.ffn is not None:
            parts.append(f"{self.ffn} FFN" + (f" of width {self.d_ff}" if self.d_ff is not None else ""))
        return ", ".join(parts)

    def formula(self) -> str:
        """The rules of the roles this scheme changes, one string."""
        roles = self.touched or ("all",)
        if roles == ("all",):
            return "every matrix " + self.rules["q"].describe()
        groups: dict[str, list[str]] = {}
        for r in roles:
            groups.setdefault(self.rules[r].describe(), []).append(r)
        out = "; ".join(f"{','.join(rs)}: {d}" for d, rs in groups.items())
        if self.tied_embed is not None:
            out += f"; embed when tied: {self.tied_embed.describe()}"
        return out


# --- building schemes ----------------------------------------------------------------

_NAIVE_RULES = {
    "embed": rule("sigma_emb"), "pos": rule("sigma_emb"),
    **{r: rule("sigma") for r in MATRIX_ROLES if r not in ("embed", "pos")},
    "norm": rule(1, "const"), "bias": rule(0, "const"), "gain": rule(1, "const"),
}  # fmt: skip
_FORMULA_FIELDS = ("stream_mult", "branch_mult", "embed_mult", "logit_mult", "attn_scale", "backout",
                   "qk_gain", "attn_softcap", "logit_softcap", "d_ff")  # fmt: skip


def scheme(name: str, description: str, sources, rules=None, **kw) -> Scheme:
    """A scheme whose rules are ``rules`` over the naive table; strings become formulas.
    A scheme whose norms scale by (offset + w) gets the gain rule w = 1 - offset."""
    rules = dict(rules or {})
    merged = {**_NAIVE_RULES, **rules}
    for key in _FORMULA_FIELDS:
        if key in kw and kw[key] is not None and not isinstance(kw[key], Formula):
            kw[key] = Formula(kw[key])
    if kw.get("x0_mix") is not None:
        kw["x0_mix"] = tuple(Formula(f) for f in kw["x0_mix"])
    if "depth_factor" in kw and kw["depth_factor"] is not None:
        kw["depth_factor"] = tuple(Formula(f) for f in kw["depth_factor"])
    if kw.get("ffn") is not None and kw["ffn"] not in SCHEME_FFNS:
        raise FormulaError(f"{name}: ffn {kw['ffn']!r} is not one of {', '.join(SCHEME_FFNS)}")
    if kw.get("placement") is not None and kw["placement"] not in tuple(PLACEMENTS):
        raise FormulaError(f"{name}: placement {kw['placement']!r} is not one of {', '.join(PLACEMENTS)}")
    _check_structure(name, kw)
    if kw.get("norm_offset") and "norm" not in rules:
        merged["norm"] = rule(1 - kw["norm_offset"], "const")
    touched = tuple(r for r in ROLES if r in rules and r != "gain")
    if kw.get("branch_learned"):
        merged["gain"] = Rule(kw.get("branch_mult", Formula("1")), "const")
    kw["upstream"] = tuple(kw.get("upstream", ()))
    return Scheme(name, description, tuple(sources), RuleTable(merged), touched, **kw)


#: Values a scheme's structure fields may take (None: left open).
QK_NORM_SPANS = ("head", "full")
NORM_KINDS = ("rmsnorm", "layernorm")


def _check_structure(name: str, kw: dict) -> None:
    """The structure fields of a scheme being built: a FormulaError naming the field."""
    if kw.get("qk_norm_span", "head") not in QK_NORM_SPANS:
        span = kw["qk_norm_span"]
        raise FormulaError(f"{name}: qk_norm_span {span!r} is not one of {', '.join(QK_NORM_SPANS)}")
    if kw.get("norm") is not None and kw["norm"] not in NORM_KINDS:
        raise FormulaError(f"{name}: norm {kw['norm']!r} is not one of {', '.join(NORM_KINDS)}")
    for key in ("tied", "bias"):
        if kw.get(key) is not None and not isinstance(kw[key], bool):
            raise FormulaError(f"{name}: {key} must be true, false or left out, got {kw[key]!r}")
    bad = [r for r in kw.get("bias_like", ()) if r not in LINEAR_ROLES]
    if bad:
        raise FormulaError(f"{name}: bias_like role(s) {', '.join(map(repr, bad))} are not linear layers "
                           f"({', '.join(LINEAR_ROLES)})")  # fmt: skip
    kw["bias_like"] = tuple(kw.get("bias_like", ()))
    for key, low in (("norm_eps", 0.0), ("rope_base", 0.0)):
        v = kw.get(key)
        if v is not None and not (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                                  and (v > low or (key == "norm_eps" and v == 0))):  # fmt: skip
            raise FormulaError(f"{name}: {key} must be a finite number > 0, got {v!r}")


def bias_role(scheme: Scheme, owner: str) -> str:
    """The role whose rule draws the bias of the linear layer of role ``owner``: the
    owner's own (at the weight's shape) where the scheme's upstream keeps nn.Linear's
    biases (torchscale, ReZero's FFN: U(+-1/sqrt(fan_in)), scaled like the weight), else
    ``bias`` (the scheme's bias constant, 0)."""
    return owner if owner in scheme.bias_like else "bias"


__all__ = [
    "DISTRIBUTIONS", "GroupRule", "MATRIX_ROLES", "PARAM_GROUPS", "ParamRules", "ROLES", "RULE_VARS", "Rule",
    "RuleTable", "Scheme", "bias_role", "param_rules", "rule", "scheme",
]  # fmt: skip
