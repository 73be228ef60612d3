"""Init schemes as data, and the one function that initialises every weight.

A scheme (an init *scheme*, :mod:`tinit.model.schemes`) is a table from a weight's
*role* to a rule that gives its std and distribution. Every
parameter of the model has exactly one explicit role (:func:`tinit.model.roles.role_of`), so a
depth-scaled init cannot silently miss its matrices because a name match failed
(the bug class of HF transformers #47458, llama2.c #579).

Weights are generated per (seed, layer, role): a standard-normal draw from a
generator seeded by those three, times the scheme's std. Configurations of one
run (naive and scaled, pre- and post-norm) therefore share their draws, and a
block can be rebuilt on the device at any time with identical weights, which is
what streaming and the layer-wise backward rely on.

The first two schemes of the catalogue (docs/design.md §10; GPT-2, Radford et al.
2019, section 2.3; ``scaled`` is an alias of ``gpt2``):

======================  ==================  ===========================
role                    naive               scaled
======================  ==================  ===========================
embed, pos              sigma_emb           sigma_emb
q, k, v                 sigma               sigma
o (writes the stream)   sigma               sigma / sqrt(2L)
gate, up (W_1)          sigma               sigma
down / W_2 (stream)     sigma               sigma / sqrt(2L)
norm gains              1                   1
biases (incl. norm)     0                   0
head (untied)           sigma               sigma
======================  ==================  ===========================
"""

from __future__ import annotations

import hashlib
import math

import torch
from torch import nn

from .config import InitConfig, ModelConfig
from .draws import Draw, environment, ffn_of, resolve
from .roles import role_of, role_shape
from .schemes import bias_role


def role_shape_of(cfg: ModelConfig, role: str, init: InitConfig | None = None) -> tuple[int, ...]:
    """The shape of ``role``'s weight in a model ``cfg`` (torch's (out, in)); with
    ``init``, at the FFN width its scheme builds (nanochat's 4d)."""
    c = cfg
    d_ff = c.d_ff if init is None else ffn_of(c, init.definition)[1]
    return role_shape(role, c.d_model, d_ff, c.head_dim, c.kv_heads, c.vocab_size, c.max_seq_len)


def role_rule(
    init: InitConfig,
    cfg: ModelConfig,
    role: str,
    layer: int = 0,
    shape: tuple[int, ...] | None = None,
    rule=None,
) -> Draw:
    """What ``role`` is drawn from at ``layer`` under the init's scheme, for a weight of
    ``shape`` (default: the role's): :func:`tinit.model.schemes.resolve` in the model's
    environment (distribution, std or constant, absolute bound, the draws' std)."""
    env = environment(cfg, init, layer, role_shape_of(cfg, role, init) if shape is None else shape)
    return resolve(init.definition, role, env, rule)


def role_std(init: InitConfig, cfg: ModelConfig, role: str, layer: int = 0) -> float:
    """The std (or constant, for norm gains and biases) the scheme gives ``role``
    (the nominal std: a truncated normal's drawn std is ``role_rule(...).std_drawn``)."""
    return role_rule(init, cfg, role, layer).std


def draw_seed(seed: int, layer: int, role: str) -> int:
    """A 63-bit generator seed determined by (seed, layer, role) alone."""
    digest = hashlib.blake2b(f"tinit/{seed}/{layer}/{role}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def generator(seed: int, layer: int, key: str, device: torch.device | str) -> torch.Generator:
    """A generator on ``device`` whose stream is determined by (seed, layer, key) alone."""
    gen = torch.Generator(device=device)
    gen.manual_seed(draw_seed(seed, layer, key))
    return gen


@torch.no_grad()
def init_weights_(
    module: nn.Module, cfg: ModelConfig, init: InitConfig, layer: int, prefix: str = ""
) -> None:
    """Initialise every parameter of ``module`` (a block, or the model's non-block parts).

    This is the only place weights get values. Each parameter's role comes from
    :func:`~tinit.model.roles.role_of`; Gaussian roles get ``std * N(0, 1)`` drawn per
    (init.seed, layer, draw key) on the parameter's own device and dtype; norm gains
    get 1 and biases 0. ``layer`` is the block index, -1 for the embedding side and
    L for the final norm and head. ``prefix`` is the module's name inside the model
    when it is initialised on its own (``"embed"``, ``"head"``, ...).
    """
    params = dict(module.named_parameters(prefix=prefix))
    for name, p in params.items():
        role, key = role_of(name)  # every parameter needs a role, even on the meta device
        if p.device.type == "meta":  # shapes only (parameter counting): nothing to draw
            continue
        shape = tuple(p.shape)
        owner = name.split(".")[-2] if "." in name else ""
        rule = None
        if role == "bias" and bias_role(init.definition, owner) != "bias":
            # nn.Linear's bias as the scheme's upstream keeps it: the weight's rule at the
            # weight's fan_in (torchscale: U(+-1/sqrt(fan_in)) times the weight's scale), or
            # the scheme's bias_rule there (fairseq's q, k, v under Xavier weights)
            role, shape = owner, tuple(params[name[: -len("bias")] + "weight"].shape)
            rule = init.definition.bias_rule
        draw = role_rule(init, cfg, role, layer, shape, rule)
        fill_(p, draw, generator(init.seed, layer, key, p.device))


def fill_(p: torch.Tensor, draw: Draw, gen: torch.Generator) -> None:
    """Set ``p`` in place to what ``draw`` says: a constant, zeros, or a draw from its
    distribution (:func:`draw_`). tinit's init and ``audit --init`` both call it."""
    if draw.dist == "const":
        p.fill_(draw.std)
    elif draw.dist == "zero":
        p.zero_()
    else:
        draw_(p, draw.dist, draw.std, draw.bound, gen)


def draw_(p: torch.Tensor, dist: str, std: float, bound: float | None, gen: torch.Generator) -> None:
    """Fill ``p`` in place from ``gen``. Every distribution starts from the same
    standard-normal draw, so schemes share their draws: ``normal`` is std * z;
    ``trunc`` redraws the z outside +-bound/std (from the same generator) until none
    is (a bound under 1 std maps z through the normal CDF into the interval instead,
    which needs no redraws); ``uniform`` maps z through the normal CDF, sqrt(3) std erf(z / sqrt 2), which is
    exactly U(-sqrt(3) std, sqrt(3) std)."""
    if dist == "normal":
        # drawn in place, in the parameter's dtype, on its device: no host copy
        p.normal_(0.0, std, generator=gen)
        return
    dtype = p.dtype if p.dtype in (torch.float32, torch.float64) else torch.float32
    z = torch.empty(p.shape, dtype=dtype, device=p.device).normal_(0.0, 1.0, generator=gen)
    if dist == "trunc":
        c = bound / std if std > 0 else math.inf
        if c < 1:
            # a narrow bound would take ~1/(0.8 c) redraws per weight (forever at 1e-30):
            # map z through the normal CDF into [-c, c] instead, exactly TN(0, 1, +-c)
            z = torch.erfinv(torch.erf(z / math.sqrt(2.0)).mul_(math.erf(c / math.sqrt(2.0))))
            z.mul_(math.sqrt(2.0)).clamp_(-c, c)
        out = z.abs() > c
        while bool(out.any()):
            z[out] = torch.randn(int(out.sum()), generator=gen, device=p.device, dtype=dtype)
            out = z.abs() > c
        z.mul_(std)
    elif dist == "uniform":
        z = torch.erf(z / math.sqrt(2.0)).mul_(math.sqrt(3.0) * std)
    else:
        raise ValueError(f"unknown distribution {dist!r}")
    p.copy_(z)
