"""The shared options of docs/design.md §8, declared once, and what turns them
into configs. ``@shared_options`` adds them to a command, so every command spells
them, documents them and validates them the same way."""

import functools
import inspect
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from ..model.catalogue import names as scheme_names
from ..model.catalogue import parse_init_list
from ..model.config import (
    AttentionKind,
    BranchKind,
    ConfigError,
    DTypeName,
    FfnKind,
    InitConfig,
    ModelConfig,
    NormKind,
    PositionsKind,
    RunConfig,
)
from ..model.placements import PLACEMENTS
from ..model.presets import PRESETS, get_preset
from ..results.formats import FORMATS
from .clickcompat import ParameterSource, get_current_context
from .init_file import load_init_file

MODEL, INIT, RUN, OUTPUT = "Model", "Initialisation", "Run", "Output"

#: Config field -> the option that sets it, so a ConfigError names the option.
FIELD_OPTIONS = {
    "n_layers": "--layers", "d_model": "--d-model", "n_heads": "--heads", "d_ff": "--d-ff",
    "vocab_size": "--vocab", "max_seq_len": "--seq-len", "seq_len": "--seq-len", "batch": "--batch",
    "norm": "--norm", "ffn": "--ffn", "positions": "--positions", "attention": "--attention",
    "sigma": "--sigma", "embed_std": "--embed-std", "seed": "--seed", "device": "--device",
    "dtype": "--dtype", "recipe": "--init", "branch": "--branch", "branch_var": "--branch-var",
    "norm_position": "--norm-position", "norm_eps": "--norm-eps", "head_dims": "--head-dims",
    "transfer_from": "--transfer-from",
    "n_kv_heads": "--kv-heads", "base_width": "--base-width", "base_depth": "--base-depth",
    "init_file": "--init-file", "data": "--data", "lr": "--lr", "warmup": "--warmup",
}  # fmt: skip


def _sigma(value: str) -> float | str:
    if value == "inv-sqrt-d":
        return value
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise typer.BadParameter(f"{value!r} is not a positive number or 'inv-sqrt-d'")
    return x


def _preset_name(value: str | None) -> str | None:
    if value is not None and value not in PRESETS:
        raise typer.BadParameter(f"unknown preset {value!r}; choose from {', '.join(PRESETS)}")
    return value


def _formats(value: str) -> list[str]:
    """The plot formats to write: always PNG, then the ones asked for."""
    out = [v.strip().lower() for v in value.split(",") if v.strip()]
    bad = [v for v in out if v not in FORMATS]
    if bad or not out:
        raise typer.BadParameter(f"{value!r}: give a comma list of {', '.join(FORMATS)}")
    return list(dict.fromkeys(["png", *out]))


def default_threads() -> int:
    """torch's CPU threads when --threads is not given: $OMP_NUM_THREADS when set (a
    whole number >= 1), else 1 (see the README's Performance section for why)."""
    try:
        n = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        return 1
    return n if n >= 1 else 1


def set_threads(n: int | None) -> int:
    """Set torch's intra-op CPU threads (``None``: :func:`default_threads`); returns it."""
    import torch

    n = default_threads() if n is None else n
    torch.set_num_threads(n)
    return n


def _positive_float(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"{value} is not a positive number")
    return value


def _nonneg_float(value: float) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(f"{value} is not a finite number >= 0")
    return value


def _placements(value: str | None) -> str | None:
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in PLACEMENTS]
    if bad or not items:
        raise typer.BadParameter(f"{value!r}: give a comma list of {', '.join(PLACEMENTS)}")
    return ",".join(dict.fromkeys(items))


def _init_list(value: str) -> str:
    try:
        parse_init_list(value)
    except KeyError as exc:
        if "unknown init scheme" in str(exc) and value.strip():
            # may name the scheme of --init-file (alone or in a list), registered after
            # parsing: checked then (SharedOptions.inits, before any run folder exists)
            return value
        raise typer.BadParameter(str(exc.args[0])) from None
    return value


