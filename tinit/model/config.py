"""Frozen, validated configuration of the canonical model (docs/design.md §10).

Every string choice is a ``Literal`` (the norm placement: a name of the registry
:data:`tinit.model.placements.PLACEMENTS`, resolved by :attr:`ModelConfig.placement`)
so a config stays JSON-serialisable and the choices are visible in one place. Derived
sizes are resolved in ``__post_init__``, so a config that exists is a config that can
be built.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from .catalogue import get_scheme, known, names
from .checks import (
    MAX_LAYERS,
    MAX_MF_DRAWS,
    ConfigError,
    check_bool,
    check_choice,
    check_count,
    check_positive_int,
    check_real,
    is_real,
    nonneg,
    positive,
    sigma_value,
)
from .flags import INIT, MODEL, RUN, Many, flag
from .placements import PLACEMENTS, Placement
from .presets import get_preset
from .schemes import Scheme
from .structure import STRUCTURE_FIELDS, apply_scheme, user_schemes

NormKind = Literal["rmsnorm", "layernorm"]
NormPosition = str  # a name of tinit.model.placements.PLACEMENTS (validated against the registry)
FfnKind = Literal["swiglu", "gelu", "geglu", "relu2", "relu"]
PositionsKind = Literal["rope", "none", "learned"]
AttentionKind = Literal["causal", "bidirectional"]
BranchKind = Literal["model", "gaussian"]
SchemeName = str  # a scheme of tinit.model.schemes (naive, gpt2 alias scaled, ...)
DTypeName = Literal["float32", "bfloat16", "float64"]
QKNormSpan = Literal["head", "full"]
#: FFNs with a gate (three matrices: gate, up, down).
GATED_FFNS = ("swiglu", "geglu")


def swiglu_hidden(d_model: int, multiple_of: int = 64) -> int:
    """d_ff = 8d/3 rounded up to a multiple of 64: the gated FFN's three matrices then
    hold (about) as many parameters as the classic 2-matrix FFN at 4d."""
    return multiple_of * math.ceil(8 * d_model / 3 / multiple_of)


@dataclass(frozen=True)
class ModelConfig:
    """Shape and architecture of one transformer stack."""

    # L: the stack performs 2L residual additions
    n_layers: int = field(default=12, metadata=flag(
        "--layers", "-L", panel=MODEL, min=1, help="Number of layers L (2L residual additions).",
        many=Many("layers", "Depths to sweep: a comma list (1,2,4,12,80), an arithmetic range "
                  "start:stop:step (12:96:12, stop included), a geometric range start:stop:xFACTOR "
                  "(4:128:x2), or a mix."),
    ))  # fmt: skip
    # residual-stream width d
    d_model: int = field(default=256, metadata=flag(
        "--d-model", panel=MODEL, min=1, help="Residual-stream width d.",
        many=Many("widths", "Widths d: a comma list (64,128,256), each divisible by --heads; each width "
                  "takes its default FFN width.", "48,96,...", also=("d_ff",)),
    ))  # fmt: skip
    # must divide d_model; d_h = d_model / n_heads
    n_heads: int = field(default=4, metadata=flag(
        "--heads", panel=MODEL, min=1, help="Attention heads; must divide --d-model.",
    ))  # fmt: skip
    # FFN hidden size; None -> 8d/3 (gated: swiglu, geglu; rounded up to 64) or 4d
    d_ff: int | None = field(default=None, metadata=flag(
        "--d-ff", panel=MODEL, min=1, show_default=False,
        help="FFN hidden size (default: 8d/3 rounded up to 64 for swiglu, 4d for gelu).",
    ))  # fmt: skip
    # V: rows of the embedding (and of the head)
    vocab_size: int = field(default=1024, metadata=flag(
        "--vocab", panel=MODEL, min=1, help="Vocabulary size V.",
    ))  # fmt: skip
    max_seq_len: int = 128  # longest sequence: sizes the learned position table and RoPE cache
    # RMSNorm drops LayerNorm's centring and bias
    norm: NormKind = field(default="rmsnorm", metadata=flag(
        "--norm", panel=MODEL, help="Normalisation layer.",
    ))  # fmt: skip
    norm_position: NormPosition = "pre"  # pre x+F(N(x)); post N(x+F(x)); sandwich; reordered; none
    # RMSNorm on q and k per head; None -> what the init scheme presumes
    qk_norm: bool | None = field(default=None, metadata=flag(
        "--qk-norm/--no-qk-norm", panel=MODEL, show_default=False,
        help="RMSNorm on every head's q and k (default: as the scheme presumes; olmo2, nanochat).",
    ))  # fmt: skip
    # grouped-query attention: K/V heads (None -> n_heads)
    n_kv_heads: int | None = field(default=None, metadata=flag(
        "--kv-heads", panel=MODEL, min=1, show_default=False,
        help="K/V heads (grouped-query attention); must divide --heads (default: --heads).",
    ))  # fmt: skip
    # gated (swiglu, geglu: 3 matrices) or 2 matrices (gelu, relu^2, relu)
    ffn: FfnKind = field(default="swiglu", metadata=flag(
        "--ffn", panel=MODEL,
        help="Feed-forward network: gated SwiGLU or GeGLU (Gemma), classic GELU, or relu^2 "
             "(nanochat). Gemma's and nanochat's schemes build their codebase's own.",
    ))  # fmt: skip
    # RoPE has no parameters; learned adds a table to x0
    positions: PositionsKind = field(default="rope", metadata=flag(
        "--positions", panel=MODEL, help="Position information: RoPE, none, or a learned table.",
    ))  # fmt: skip
    # causal mask or full bidirectional attention
    attention: AttentionKind = field(default="causal", metadata=flag(
        "--attention", panel=MODEL, help="Attention mask.",
    ))  # fmt: skip
    # divide logits by sqrt(d_h); off only to study why it is there
    attn_scale: bool = field(default=True, metadata=flag(
        "--no-attn-scale", param='no_attn_scale', negates=True, panel=MODEL,
        help="Drop the 1/sqrt(d_h) logit scale (to study why it is there).",
    ))  # fmt: skip
    # head reuses E: saves V*d parameters
    tie_embeddings: bool = field(default=True, metadata=flag(
        "--untie", param='untie', negates=True, panel=MODEL,
        help="Untied output head (default: head reuses the embedding).",
    ))  # fmt: skip
    # zero-initialised biases on every linear layer
    bias: bool = field(default=False, metadata=flag(
        "--bias", panel=MODEL, help="Zero-initialised biases on every linear layer.",
    ))  # fmt: skip
    norm_eps: float = 1e-6  # added to the mean square (variance) inside every norm
    rope_base: float = 10000.0  # RoPE frequency base (Su et al. 2021)
    # gaussian: every branch is an independent N(0, branch_var)
    branch: BranchKind = field(default="model", metadata=flag(
        "--branch", panel=MODEL,
        help="'gaussian' replaces every branch by independent N(0, --branch-var) noise: the one "
             "model in which v_2L = v0 + 2L s^2 holds exactly.",
    ))  # fmt: skip
    # variance of a Gaussian branch (only with branch="gaussian")
    branch_var: float = field(default=1.0, metadata=flag(
        "--branch-var", panel=MODEL, callback=nonneg,
        help="Variance S2 of each Gaussian branch (with --branch gaussian).",
    ))  # fmt: skip
    qk_norm_span: QKNormSpan | None = None  # QK-norm per head ("head") or across q, k ("full"); None: scheme
    # structure fields (STRUCTURE_FIELDS) the user set: an init scheme's structure does not replace them
    user_set: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "vocab_size", "max_seq_len"):
            check_positive_int(name, getattr(self, name))
        check_count("n_layers", self.n_layers, MAX_LAYERS, why=" (DeepNet's 1,000 is the deepest published)")
        for name in ("norm", "norm_position", "ffn", "positions", "attention", "branch"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(name, f"must be a string, got {getattr(self, name)!r}")
        if self.d_model % self.n_heads:
            raise ConfigError("n_heads", f"{self.n_heads} does not divide d_model {self.d_model}")
        if self.n_kv_heads is not None:
            check_positive_int("n_kv_heads", self.n_kv_heads)
            if self.n_heads % self.n_kv_heads:
                msg = f"{self.n_kv_heads} K/V heads do not divide {self.n_heads} heads"
                raise ConfigError("n_kv_heads", msg)
        check_choice("norm", self.norm, NormKind)
        check_choice("norm_position", self.norm_position, PLACEMENTS)
        check_choice("ffn", self.ffn, FfnKind)
        check_choice("positions", self.positions, PositionsKind)
        check_choice("attention", self.attention, AttentionKind)
        check_choice("branch", self.branch, BranchKind)
        if self.positions == "rope" and self.head_dim % 2:
            # the width is to blame when no head count gives it an even head size (odd) or
            # it is too narrow for any (d_h = 1); else the head count
            field = "d_model" if self.d_model % 2 or self.head_dim == 1 else "n_heads"
            raise ConfigError(field, f"RoPE needs an even head size, got d_h = d_model {self.d_model} / "
                              f"{self.n_heads} heads = {self.head_dim}")  # fmt: skip
        if self.d_ff is None:
            d_ff = swiglu_hidden(self.d_model) if self.ffn in GATED_FFNS else 4 * self.d_model
            object.__setattr__(self, "d_ff", d_ff)
        check_positive_int("d_ff", self.d_ff)
        check_real("norm_eps", self.norm_eps, 0, strict=False)
        check_real("branch_var", self.branch_var, 0, strict=False)
        # RoPE's angles are position * base^(-2i/d_h): base 0 makes them inf (NaN logits)
        check_real("rope_base", self.rope_base, 0, strict=True)
        for name in ("attn_scale", "tie_embeddings", "bias"):
            check_bool(name, getattr(self, name))
        check_bool("qk_norm", self.qk_norm, optional=True)
        if self.qk_norm_span is not None:
            check_choice("qk_norm_span", self.qk_norm_span, QKNormSpan)
        if not isinstance(self.user_set, tuple) or any(f not in STRUCTURE_FIELDS for f in self.user_set):
            allowed = ", ".join(STRUCTURE_FIELDS)
            raise ConfigError("user_set", f"must be a tuple of {allowed}, got {self.user_set!r}")

    @classmethod
    def from_scheme(cls, name: str, *, schemes: Iterable[Scheme] = (), **overrides: Any) -> ModelConfig:
        """The whole model the init scheme ``name`` (a catalogue name or alias, or the name
        of one of the user's ``schemes``) runs upstream: its placement, tying, norm, biases,
        QK-norm and its span, FFN, norm eps and RoPE base where it fixes them, the rest
        ModelConfig's defaults. ``overrides`` are field values the user sets: they take
        precedence (and are listed in ``user_set``; :func:`tinit.model.structure.scheme_overrides`
        names those that contradict the scheme). A ConfigError names a bad field (an unknown
        one included) or ``schemes`` that are not a tuple of Scheme values."""
        schemes = user_schemes(schemes)
        unknown = sorted(set(overrides) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(unknown[0], f"ModelConfig has no field {unknown[0]!r}")
        given = (*overrides.pop("user_set", ()), *(f for f in overrides if f in STRUCTURE_FIELDS))
        return apply_scheme(cls(**overrides, user_set=tuple(dict.fromkeys(given))), name, schemes)

    @classmethod
    def from_preset(cls, name: str | None, *, leave: Iterable[str] = (), **fields: Any) -> ModelConfig:
        """The model of the preset ``name`` (:mod:`tinit.model.presets`; None: the defaults)
        with ``fields`` on top: the preset's fields but those in ``leave`` (the caller
        decides them), and a sequence cache of at least the preset's context (a learned
        position table of that many rows; a run may use fewer). A ConfigError names a bad
        field; an unknown preset is a KeyError naming the choices."""
        if name is None:
            return cls(**fields)
        preset = get_preset(name)
        leave = set(leave)
        kw = {**{f: v for f, v in preset.model.items() if f not in leave}, **fields}
        kw["max_seq_len"] = max(kw.get("max_seq_len", cls.max_seq_len), preset.context)
        return cls(**kw)

    @property
    def placement(self) -> Placement:
        """Where the norms sit (:mod:`tinit.model.placements`): ``norm_position``'s value."""
        return PLACEMENTS[self.norm_position]

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def n_additions(self) -> int:
        return 2 * self.n_layers

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class InitConfig:
    """Which init scheme (``scheme``: a name of the catalogue or of ``schemes``), at
    which scale, from which seed.

    ``schemes`` carries the user's own schemes (``--init-file``) as frozen values, so a
    config that crosses a process boundary (a sweep's spawned worker, a SLURM task)
    brings them along: nothing is looked up in a process-global table."""

    scheme: SchemeName = "naive"  # a catalogue scheme: naive, gpt2 (alias scaled), depth-init, ...
    # base std; "inv-sqrt-d" means 1/sqrt(d_model)
    sigma: float | Literal["inv-sqrt-d"] = field(default=0.02, metadata=flag(
        "--sigma", type=str, default="0.02", panel=INIT, parser=sigma_value, metavar="FLOAT|inv-sqrt-d",
        help="Base init std: a number, or 'inv-sqrt-d' for 1/sqrt(d).",
    ))  # fmt: skip
    # std of the embedding (and learned positions); None -> sigma
    embed_std: float | None = field(default=None, metadata=flag(
        "--embed-std", panel=INIT, callback=positive, show_default=False,
        help="Std of the embedding (and learned positions) (default: --sigma).",
    ))  # fmt: skip
    # weights are drawn per (seed, layer, role): configs share their draws
    seed: int = field(default=0, metadata=flag(
        "--seed", panel=INIT, min=0,
        help="Seed of the weights (drawn per seed, layer, role) and the tokens.",
    ))  # fmt: skip
    # d0 of muP / CompleteP (width multiplier m = d / d0)
    base_width: int = field(default=256, metadata=flag(
        "--base-width", panel=INIT, min=1, help="Base width d0 of mup/completep/depth-mup.",
    ))  # fmt: skip
    # L0 of CompleteP / depth-muP (branch multiplier (L / L0)^-alpha)
    base_depth: int = field(default=1, metadata=flag(
        "--base-depth", panel=INIT, min=1, help="Base depth L0 of completep/depth-mup.",
    ))  # fmt: skip
    schemes: tuple[Scheme, ...] = ()  # the user's schemes (--init-file), carried with the config

    def __post_init__(self) -> None:
        if not isinstance(self.schemes, tuple) or not all(isinstance(s, Scheme) for s in self.schemes):
            raise ConfigError("schemes", f"must be a tuple of Scheme, got {self.schemes!r}")
        if not isinstance(self.scheme, str) or not known(self.scheme, self.schemes):
            raise ConfigError("scheme", f"{self.scheme!r} is not one of {', '.join(names(self.schemes))}")
        check_positive_int("base_width", self.base_width)
        check_positive_int("base_depth", self.base_depth)
        if isinstance(self.sigma, str):
            if self.sigma != "inv-sqrt-d":
                raise ConfigError("sigma", f"must be a positive number or 'inv-sqrt-d', got {self.sigma!r}")
        elif not (is_real(self.sigma) and math.isfinite(self.sigma) and self.sigma > 0):
            raise ConfigError("sigma", f"must be a positive number or 'inv-sqrt-d', got {self.sigma!r}")
        if self.embed_std is not None:
            check_real("embed_std", self.embed_std, 0, strict=True)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError("seed", f"must be a whole number >= 0, got {self.seed!r}")

    def resolved_sigma(self, d_model: int) -> float:
        return 1.0 / math.sqrt(d_model) if self.sigma == "inv-sqrt-d" else float(self.sigma)

    @property
    def definition(self) -> Scheme:
        """The :class:`tinit.model.schemes.Scheme` this config names."""
        return get_scheme(self.scheme, self.schemes)

    @property
    def recipe(self) -> str:
        """Deprecated: the scheme's name, ``scheme`` (kept for one release)."""
        warnings.warn("InitConfig.recipe is deprecated: use .scheme", DeprecationWarning, stacklevel=2)
        return self.scheme

    def lookup(self, name: str) -> Scheme:
        """The scheme ``name``: the catalogue's or one this config carries."""
        return get_scheme(name, self.schemes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the user's schemes by name, description and source file."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "schemes"}
        out["schemes"] = [{"name": s.name, "description": s.description, "sources": list(s.sources)}
                          for s in self.schemes]  # fmt: skip
        return out

    def resolved_embed_std(self, d_model: int) -> float:
        return self.resolved_sigma(d_model) if self.embed_std is None else float(self.embed_std)


@dataclass(frozen=True)
class RunConfig:
    """Where and how a measurement runs: the data, the device, the precision."""

    # sequences per batch
    batch: int = field(default=8, metadata=flag(
        "--batch", panel=RUN, min=1, help="Sequences per batch.",
    ))  # fmt: skip
    # tokens per sequence
    seq_len: int = field(default=128, metadata=flag(
        "--seq-len", panel=RUN, min=1, help="Tokens per sequence.",
    ))  # fmt: skip
    # auto: cuda when available, else cpu
    device: str = field(default="auto", metadata=flag(
        "--device", type=Literal["auto", "cpu", "cuda"], panel=RUN,
        help="Where to run: cuda when available (auto), cpu, or cuda.",
    ))  # fmt: skip
    # bf16 runs keep their statistics in float32
    dtype: DTypeName = field(default="float32", metadata=flag(
        "--dtype", panel=RUN,
        help="Weights and activations dtype; statistics accumulate in float32 (float64 for float64"
             " runs).",
    ))  # fmt: skip
    # build each block just before it runs; None -> when needed
    stream: bool | None = field(default=None, metadata=flag(
        "--stream/--no-stream", panel=RUN, show_default=False,
        help="Build each block just before it runs and drop it after, so memory does not grow with"
             " depth (default: a forward without gradients on the CPU always; otherwise when the "
             "built model would not fit).",
    ))  # fmt: skip
    data_seed: int | None = None  # seed of the random tokens; None -> the init seed
    # heads drawn per sequence at each attention by the large-width prediction (tinit.mf);
    # 0: no prediction (its columns empty)
    mf_draws: int = 4
    # allow TF32 matmuls on CUDA in float32 runs (faster, 10-bit mantissa)
    tf32: bool = field(default=False, metadata=flag(
        "--tf32", panel=RUN,
        help="Allow TF32 matmuls on CUDA in float32 runs (faster, 10-bit mantissa; recorded in "
             "config.json as tf32_matmul).",
    ))  # fmt: skip
    extra: dict[str, Any] = field(default_factory=dict)  # command-specific settings, recorded

    def __post_init__(self) -> None:
        check_positive_int("batch", self.batch)
        check_positive_int("seq_len", self.seq_len)
        if not isinstance(self.dtype, str):
            raise ConfigError("dtype", f"must be a string, got {self.dtype!r}")
        check_choice("dtype", self.dtype, DTypeName)
        if not isinstance(self.device, str) or (
            self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:")
        ):
            raise ConfigError("device", f"{self.device!r} is not one of 'auto', 'cpu', 'cuda', 'cuda:N'")
        check_bool("stream", self.stream, optional=True)
        check_bool("tf32", self.tf32)
        if self.data_seed is not None and (
            isinstance(self.data_seed, bool) or not isinstance(self.data_seed, int) or self.data_seed < 0
        ):
            raise ConfigError("data_seed", f"must be a whole number >= 0 or None, got {self.data_seed!r}")
        check_count(
            "mf_draws",
            self.mf_draws,
            MAX_MF_DRAWS,
            least=0,
            why=" (0: no prediction; the Monte Carlo error falls as 1/sqrt(draws))",
        )
        if not isinstance(self.extra, dict):
            raise ConfigError("extra", f"must be a dict, got {self.extra!r}")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_INIT_CONFIG_INIT = InitConfig.__init__


def _init_config_init(self: InitConfig, *args: Any, recipe: str | None = None, **kw: Any) -> None:
    """``InitConfig(scheme=...)``: the deprecated name of ``scheme`` (one release)."""
    if recipe is not None:
        warnings.warn("InitConfig(scheme=...) is deprecated; use scheme=", DeprecationWarning, stacklevel=2)
        kw["scheme"] = recipe
    _INIT_CONFIG_INIT(self, *args, **kw)


InitConfig.__init__ = _init_config_init  # type: ignore[method-assign]
