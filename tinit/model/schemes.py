"""The init catalogue: every scheme real codebases run, as data.

A :class:`Scheme` says, for each weight *role* (see :mod:`tinit.model.init`), a std
rule (a :class:`~tinit.model.formula.Formula` over l, L, d, d_ff, d_h, fan_in,
fan_out, sigma, ...) and a distribution; its multipliers (on the residual stream, on
each branch, on the embedding output, on the logits); and the architecture it
presumes (norm placement, QK-norm), used when the user has not chosen. It also
carries what its theory needs: how each branch's variance depends on depth
(``depth_factor``), from which :mod:`tinit.theory` builds v_2L(L).

Nothing outside this module compares scheme names: code asks the scheme.

The formulas follow each codebase's own file, named in every scheme's ``sources``
(the project's notes on them, outside this repository, are not shipped); where a
source left a choice open, the scheme's description says what tinit chose.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .formula import Formula, FormulaError

#: Distributions a rule may draw from. ``trunc``: normal truncated at +-bound (an
#: absolute value, a formula that may use ``std``), resampled until inside;
#: ``uniform``: U(-sqrt(3) std, sqrt(3) std); ``zero``: exactly 0; ``const``: the
#: value of the formula (norm gains, biases, learned gains).
DISTRIBUTIONS = ("normal", "trunc", "uniform", "zero", "const")
#: Norm placements: pre x + F(N(x)); post N(x + F(x)); sandwich x + N_out(F(N_in(x)));
#: reordered x + N(F(x)); none x + F(x).
PLACEMENTS = ("pre", "post", "sandwich", "reordered", "none")
MATRIX_ROLES = ("embed", "pos", "q", "k", "v", "o", "gate", "up", "down", "head")
ROLES = MATRIX_ROLES + ("norm", "bias", "gain")


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
    return Rule(Formula(std), dist, None if bound is None else Formula(bound))


@dataclass(frozen=True)
class Scheme:
    """One init scheme, with its multipliers, presumed architecture and theory."""

    name: str
    description: str
    sources: tuple[str, ...]
    rules: Mapping[str, Rule]  # every role (merged over the naive table)
    touched: tuple[str, ...] = ()  # roles that differ from naive, for the table
    stream_mult: Formula = Formula("1")  # a: x <- a x + g F at every addition (DeepNet's alpha)
    branch_mult: Formula = Formula("1")  # g at each branch (CompleteP's (L/L0)^-alpha, ReZero's 0)
    branch_learned: bool = False  # g is a learned scalar per block (ReZero), initialised to branch_mult
    embed_mult: Formula = Formula("1")  # embedding output times this (Gemma's sqrt(d))
    logit_mult: Formula = Formula("1")  # logits times this (muP's readout 1/m)
    attn_scale: Formula | None = None  # logits q.k times this; None: 1/sqrt(d_h) (or 1 with --no-attn-scale)
    x0_mix: tuple[Formula, Formula] | None = None  # (lambda_l, mu_l): x <- lambda x + mu x0 before block l
    placement: str | None = None  # presumed norm placement; None: the command's default
    qk_norm: bool = False  # presumed QK-norm
    # theory: each branch's variance relative to an L-independent reference s^2 (the
    # depth dependence of its writing matrices' variances); None: no closed form
    depth_factor: tuple[Formula, Formula] | None = (Formula("1"), Formula("1"))
    closed_form: str = ""  # v_2L against L, as text (pre-norm style additions)
    aliases: tuple[str, ...] = ()

    def rule(self, role: str) -> Rule:
        return self.rules[role]

    def multipliers(self) -> str:
        parts = []
        if self.stream_mult.text != "1":
            parts.append(f"stream x{self.stream_mult}")
        if self.branch_mult.text != "1" or self.branch_learned:
            parts.append(f"branch x{self.branch_mult}" + (" (learned)" if self.branch_learned else ""))
        if self.embed_mult.text != "1":
            parts.append(f"embedding x{self.embed_mult}")
        if self.logit_mult.text != "1":
            parts.append(f"logits x{self.logit_mult}")
        if self.attn_scale is not None:
            parts.append(f"q.k x{self.attn_scale}")
        if self.x0_mix is not None:
            parts.append(f"x <- ({self.x0_mix[0]}) x + ({self.x0_mix[1]}) x0")
        return "; ".join(parts) or "none"

    def architecture(self) -> str:
        return (self.placement or "any") + (" + QK-norm" if self.qk_norm else "")

    def formula(self) -> str:
        """The rules of the roles this scheme changes, one string."""
        roles = self.touched or ("all",)
        if roles == ("all",):
            return "every matrix " + self.rules["q"].describe()
        groups: dict[str, list[str]] = {}
        for r in roles:
            groups.setdefault(self.rules[r].describe(), []).append(r)
        return "; ".join(f"{','.join(rs)}: {d}" for d, rs in groups.items())


# --- the environment a rule is evaluated in ---------------------------------------


def role_shape(role: str, d: int, d_ff: int, d_h: int, kv: int, V: int, T: int) -> tuple[int, ...]:
    """The (out, in) shape of a role's matrix (torch's Linear convention)."""
    return {
        "embed": (V, d), "pos": (T, d), "q": (d, d), "k": (kv * d_h, d), "v": (kv * d_h, d),
        "o": (d, d), "gate": (d_ff, d), "up": (d_ff, d), "down": (d, d_ff), "head": (V, d),
        "norm": (d,), "bias": (d,), "gain": (),
    }[role]  # fmt: skip


def environment(cfg, init, layer: int, shape: tuple[int, ...] | None = None) -> dict[str, float]:
    """The variables of a rule for one parameter (``cfg`` a ModelConfig, ``init`` an InitConfig)."""
    shape = tuple(shape or ())
    fan_in = shape[1] if len(shape) >= 2 else (shape[0] if shape else 1)
    fan_out = shape[0] if shape else 1
    return {
        "l": float(layer), "L": float(cfg.n_layers), "d": float(cfg.d_model), "d_ff": float(cfg.d_ff),
        "d_h": float(cfg.head_dim), "fan_in": float(fan_in), "fan_out": float(fan_out),
        "sigma": init.resolved_sigma(cfg.d_model), "sigma_emb": init.resolved_embed_std(cfg.d_model),
        "V": float(cfg.vocab_size), "d0": float(getattr(init, "base_width", 256)),
        "L0": float(getattr(init, "base_depth", 1)),
    }  # fmt: skip


def evaluate(formula: Formula, env: Mapping[str, float], what: str) -> float:
    try:
        return formula(**env)
    except FormulaError as exc:
        raise FormulaError(f"{what}: {exc}") from None


def resolved_rule(scheme: Scheme, role: str, env: Mapping[str, float]) -> tuple[str, float, float | None]:
    """(distribution, std or constant, absolute bound or None) of ``role`` in ``env``."""
    r = scheme.rule(role)
    std = 0.0 if r.dist == "zero" else evaluate(r.std, env, f"{scheme.name}: role {role}")
    if r.dist != "const" and std < 0:
        raise FormulaError(f"{scheme.name}: role {role}: std {r.std} = {std:g} is negative")
    bound = None
    if r.bound is not None:
        bound = evaluate(r.bound, {**env, "std": std}, f"{scheme.name}: role {role} bound")
        if bound <= 0:
            raise FormulaError(f"{scheme.name}: role {role}: bound {r.bound} = {bound:g} is not positive")
    return r.dist, std, bound


def effective_std(dist: str, std: float, bound: float | None) -> float:
    """The std the drawn weights really have: a normal truncated at +-c std has
    variance 1 - 2 c phi(c) / (2 Phi(c) - 1) times std^2 (3 std: 0.9733)."""
    if dist == "zero":
        return 0.0
    if dist != "trunc" or std == 0:
        return std
    c = bound / std
    if c > 20:
        return std
    if c < 1e-2:  # the formula below cancels to rounding noise: its series, c^2/3 (1 - 2c^2/15)
        return std * c * math.sqrt((1 - 2 * c * c / 15) / 3)
    phi = math.exp(-c * c / 2) / math.sqrt(2 * math.pi)
    mass = math.erf(c / math.sqrt(2))
    return std * math.sqrt(1 - 2 * c * phi / mass)


# --- the catalogue ------------------------------------------------------------------

_NAIVE_RULES = {
    "embed": rule("sigma_emb"), "pos": rule("sigma_emb"),
    **{r: rule("sigma") for r in ("q", "k", "v", "o", "gate", "up", "down", "head")},
    "norm": rule(1, "const"), "bias": rule(0, "const"), "gain": rule(1, "const"),
}  # fmt: skip


def scheme(name: str, description: str, sources, rules=None, **kw) -> Scheme:
    """A scheme whose rules are ``rules`` over the naive table; strings become formulas."""
    rules = dict(rules or {})
    merged = {**_NAIVE_RULES, **rules}
    for key in ("stream_mult", "branch_mult", "embed_mult", "logit_mult", "attn_scale"):
        if key in kw and kw[key] is not None and not isinstance(kw[key], Formula):
            kw[key] = Formula(kw[key])
    if kw.get("x0_mix") is not None:
        kw["x0_mix"] = tuple(Formula(f) for f in kw["x0_mix"])
    if "depth_factor" in kw and kw["depth_factor"] is not None:
        kw["depth_factor"] = tuple(Formula(f) for f in kw["depth_factor"])
    touched = tuple(r for r in ROLES if r in rules and r != "gain")
    if kw.get("branch_learned"):
        merged["gain"] = Rule(kw.get("branch_mult", Formula("1")), "const")
    return Scheme(name, description, tuple(sources), MappingProxyType(merged), touched, **kw)


def _all(r: Rule, roles=MATRIX_ROLES) -> dict[str, Rule]:
    return dict.fromkeys(roles, r)


_SMALL = "sqrt(2 / (5 * d))"
_XAVIER = "sqrt(2 / (fan_in + fan_out))"
_MUP_HIDDEN = "sigma * sqrt(d0 / d)"

_CATALOGUE = [
    scheme(
        "naive", "Every matrix N(0, sigma^2), no depth scaling (HF Llama, Qwen2, OLMo2 _init_weights).",
        ["HF transformers models/llama/modeling_llama.py _init_weights (initializer_range)"],
        closed_form="v0 + 2L s^2",
    ),
    scheme(
        "gpt2", "W_O and W_down N(0, sigma^2 / 2L): every stream write scaled by 1/sqrt(2L) (GPT-2).",
        ["Radford et al. 2019 sec. 2.3", "karpathy/nanoGPT model.py GPT.__init__ (c_proj.weight)",
         "HF transformers models/gpt2/modeling_gpt2.py _init_weights"],
        {"o": rule("sigma / sqrt(2 * L)"), "down": rule("sigma / sqrt(2 * L)")},
        depth_factor=("1 / (2 * L)", "1 / (2 * L)"), closed_form="v0 + s^2", aliases=("scaled",),
    ),
    scheme(
        "megatron",
        "linear_proj (o) and linear_fc2 (down) N(0, (sigma/sqrt(2L))^2): scaled_init_method_normal "
        "with its multiplier 2 (hybrid models use 1: not modelled).",
        ["NVIDIA/Megatron-LM megatron/core/utils.py scaled_init_method_normal"],
        {"o": rule("sigma / sqrt(2 * L)"), "down": rule("sigma / sqrt(2 * L)")},
        depth_factor=("1 / (2 * L)", "1 / (2 * L)"), closed_form="v0 + s^2",
    ),
    scheme(
        "depth-init", "torchtitan depth_init: o, down AND up (w3) TN(0.02/sqrt(2(l+1)), ±2), q,k,v,gate (w1) "
        "TN(sigma, ±2), embedding N(0,1), untied output TN(1/sqrt(d), ±3/sqrt(d)). The bounds are absolute "
        "(±2 = 100 std): nothing is truncated (torchtitan issue 3334). Because w3 is scaled too, the FFN "
        "branch falls like 1/(l+1)^2, so v_2L = v0 + s_attn^2 H_L/2 + s_ffn^2 H2_L/4 (H2 = sum 1/l^2).",
        ["pytorch/torchtitan torchtitan/models/llama3/model.py TransformerBlock.init_weights",
         "torchtitan models/common/param_init.py depth_scaled_std"],
        {**_all(rule("sigma", "trunc", 2), ("q", "k", "v", "gate")),
         **_all(rule("sigma / sqrt(2 * (l + 1))", "trunc", 2), ("o", "up", "down")),
         "embed": rule(1), "pos": rule(1), "head": rule("1 / sqrt(d)", "trunc", "3 / sqrt(d)")},
        depth_factor=("1 / (2 * (l + 1))", "1 / (2 * (l + 1))^2"),
        closed_form="v0 + s_a^2 H_L / 2 + s_f^2 H2_L / 4 (~ ln L)",
    ),
    scheme(
        "small-wang", "gpt-neox: small_init sqrt(2/(5d)) on embedding, q, k, v, gate, up (and untied head); "
        "wang_init 2/(L sqrt(d)) on o and down.",
        ["EleutherAI/gpt-neox megatron/model/init_functions.py small_init_init_method, wang_init_method"],
        {**_all(rule(_SMALL), ("embed", "pos", "q", "k", "v", "gate", "up", "head")),
         "o": rule("2 / (L * sqrt(d))"), "down": rule("2 / (L * sqrt(d))")},
        depth_factor=("1 / L^2", "1 / L^2"), closed_form="v0 + 2 s^2 / L",
    ),
    scheme(
        "mitchell", "OLMo mitchell: q, k, v, gate, up, embedding, head 1/sqrt(d); o 1/sqrt(2 d (l+1)); "
        "down 1/sqrt(2 d_ff (l+1)); every one truncated at 3 std.",
        ["allenai/OLMo olmo/model.py reset_parameters (InitFnType.mitchell)"],
        {**_all(rule("1 / sqrt(d)", "trunc", "3 * std"),
                ("embed", "pos", "q", "k", "v", "gate", "up", "head")),
         "o": rule("1 / sqrt(2 * d * (l + 1))", "trunc", "3 * std"),
         "down": rule("1 / sqrt(2 * d_ff * (l + 1))", "trunc", "3 * std")},
        depth_factor=("1 / (l + 1)", "1 / (l + 1)"), closed_form="v0 + 2 s^2 H_L (~ ln L)",
    ),
    scheme(
        "full-megatron", "OLMo full_megatron: inputs sigma, o and down sigma/sqrt(2L), head 1/sqrt(d); "
        "tinit truncates at 3 std, as OLMo's configs set init_cutoff_factor 3.",
        ["allenai/OLMo olmo/model.py reset_parameters (InitFnType.full_megatron)"],
        {**_all(rule("sigma", "trunc", "3 * std"), ("q", "k", "v", "gate", "up")),
         **_all(rule("sigma_emb", "trunc", "3 * std"), ("embed", "pos")),
         **_all(rule("sigma / sqrt(2 * L)", "trunc", "3 * std"), ("o", "down")),
         "head": rule("1 / sqrt(d)", "trunc", "3 * std")},
        depth_factor=("1 / (2 * L)", "1 / (2 * L)"), closed_form="v0 + s^2",
    ),
    scheme(
        "olmo2", "OLMo 2: every weight TN(sigma, 3 std), no depth scaling; the architecture changes instead: "
        "reordered norm x + Norm(F(x)) and QK-norm (so v_2L ~ v0 + 2L whatever the init: OLMo issue 797).",
        ["allenai/OLMo configs/official-1124/OLMo2-7B-stage1.yaml",
         "allenai/OLMo-core nn/transformer/init.py"],
        {**_all(rule("sigma", "trunc", "3 * std"), ("q", "k", "v", "o", "gate", "up", "down", "head")),
         **_all(rule("sigma_emb", "trunc", "3 * std"), ("embed", "pos"))},
        placement="reordered", qk_norm=True, closed_form="v0 + 2L (normed branches)",
    ),
    scheme(
        "deepnet",
        "DeepNorm (decoder-only): Xavier normal, gain 1/sqrt(2) on q, k, v and 1 on o, gate, up, down; "
        "then v, o, gate, up, down times beta = (8L)^(-1/4); post-norm with x <- Norm(alpha x + F(x)), "
        "alpha = (2L)^(1/4). Chosen: gate/up both count as fc1, Xavier normal (the paper) for the FFN; "
        "embedding as naive. Theory: attention branch variance x beta^4 (v, o), SwiGLU x ~beta^6 "
        "(silu taken as homogeneous: approximate).",
        ["Wang et al. 2022 (arXiv 2203.00555)", "microsoft/torchscale torchscale/architecture/decoder.py"],
        {**_all(rule(f"{_XAVIER} / sqrt(2)"), ("q", "k")),
         "v": rule(f"{_XAVIER} / sqrt(2) * (8 * L)^(-1/4)"),
         **_all(rule(f"{_XAVIER} * (8 * L)^(-1/4)"), ("o", "gate", "up", "down"))},
        stream_mult="(2 * L)^(1/4)", placement="post",
        depth_factor=("1 / (8 * L)", "(8 * L)^(-3/2)"), closed_form="alpha^2 + s^2 (8L)^(-3/2) (post)",
    ),
    scheme(
        "t-fixup", "T-Fixup (decoder), no norms: Xavier uniform (gain 1/sqrt(2) on q, k), o, gate, up, down "
        "times (9L)^(-1/4), v times (9L)^(-1/4) sqrt(2) over Xavier 1/sqrt(2); embedding N(0, 1/d) times "
        "(9L)^(-1/4).",
        ["Huang et al. 2020 (ICML)", "layer6ai-labs/T-Fixup fairseq/modules/transformer_layer.py"],
        {**_all(rule(f"{_XAVIER} / sqrt(2)", "uniform"), ("q", "k")),
         "v": rule(f"{_XAVIER} * (9 * L)^(-1/4)", "uniform"),
         **_all(rule(f"{_XAVIER} * (9 * L)^(-1/4)", "uniform"), ("o", "gate", "up", "down")),
         **_all(rule("(9 * L)^(-1/4) / sqrt(d)"), ("embed", "pos"))},
        placement="none", depth_factor=("1 / (9 * L)", "(9 * L)^(-3/2)"),
        closed_form="v0 prod_k (1 + rho_k r_k) (approximate; bounded in L)",
    ),
    scheme(
        "rezero", "ReZero: no norms; one learned scalar per block, shared by its two branches, initialised "
        "to 0 (weights as naive): every block starts as the identity.",
        ["Bachlechner et al. 2020", "majumderb/rezero rezero/transformer/rztx.py"],
        branch_mult="0", branch_learned=True, placement="none", closed_form="v0",
    ),
    scheme(
        "zero-out", "W_O and W_down exactly 0: every block starts as the identity (nanochat; modded-nanogpt "
        "issue 10 reports it beat 1/sqrt(2L)).",
        ["karpathy/nanochat nanochat/gpt.py init_weights"],
        {"o": rule(0, "zero"), "down": rule(0, "zero")}, depth_factor=("0", "0"), closed_form="v0",
    ),
    scheme(
        "nanochat", "nanochat: embedding N(0, 0.8^2) (its docstring says 1.0), untied head N(0, 0.001^2), "
        "q, k, v uniform with std 1/sqrt(d), gate and up 0.4 x that, o and down 0, QK-norm; before block l "
        "x <- lambda_l x + mu_l x0 (constants here; learned there). Its RMSNorm is weightless: tinit's has a "
        "gain of 1 (the same at init).",
        ["karpathy/nanochat nanochat/gpt.py (GPT.init_weights, forward)"],
        {"embed": rule(0.8), "pos": rule(0.8), "head": rule(0.001),
         **_all(rule("1 / sqrt(d)", "uniform"), ("q", "k", "v")),
         **_all(rule("0.4 / sqrt(d)", "uniform"), ("gate", "up")),
         "o": rule(0, "zero"), "down": rule(0, "zero")},
        x0_mix=("1.15 - 0.10 * l / max(L - 1, 1)", "0.20 - 0.15 * l / max(L - 1, 1)"),
        placement="pre", qk_norm=True, depth_factor=("0", "0"), closed_form="c_L^2 v0, c <- lambda c + mu",
    ),
    scheme(
        "mup",
        "muP relative to base width d0 (m = d/d0): hidden matrices sigma/sqrt(m), embeddings unchanged, "
        "q zero, logits x 1/m, attention q.k/d_h. (Adam lr / m is training, not init.) With a tied head the "
        "advised zero readout cannot apply.",
        ["Yang et al. 2022 (Tensor Programs V)", "microsoft/mup mup/layer.py MuReadout, mup/init.py"],
        {**_all(rule(_MUP_HIDDEN), ("k", "v", "o", "gate", "up", "down")), "q": rule(0, "zero"),
         "head": rule("sigma")},
        logit_mult="d0 / d", attn_scale="1 / d_h", closed_form="v0 + 2L s^2",
    ),
    scheme(
        "completep",
        "CompleteP (alpha = 1): muP's hidden stds (q not zeroed, as nanoGPT-mup draws q like k), no "
        "1/sqrt(2L), every branch times (L/L0)^-1; logits x 1/m, q.k/d_h.",
        ["Dey et al. 2025 (arXiv 2505.01618)", "EleutherAI/nanoGPT-mup branch completep model.py (Block)"],
        {**_all(rule(_MUP_HIDDEN), ("q", "k", "v", "o", "gate", "up", "down"))},
        branch_mult="(L / L0)^(-1)", logit_mult="d0 / d", attn_scale="1 / d_h",
        closed_form="v0 + 2 s^2 L0^2 / L",
    ),
    scheme(
        "depth-mup", "Depth-muP (alpha = 1/2): as completep with every branch times (L/L0)^(-1/2).",
        ["Yang et al. 2023 (arXiv 2310.02244)",
         "EleutherAI/nanoGPT-mup branch completep (depth_alpha_exp 0.5)"],
        {**_all(rule(_MUP_HIDDEN), ("q", "k", "v", "o", "gate", "up", "down"))},
        branch_mult="(L / L0)^(-1/2)", logit_mult="d0 / d", attn_scale="1 / d_h",
        closed_form="v0 + 2 s^2 L0",
    ),
    scheme(
        "gemma",
        "Gemma: every weight N(0, sigma^2); embedding output x sqrt(d). Its RMSNorm weight starts at 0 "
        "and is applied as (1 + w): the same gain 1 at init as tinit's.",
        ["HF transformers models/gemma/modeling_gemma.py"],
        embed_mult="sqrt(d)", placement="pre", closed_form="v0 + 2L s^2 (v0 = d sigma_emb^2)",
    ),
    scheme(
        "scaled-embed", "Takase et al. 2023: small_init sqrt(2/(5d)) on q, k, v, gate, up; o and down "
        "sigma/sqrt(2L); embeddings std sqrt(0.4) (their 'scaled embed').",
        ["Takase et al. 2023 (arXiv 2312.16903)",
         "Modalities nn/model_initialization/initialization_routines.py"],
        {**_all(rule(_SMALL), ("q", "k", "v", "gate", "up")), "o": rule("sigma / sqrt(2 * L)"),
         "down": rule("sigma / sqrt(2 * L)"), "embed": rule("sqrt(0.4)"), "pos": rule("sqrt(0.4)")},
        depth_factor=("1 / (2 * L)", "1 / (2 * L)"), closed_form="v0 + s^2",
    ),
]

CATALOGUE: dict[str, Scheme] = {s.name: s for s in _CATALOGUE}
#: Schemes registered at run time (``--init-file``), by name.
_CUSTOM: dict[str, Scheme] = {}
ALIASES = {alias: s.name for s in _CATALOGUE for alias in s.aliases}


def names(custom: bool = True) -> list[str]:
    return list(CATALOGUE) + (list(_CUSTOM) if custom else [])


def known(name: str) -> bool:
    return name in CATALOGUE or name in ALIASES or name in _CUSTOM


def get_scheme(name: str) -> Scheme:
    """The scheme called ``name`` (an alias such as ``scaled`` gives ``gpt2``)."""
    name = ALIASES.get(name, name)
    if name in CATALOGUE:
        return CATALOGUE[name]
    if name in _CUSTOM:
        return _CUSTOM[name]
    raise KeyError(f"unknown init scheme {name!r}; choose from {', '.join(names())}")


def register(s: Scheme) -> Scheme:
    """Add a user's scheme (``--init-file``); its name must not shadow the catalogue."""
    if s.name in CATALOGUE or s.name in ALIASES:
        raise FormulaError(f"scheme name {s.name!r} is taken by the catalogue")
    _CUSTOM[s.name] = s
    return s