@dataclass(frozen=True)
class SharedOptions:
    """The parsed shared options of one command call."""

    layers: int
    d_model: int
    heads: int
    d_ff: int | None
    vocab: int
    seq_len: int
    batch: int
    sigma: float | str
    embed_std: float | None
    norm: str
    ffn: str
    positions: str
    attention: str
    untie: bool
    bias: bool
    no_attn_scale: bool
    init: str
    pre_norm: bool
    post_norm: bool
    branch: str
    branch_var: float
    stream: bool | None
    tf32: bool
    device: str
    dtype: str
    seed: int
    out: Path | None
    format: list[str]
    quiet: bool
    preset: str | None = None  # its values are already in the fields above
    threads: int | None = None  # torch's CPU threads; None: default_threads()
    norm_position: str | None = None  # comma list of placements; None: --pre-norm/--post-norm or the scheme's
    qk_norm: bool | None = None  # None: what each scheme presumes
    kv_heads: int | None = None
    init_file: Path | None = None
    base_width: int = 256
    base_depth: int = 1

    @property
    def custom_schemes(self) -> tuple:
        """The user's schemes (--init-file), as frozen values the InitConfig carries."""
        return (load_init_file(self.init_file),) if self.init_file is not None else ()

    @property
    def inits(self) -> tuple[str, ...]:
        """The schemes of --init (a comma list, ``all`` or ``both``); with --init-file and
        --init left at its default, the file's scheme alone."""
        custom = self.custom_schemes
        if custom and self.init == "both":
            return (custom[0].name,)
        try:
            return parse_init_list(self.init, custom)
        except KeyError as exc:
            raise typer.BadParameter(str(exc.args[0]), param_hint="'--init'") from None

    @property
    def placements(self) -> tuple[str, ...] | None:
        """The placements the user chose (--norm-position, --pre-norm, --post-norm), or
        None: each scheme then runs in its presumed placement, or pre and post."""
        if self.norm_position:
            return tuple(self.norm_position.split(","))
        chosen = tuple(p for p, on in (("pre", self.pre_norm), ("post", self.post_norm)) if on)
        return chosen or None

    @property
    def norm_positions(self) -> tuple[str, ...]:
        return self.placements or ("pre", "post")

    def model_config(self, **override: Any) -> ModelConfig:
        kw = {
            "n_layers": self.layers, "d_model": self.d_model, "n_heads": self.heads, "d_ff": self.d_ff,
            "vocab_size": self.vocab, "max_seq_len": self.seq_len, "norm": self.norm, "ffn": self.ffn,
            "positions": self.positions, "attention": self.attention, "attn_scale": not self.no_attn_scale,
            "tie_embeddings": not self.untie, "bias": self.bias, "branch": self.branch,
            "branch_var": self.branch_var, "qk_norm": self.qk_norm, "n_kv_heads": self.kv_heads,
        }  # fmt: skip
        if self.preset is not None:
            # fields with no option; the context sizes the learned table (a run may use less)
            preset = get_preset(self.preset)
            kw.update(preset.model)
            kw["max_seq_len"] = max(self.seq_len, preset.context)
        kw.update(override)
        return ModelConfig(**kw)

    def init_config(self) -> InitConfig:
        return InitConfig(sigma=self.sigma, embed_std=self.embed_std, seed=self.seed,
                          base_width=self.base_width, base_depth=self.base_depth,
                          schemes=self.custom_schemes)  # fmt: skip

    def run_config(self, **extra: Any) -> RunConfig:
        if self.preset is not None:
            extra = {"preset": self.preset, **extra}
        return RunConfig(
            batch=self.batch, seq_len=self.seq_len, device=self.device, dtype=self.dtype,
            stream=self.stream, tf32=self.tf32, extra=extra,
        )  # fmt: skip


def _opt(*decls: str, help: str, panel: str, **kw) -> Any:
    kw.setdefault("show_default", True)
    return typer.Option(*decls, help=help, rich_help_panel=panel, **kw)


