"""Init recipes as data, and the one function that initialises every weight.

A recipe is a table from a weight's *role* to a rule that gives its std. Every
parameter of the model has exactly one explicit role (see :func:`role_of`), so a
depth-scaled init cannot silently miss its matrices because a name match failed
(the bug class of HF transformers #47458, llama2.c #579).

Weights are generated per (seed, layer, role): a standard-normal draw from a
generator seeded by those three, times the recipe's std. Configurations of one
run (naive and scaled, pre- and post-norm) therefore share their draws, and a
block can be rebuilt on the device at any time with identical weights, which is
what streaming and the layer-wise backward rely on.

Recipes (DESIGN.md section 2; GPT-2, Radford et al. 2019, section 2.3):

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from .config import InitConfig, ModelConfig

# Roles drawn from N(0, std^2); the others are constants.
GAUSSIAN_ROLES = ("embed", "pos", "q", "k", "v", "o", "gate", "up", "down", "head")
CONSTANT_ROLES = ("norm", "bias")
ROLES = GAUSSIAN_ROLES + CONSTANT_ROLES
#: Roles that write into the residual stream: the ones depth scaling touches.
STREAM_WRITERS = ("o", "down")


@dataclass(frozen=True)
class StdContext:
    """What a std rule may depend on."""

    sigma: float
    embed_std: float
    n_layers: int


StdRule = Callable[[StdContext], float]


def _sigma(c: StdContext) -> float:
    return c.sigma


def _embed(c: StdContext) -> float:
    return c.embed_std


def _depth_scaled(c: StdContext) -> float:
    """GPT-2's rule: each of the 2L stream-writing branches gets variance sigma^2 / 2L."""
    return depth_scaled_std(c.sigma, c.n_layers)


def _one(c: StdContext) -> float:
    return 1.0


def _zero(c: StdContext) -> float:
    return 0.0


def depth_scaled_std(sigma: float, n_layers: int) -> float:
    """sigma / sqrt(2L): the std of W_O and W_down under the scaled recipe."""
    return sigma / math.sqrt(2 * n_layers)


_NAIVE: dict[str, StdRule] = {
    "embed": _embed,
    "pos": _embed,
    "q": _sigma,
    "k": _sigma,
    "v": _sigma,
    "o": _sigma,
    "gate": _sigma,
    "up": _sigma,
    "down": _sigma,
    "head": _sigma,
    "norm": _one,  # gains start at 1: the block begins as a pure pass-through
    "bias": _zero,
}

#: The recipes, by name. Adding one (DeepNorm, small_init, ...) is a new table here.
RECIPES: Mapping[str, Mapping[str, StdRule]] = {
    "naive": _NAIVE,
    "scaled": {**_NAIVE, "o": _depth_scaled, "down": _depth_scaled},
}


def role_std(init: InitConfig, cfg: ModelConfig, role: str) -> float:
    """The std (or constant, for norm gains and biases) the recipe gives ``role``."""
    ctx = StdContext(
        sigma=init.resolved_sigma(cfg.d_model),
        embed_std=init.resolved_embed_std(cfg.d_model),
        n_layers=cfg.n_layers,
    )
    return RECIPES[init.recipe][role](ctx)


def draw_seed(seed: int, layer: int, role: str) -> int:
    """A 63-bit generator seed determined by (seed, layer, role) alone."""
    digest = hashlib.blake2b(f"tinit/{seed}/{layer}/{role}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def generator(seed: int, layer: int, key: str, device: torch.device | str) -> torch.Generator:
    """A generator on ``device`` whose stream is determined by (seed, layer, key) alone."""
    gen = torch.Generator(device=device)
    gen.manual_seed(draw_seed(seed, layer, key))
    return gen


def role_of(param_name: str) -> tuple[str, str]:
    """(role, draw key) of a parameter, from its name inside a block or the model.

    Names are the module paths of :mod:`tinit.model.transformer`; an unknown name is
    an error rather than a silently skipped weight. The draw key identifies the draw
    (q.weight and k.weight have the same role rule but independent draws).
    """
    *path, leaf = param_name.split(".")
    owner = path[-1] if path else ""
    if leaf == "bias":
        return "bias", param_name
    if owner.startswith("norm") or owner == "final_norm":
        return "norm", param_name
    if owner in ("q", "k", "v", "o", "gate", "up", "down", "embed", "pos", "head"):
        return owner, owner
    raise KeyError(f"no init role for parameter {param_name!r}")


@torch.no_grad()
def init_weights_(
    module: nn.Module, cfg: ModelConfig, init: InitConfig, layer: int, prefix: str = ""
) -> None:
    """Initialise every parameter of ``module`` (a block, or the model's non-block parts).

    This is the only place weights get values. Each parameter's role comes from
    :func:`role_of`; Gaussian roles get ``std * N(0, 1)`` drawn per
    (init.seed, layer, draw key) on the parameter's own device and dtype; norm gains
    get 1 and biases 0. ``layer`` is the block index, -1 for the embedding side and
    L for the final norm and head. ``prefix`` is the module's name inside the model
    when it is initialised on its own (``"embed"``, ``"head"``, ...).
    """
    for name, p in module.named_parameters(prefix=prefix):
        role, key = role_of(name)  # every parameter needs a role, even on the meta device
        if p.device.type == "meta":  # shapes only (parameter counting): nothing to draw
            continue
        std = role_std(init, cfg, role)
        if role in CONSTANT_ROLES:
            p.fill_(std)
        else:
            # drawn in place, in the parameter's dtype, on its device: no host copy
            p.normal_(0.0, std, generator=generator(init.seed, layer, key, p.device))
