"""What a role is drawn from: the one resolution of a scheme's rule.

:func:`resolve` turns (scheme, role, the rule's variables) into a :class:`Draw`: the
distribution, the std, the truncation bound and the std the draws really have. tinit's
own init, ``tinit inits``, ``audit --expect`` and ``audit --init`` all call it. :func:`environment` gives the
variables for a parameter of tinit's model; the audit builds its own from the shapes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .formula import Formula, FormulaError
from .schemes import Rule, Scheme


@dataclass(frozen=True)
class Draw:
    """What a role's weights are drawn from, resolved at one shape and layer:
    the distribution, the rule's std (a constant's value), the absolute truncation
    bound (``trunc`` only) and the std the draws really have (a truncated normal's is
    smaller than its ``std``; 0 for ``zero``)."""

    dist: str
    std: float
    bound: float | None
    std_drawn: float

    @property
    def random(self) -> bool:
        """Drawn from a distribution with a positive spread (not a constant, not zero)."""
        return self.dist in ("normal", "trunc", "uniform") and self.std_drawn > 0

    @property
    def kurtosis(self) -> float:
        """E[w^4] / E[w^2]^2 of the distribution: 3 normal, 9/5 uniform, less than 3 for
        a truncated normal; the sampling error of a std grows with it,
        SE(s) = s sqrt((kurtosis - 1) / (4 n))."""
        if self.dist == "normal":
            return 3.0
        if self.dist == "uniform":
            return 1.8
        if self.dist == "trunc" and self.std > 0:
            return truncated_kurtosis(self.bound / self.std)
        return math.nan


def ffn_of(cfg, scheme: Scheme | None) -> tuple[str, int]:
    """(kind, width) of the FFN a model ``cfg`` builds under ``scheme``: the scheme's
    own FFN (nanochat's relu^2 at 4d, Gemma's GeGLU) where its codebase runs one, else
    the model's ``--ffn`` and ``--d-ff``."""
    if scheme is None or scheme.ffn is None:
        return cfg.ffn, cfg.d_ff
    if scheme.d_ff is None:
        return scheme.ffn, cfg.d_ff
    env = {"d": float(cfg.d_model), "L": float(cfg.n_layers), "d_h": float(cfg.head_dim)}
    width = evaluate(scheme.d_ff, env, f"{scheme.name}: FFN width")
    if width < 1 or width != int(width):
        raise FormulaError(f"{scheme.name}: FFN width {scheme.d_ff} = {width:g} is not a whole number >= 1")
    return scheme.ffn, int(width)


def environment(cfg, init, layer: int, shape: tuple[int, ...] | None = None) -> dict[str, float]:
    """The variables of a rule for one parameter (``cfg`` a ModelConfig, ``init`` an
    InitConfig), and ``tied`` (1 when the head is the embedding)."""
    shape = tuple(shape or ())
    fan_in = shape[1] if len(shape) >= 2 else (shape[0] if shape else 1)
    fan_out = shape[0] if shape else 1
    d_ff = ffn_of(cfg, init.definition)[1] if init is not None else cfg.d_ff
    return {
        "l": float(layer), "L": float(cfg.n_layers), "d": float(cfg.d_model), "d_ff": float(d_ff),
        "d_h": float(cfg.head_dim), "fan_in": float(fan_in), "fan_out": float(fan_out),
        "sigma": init.resolved_sigma(cfg.d_model), "sigma_emb": init.resolved_embed_std(cfg.d_model),
        "V": float(cfg.vocab_size), "d0": float(getattr(init, "base_width", 256)),
        "L0": float(getattr(init, "base_depth", 1)), "tied": float(bool(cfg.tie_embeddings)),
    }  # fmt: skip


def evaluate(formula: Formula, env: Mapping[str, float], what: str) -> float:
    try:
        return formula(**env)
    except FormulaError as exc:
        raise FormulaError(f"{what}: {exc}") from None


def evaluate_optional(formula: Formula | None, env: Mapping[str, float], what: str) -> float | None:
    """:func:`evaluate`, or None for a multiplier the scheme does not have."""
    return None if formula is None else evaluate(formula, env, what)


def resolve(scheme: Scheme, role: str, env: Mapping[str, float], rule: Rule | None = None) -> Draw:
    """The one resolution of a scheme: what ``role`` is drawn from in ``env`` (the
    variables of :func:`environment`: layer, shape, widths, sigma, and ``tied``).

    With a tied head (``env["tied"]``) the embedding takes the scheme's tied rule when it
    has one (torchtitan skips the embedding's init and keeps the output layer's).
    ``rule`` replaces the role's own (a bias drawn by the scheme's ``bias_rule``).
    Raises :class:`FormulaError` for a negative std or a bound that is not positive."""
    r = scheme.rule(role) if rule is None else rule
    if role == "embed" and env.get("tied") and scheme.tied_embed is not None:
        r = scheme.tied_embed
    std = 0.0 if r.dist == "zero" else evaluate(r.std, env, f"{scheme.name}: role {role}")
    if r.dist != "const" and std < 0:
        raise FormulaError(f"{scheme.name}: role {role}: std {r.std} = {std:g} is negative")
    bound = None
    if r.bound is not None:
        bound = evaluate(r.bound, {**env, "std": std}, f"{scheme.name}: role {role} bound")
        if bound <= 0:
            raise FormulaError(f"{scheme.name}: role {role}: bound {r.bound} = {bound:g} is not positive")
    drawn = std if r.dist == "const" else effective_std(r.dist, std, bound)
    return Draw(r.dist, std, bound, drawn)


def _truncated_moments(c: float) -> tuple[float, float]:
    """E[z^2] and E[z^4] of N(0, 1) truncated at +-c (integration by parts:
    E[z^2] = 1 - 2 c phi(c) / Z, E[z^4] = 3 - (2 c^3 + 6 c) phi(c) / Z, Z = 2 Phi(c) - 1).
    Below c = 1e-2 those cancel to rounding noise: their series, c^2/3 (1 - 2c^2/15) and
    c^4/5 (1 - 4c^2/21) (the draw is nearly uniform on +-c)."""
    if c < 1e-2:
        return c * c / 3 * (1 - 2 * c * c / 15), c**4 / 5 * (1 - 4 * c * c / 21)
    phi = math.exp(-c * c / 2) / math.sqrt(2 * math.pi)
    mass = math.erf(c / math.sqrt(2))
    return 1 - 2 * c * phi / mass, 3 - (2 * c**3 + 6 * c) * phi / mass


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
    return std * math.sqrt(_truncated_moments(c)[0])


def truncated_kurtosis(c: float) -> float:
    """Kurtosis of N(0, 1) truncated at +-c (3 std: 2.82; 100 std: 3)."""
    if c > 20:
        return 3.0
    m2, m4 = _truncated_moments(c)
    return m4 / (m2 * m2)