# name -> (annotation, default). Order is the order in --help.
SHARED: dict[str, tuple[Any, Any]] = {
    "preset": (
        Annotated[
            str | None,
            _opt(
                "--preset",
                help="Shape of a known model: " + ", ".join(PRESETS) + ". Sets the model options it "
                "defines (not batch or --seq-len); options given explicitly override it.",
                panel=MODEL,
                callback=_preset_name,
                show_default=False,
                metavar="NAME",
            ),
        ],
        None,
    ),
    "layers": (
        Annotated[
            int,
            _opt("--layers", "-L", help="Number of layers L (2L residual additions).", panel=MODEL, min=1),
        ],
        12,
    ),
    "d_model": (Annotated[int, _opt("--d-model", help="Residual-stream width d.", panel=MODEL, min=1)], 256),
    "heads": (
        Annotated[int, _opt("--heads", help="Attention heads; must divide --d-model.", panel=MODEL, min=1)],
        4,
    ),
    "d_ff": (
        Annotated[
            int | None,
            _opt(
                "--d-ff",
                help="FFN hidden size (default: 8d/3 rounded up to 64 for swiglu, 4d for gelu).",
                panel=MODEL,
                min=1,
                show_default=False,
            ),
        ],
        None,
    ),
    "vocab": (Annotated[int, _opt("--vocab", help="Vocabulary size V.", panel=MODEL, min=1)], 1024),
    "norm": (
        Annotated[
            NormKind,
            _opt(
                "--norm",
                help="Normalisation layer.",
                panel=MODEL,
            ),
        ],
        "rmsnorm",
    ),
    "ffn": (
        Annotated[
            FfnKind,
            _opt(
                "--ffn",
                help="Feed-forward network: gated SwiGLU or GeGLU (Gemma), classic GELU, or relu^2 "
                "(nanochat). Gemma's and nanochat's schemes build their codebase's own.",
                panel=MODEL,
            ),
        ],
        "swiglu",
    ),
    "positions": (
        Annotated[
            PositionsKind,
            _opt(
                "--positions",
                help="Position information: RoPE, none, or a learned table.",
                panel=MODEL,
            ),
        ],
        "rope",
    ),
    "attention": (
        Annotated[
            AttentionKind,
            _opt(
                "--attention",
                help="Attention mask.",
                panel=MODEL,
            ),
        ],
        "causal",
    ),
    "untie": (
        Annotated[
            bool,
            _opt("--untie", help="Untied output head (default: head reuses the embedding).", panel=MODEL),
        ],
        False,
    ),
    "bias": (
        Annotated[bool, _opt("--bias", help="Zero-initialised biases on every linear layer.", panel=MODEL)],
        False,
    ),
    "no_attn_scale": (
        Annotated[
            bool,
            _opt(
                "--no-attn-scale",
                help="Drop the 1/sqrt(d_h) logit scale (to study why it is there).",
                panel=MODEL,
            ),
        ],
        False,
    ),
    "pre_norm": (
        Annotated[
            bool, _opt("--pre-norm", help="Run pre-norm configurations (neither flag: both).", panel=MODEL)
        ],
        False,
    ),
    "post_norm": (
        Annotated[
            bool, _opt("--post-norm", help="Run post-norm configurations (neither flag: both).", panel=MODEL)
        ],
        False,
    ),
    "norm_position": (
        Annotated[
            str | None,
            _opt(
                "--norm-position",
                help="Norm placements, a comma list of pre (x+F(N(x))), post (N(x+F(x))), sandwich "
                "(x+N(F(N(x)))), reordered (x+N(F(x))), none (default: --pre-norm/--post-norm if given, "
                "else each scheme's own placement, or pre and post).",
                panel=MODEL,
                callback=_placements,
                show_default=False,
                metavar="pre,post,sandwich,reordered,none",
            ),
        ],
        None,
    ),
    "qk_norm": (
        Annotated[
            bool | None,
            _opt(
                "--qk-norm/--no-qk-norm",
                help="RMSNorm on every head's q and k (default: as the scheme presumes; olmo2, nanochat).",
                panel=MODEL,
                show_default=False,
            ),
        ],
        None,
    ),
    "kv_heads": (
        Annotated[
            int | None,
            _opt(
                "--kv-heads",
                help="K/V heads (grouped-query attention); must divide --heads (default: --heads).",
                panel=MODEL,
                min=1,
                show_default=False,
            ),
        ],
        None,
    ),
    "branch": (
        Annotated[
            BranchKind,
            _opt(
                "--branch",
                help="'gaussian' replaces every branch by independent N(0, --branch-var) noise: "
                "the one model in which v_2L = v0 + 2L s^2 holds exactly.",
                panel=MODEL,
            ),
        ],
        "model",
    ),
    "branch_var": (
        Annotated[
            float,
            _opt(
                "--branch-var",
                help="Variance S2 of each Gaussian branch (with --branch gaussian).",
                panel=MODEL,
                callback=_nonneg_float,
            ),
        ],
        1.0,
    ),
    "init": (
        Annotated[
            str,
            _opt(
                "--init",
                help="Init schemes, a comma list of " + ", ".join(scheme_names())
                + " (scaled = gpt2); 'all' for the whole catalogue; 'both' = naive,scaled. "
                "'tinit inits' lists them.",
                panel=INIT,
                callback=_init_list,
                metavar="SCHEME[,SCHEME...]|all|both",
            ),
        ],
        "both",
    ),
    "init_file": (
        Annotated[
            Path | None,
            _opt(
                "--init-file",
                help="A TOML file declaring your own scheme (per-role std formulas); see README. "
                "Runs alone unless --init names it (or 'all').",
                panel=INIT,
                show_default=False,
            ),
        ],
        None,
    ),
    "base_width": (
        Annotated[
            int, _opt("--base-width", help="Base width d0 of mup/completep/depth-mup.", panel=INIT, min=1)
        ],
        256,
    ),
    "base_depth": (
        Annotated[
            int, _opt("--base-depth", help="Base depth L0 of completep/depth-mup.", panel=INIT, min=1)
        ],
        1,
    ),
    "sigma": (
        Annotated[
            str,
            _opt(
                "--sigma",
                help="Base init std: a number, or 'inv-sqrt-d' for 1/sqrt(d).",
                panel=INIT,
                parser=_sigma,
                metavar="FLOAT|inv-sqrt-d",
            ),
        ],
        "0.02",
    ),
    "embed_std": (
        Annotated[
            float | None,
            _opt(
                "--embed-std",
                help="Std of the embedding (and learned positions) (default: --sigma).",
                panel=INIT,
                callback=_positive_float,
                show_default=False,
            ),
        ],
        None,
    ),
    "seed": (
        Annotated[
            int,
            _opt(
                "--seed",
                help="Seed of the weights (drawn per seed, layer, role) and the tokens.",
                panel=INIT,
                min=0,
            ),
        ],
        0,
    ),
    "seq_len": (Annotated[int, _opt("--seq-len", help="Tokens per sequence.", panel=RUN, min=1)], 128),
    "batch": (Annotated[int, _opt("--batch", help="Sequences per batch.", panel=RUN, min=1)], 8),
    "device": (
        Annotated[
            Literal["auto", "cpu", "cuda"],
            _opt(
                "--device",
                help="Where to run: cuda when available (auto), cpu, or cuda.",
                panel=RUN,
            ),
        ],
        "auto",
    ),
    "dtype": (
        Annotated[
            DTypeName,
            _opt(
                "--dtype",
                help="Weights and activations dtype; statistics accumulate in float32 "
                "(float64 for float64 runs).",
                panel=RUN,
            ),
        ],
        "float32",
    ),
    "stream": (
        Annotated[
            bool | None,
            _opt(
                "--stream/--no-stream",
                help="Build each block just before it runs and drop it after, so memory does not grow "
                "with depth (default: a forward without gradients on the CPU always; otherwise when the "
                "built model would not fit).",
                panel=RUN,
                show_default=False,
            ),
        ],
        None,
    ),
    "tf32": (
        Annotated[
            bool,
            _opt(
                "--tf32",
                help="Allow TF32 matmuls on CUDA in float32 runs (faster, 10-bit mantissa; "
                "recorded in config.json as tf32_matmul).",
                panel=RUN,
            ),
        ],
        False,
    ),
    "threads": (
        Annotated[
            int | None,
            _opt(
                "--threads",
                help="CPU threads for torch (default: $OMP_NUM_THREADS when set, else 1: on a shared or "
                "busy CPU more threads wait for each other; recorded in config.json as torch_threads).",
                panel=RUN,
                min=1,
                show_default=False,
            ),
        ],
        None,
    ),
    "out": (
        Annotated[
            Path | None,
            _opt(
                "--out",
                "-o",
                help="Run folder (must be new or empty) (default: results/COMMAND/TIMESTAMP-ID).",
                panel=OUTPUT,
                show_default=False,
            ),
        ],
        None,
    ),
    "format": (
        Annotated[
            str,
            _opt(
                "--format",
                help="Plot formats, a comma list of png, pdf, svg; the PNG is always written.",
                panel=OUTPUT,
                parser=_formats,
                metavar="png,pdf,svg",
            ),
        ],
        "png",
    ),
    "quiet": (
        Annotated[bool, _opt("--quiet", "-q", help="Print only the run folder's path.", panel=OUTPUT)],
        False,
    ),
}