def parse_init_list(spec: str) -> tuple[str, ...]:
    """``naive,gpt2``, ``all`` (the catalogue, and registered schemes) or ``both``
    (naive,scaled). Raises KeyError naming the unknown scheme."""
    items = [s.strip() for s in spec.split(",") if s.strip()]
    out: list[str] = []
    for item in items:
        if item == "all":
            out += names()
        elif item == "both":
            out += ["naive", "scaled"]
        elif known(item):
            out.append(item)
        else:
            raise KeyError(f"unknown init scheme {item!r}; choose from {', '.join(names())}, all, both")
    if not out:
        raise KeyError(f"no init scheme given; choose from {', '.join(names())}, all, both")
    return tuple(dict.fromkeys(out))


def placements_for(name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """The norm placements a scheme runs in when the user did not choose: its presumed
    one, else ``default``."""
    p = get_scheme(name).placement
    return (p,) if p is not None else tuple(default)


def with_overrides(s: Scheme, **kw) -> Scheme:
    return dataclasses.replace(s, **kw)


__all__ = [
    "ALIASES", "CATALOGUE", "DISTRIBUTIONS", "PLACEMENTS", "ROLES", "Rule", "Scheme", "environment",
    "effective_std", "get_scheme", "known", "names", "parse_init_list", "placements_for", "register",
    "resolved_rule", "role_shape", "rule", "scheme",
]  # fmt: skip
