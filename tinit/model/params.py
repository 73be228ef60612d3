"""Exact parameter accounting of a :class:`ModelConfig`, without building anything.

Every count below mirrors a module of :mod:`tinit.model.layers` and
:mod:`tinit.model.transformer` (tests check each against the built modules, on the
meta device for the big shapes):

==============  ===============================================================
embedding       V * d                                   (E, also the tied head)
positions       T_max * d for ``learned``, else 0       (RoPE has no parameters)
attention       4 * d^2 (+ 4d biases)                   per block: W_Q, W_K, W_V, W_O
FFN             swiglu 3 * d * d_ff (+ 2 d_ff + d)      per block: gate, up, down
                gelu   2 * d * d_ff (+ d_ff + d)        per block: W_1, W_2
norms           2 * (d rmsnorm | 2d layernorm)          per block: norm1, norm2 (pre-norm)
final norm      d or 2d for pre-norm, 0 for post-norm   (post-norm's stream is normalised)
head            0 tied, V * d (+ V bias) untied
==============  ===============================================================

Gaussian-branch models (``branch="gaussian"``) have no attention or FFN weights.
Grouped-query attention (``n_kv_heads``) shrinks W_K and W_V to d x (kv_heads d_h);
QK-norm adds two d_h norms per block; the placement says how many norms a block has
(two for pre, post and reordered, four for sandwich, none for ``none``) and whether
there is a final norm (:mod:`tinit.model.placements`); ReZero adds one learned gain
per block.
:func:`gqa_attention_saving` says how many parameters a GQA variant would drop
from the multi-head count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn

from .config import GATED_FFNS, ModelConfig
from .init import role_of

#: Model-level components, in the order tables and plots show them.
COMPONENTS = ("embedding", "positions", "attention", "ffn", "norms", "final_norm", "head")
#: Components repeated in every block.
BLOCK_COMPONENTS = ("attention", "ffn", "norms")


def norm_params(cfg: ModelConfig, width: int | None = None) -> int:
    """One norm of ``cfg`` over ``width`` features (default d): a gain, and LayerNorm's
    bias (the tests hold it against :func:`tinit.theory.norm_params`)."""
    return (2 if cfg.norm == "layernorm" else 1) * (cfg.d_model if width is None else width)


def linear_params(d_in: int, d_out: int, bias: bool) -> int:
    return d_in * d_out + (d_out if bias else 0)


def attention_params(cfg: ModelConfig, qk_norm: bool | None = None, span: str | None = None) -> int:
    """W_Q and W_O d x d; W_K and W_V d x (kv_heads d_h) (d x d without GQA); plus two
    d_h norms with QK-norm (``span`` "full": one over d and one over kv_heads d_h)."""
    span = cfg.qk_norm_span if span is None else span
    d, kv = cfg.d_model, cfg.kv_heads * cfg.head_dim
    qk = cfg.qk_norm if qk_norm is None else qk_norm
    width = d + kv if span == "full" else 2 * cfg.head_dim  # q's norm and k's
    norms = (width if cfg.norm == "rmsnorm" else 2 * width) if qk else 0
    return 2 * linear_params(d, d, cfg.bias) + 2 * linear_params(d, kv, cfg.bias) + norms


def ffn_params(d_model: int, d_ff: int, ffn: str, bias: bool = False) -> int:
    """Gated (gate, up, down) or classic (W_1, W_2) FFN of hidden size ``d_ff``."""
    n_in = 2 if ffn in GATED_FFNS else 1
    return n_in * linear_params(d_model, d_ff, bias) + linear_params(d_ff, d_model, bias)


@dataclass(frozen=True)
class ParamCount:
    """Exact counts of one configuration. Block components are *per block*."""

    embedding: int
    positions: int
    attention: int  # per block
    ffn: int  # per block
    norms: int  # per block: norm1 + norm2 (+ the two output norms of sandwich; + ReZero's gain)
    final_norm: int
    head: int  # 0 when tied
    n_layers: int
    tied: bool

    @property
    def per_block(self) -> int:
        return self.attention + self.ffn + self.norms

    @property
    def blocks(self) -> int:
        return self.n_layers * self.per_block

    @property
    def total(self) -> int:
        return self.embedding + self.positions + self.blocks + self.final_norm + self.head

    def components(self) -> dict[str, int]:
        """Model-level totals by component (block components times L), in COMPONENTS order."""
        return {
            name: getattr(self, name) * (self.n_layers if name in BLOCK_COMPONENTS else 1)
            for name in COMPONENTS
        }


def count_params(cfg: ModelConfig, scheme="naive") -> ParamCount:
    """Exact parameter count of the model ``cfg`` describes (as built by tinit with the
    init scheme ``scheme``, a name or a Scheme: it decides QK-norm when ``cfg.qk_norm``
    is None, adds ReZero's learned gain and sub-LN's inner norms, and may run its own
    FFN)."""
    from .catalogue import get_scheme
    from .draws import ffn_of
    from .schemes import Scheme

    sch = scheme if isinstance(scheme, Scheme) else get_scheme(scheme)
    d, V = cfg.d_model, cfg.vocab_size
    gaussian = cfg.branch == "gaussian"
    qk = sch.qk_norm if cfg.qk_norm is None else cfg.qk_norm
    ffn, d_ff = ffn_of(cfg, sch)
    per_block_norms = cfg.placement.block_norms * norm_params(cfg)
    if sch.subln and not gaussian:  # a norm over d before o, one over d_ff before down
        per_block_norms += norm_params(cfg) + norm_params(cfg, d_ff)
    return ParamCount(
        embedding=V * d,
        positions=cfg.max_seq_len * d if cfg.positions == "learned" else 0,
        attention=0
        if gaussian
        else attention_params(cfg, qk, sch.qk_norm_span if cfg.qk_norm_span is None else cfg.qk_norm_span),
        ffn=0 if gaussian else ffn_params(d, d_ff, ffn, cfg.bias),
        norms=per_block_norms + (1 if sch.branch_learned else 0),
        final_norm=norm_params(cfg) if cfg.placement.final_norm else 0,
        head=0 if cfg.tie_embeddings else linear_params(d, V, cfg.bias),
        n_layers=cfg.n_layers,
        tied=cfg.tie_embeddings,
    )


def tied_saving(cfg: ModelConfig) -> int:
    """Parameters that tying the head to E removes: V * d, plus the head's V biases
    with ``bias=True`` (the tied head has none)."""
    return linear_params(cfg.d_model, cfg.vocab_size, cfg.bias)


def gqa_attention_saving(cfg: ModelConfig, n_kv_heads: int) -> int:
    """Parameters grouped-query attention with ``n_kv_heads`` K/V heads would drop
    from tinit's multi-head count: W_K and W_V shrink from d x d to d x (n_kv * d_h),
    in every block (biases shrink alike)."""
    if n_kv_heads < 1 or cfg.n_heads % n_kv_heads:
        raise ValueError(f"{n_kv_heads} KV heads do not divide {cfg.n_heads} heads")
    kv = n_kv_heads * cfg.head_dim
    per_matrix = linear_params(cfg.d_model, cfg.d_model, cfg.bias) - linear_params(cfg.d_model, kv, cfg.bias)
    return 0 if cfg.branch == "gaussian" else cfg.n_layers * 2 * per_matrix


def count_by_role(named_parameters: Iterable[tuple[str, nn.Parameter]]) -> dict[str, int]:
    """Parameters of built modules, summed by init role (``embed``, ``q``, ..., ``norm``,
    ``bias``). Works on meta-device modules: only shapes are read."""
    out: dict[str, int] = {}
    for name, p in named_parameters:
        role = role_of(name)[0]
        out[role] = out.get(role, 0) + p.numel()
    return out