assert set(SHARED) == {f.name for f in fields(SharedOptions)}


def shared_options(*, exclude: tuple[str, ...] = (), defaults: dict[str, Any] | None = None):
    """Decorator: add the shared options (less ``exclude``) to a Typer command, whose
    body receives them as ``opts: SharedOptions``. ``defaults`` overrides defaults
    (and excluded options get them as fixed values)."""
    defaults = defaults or {}

    def wrap(func):
        sig = inspect.signature(func)
        own = [p for p in sig.parameters.values() if p.name != "opts"]
        added = [
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=defaults.get(name, default), annotation=ann
            )
            for name, (ann, default) in SHARED.items()
            if name not in exclude
        ]  # fmt: skip

        @functools.wraps(func)
        def command(**kwargs):
            values = {name: kwargs.pop(name) for name in SHARED if name not in exclude}
            for name in exclude:
                value = defaults.get(name, SHARED[name][1])
                values[name] = _formats(value) if name == "format" else value
            if values.get("preset") is not None:
                apply_preset(values, exclude, get_current_context(silent=True))
            if isinstance(values["sigma"], str):
                values["sigma"] = _sigma(values["sigma"])
            if "threads" not in exclude:  # (a command that excludes it sets threads itself)
                values["threads"] = set_threads(values["threads"])
            opts = SharedOptions(**values)
            if "init" not in exclude:
                opts.inits  # noqa: B018 -- loads --init-file and checks --init before any run folder exists
            return func(opts=opts, **kwargs)

        command.__signature__ = sig.replace(parameters=own + added)
        return command

    return wrap


def apply_preset(
    values: dict[str, Any], exclude: tuple[str, ...] = (), ctx: typer.Context | None = None
) -> None:
    """Put the preset's values into ``values`` for every option it defines that was not
    given on the command line (click's parameter source is DEFAULT; without a context,
    every one) and that the command exposes (an excluded option keeps the command's
    fixed value)."""
    for name, value in get_preset(values["preset"]).options.items():
        if name in exclude:
            continue
        source = ctx.get_parameter_source(name) if ctx is not None else None
        if source in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP):
            values[name] = value


def bad_option(exc: ConfigError) -> typer.BadParameter:
    """A ConfigError as a usage error naming the command-line option."""
    return typer.BadParameter(exc.message, param_hint=f"'{FIELD_OPTIONS.get(exc.field, exc.field)}'")
