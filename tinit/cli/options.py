"""Every option more than one command takes, declared once: its names, help text and
--help section, as an ``Annotated`` alias a command puts on a parameter
(``n_layers: Layers = 12``). The parameter is named after the config field the option
sets (``n_layers``, ``n_heads``, ``vocab_size``), so configs are built from a call's
values by field name (:mod:`tinit.cli.configs`); an option that sets no field as it is
(``--untie``, ``--init``) keeps its own name. Defaults are the command's: they stand in
its signature.

Options only one command takes are declared in that command's signature.

Adding an option that sets a config field: the field (its check raises
``ConfigError(field, ...)``), an alias here named after it, and ``field: opt.Alias =
default`` in each command that takes it; the config gets it by name, a ConfigError about
it names the option, and a preset may set it by the field's name."""

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from ..model.catalogue import names as scheme_names
from ..model.catalogue import parse_init_list
from ..model.config import (  # noqa: F401 -- the commands' bounds, as opt.MAX_*
    LR_WHY,
    MAX_BATCHES,
    MAX_LR,
    MAX_SEEDS,
    AttentionKind,
    BranchKind,
    DTypeName,
    FfnKind,
    NormKind,
    PositionsKind,
)
from ..model.placements import PLACEMENTS
from ..model.presets import PRESETS, Preset
from ..results.formats import FORMATS

MODEL, INIT, RUN, OUTPUT = "Model", "Initialisation", "Run", "Output"
TRAIN, DATA = "Training", "Data"

#: Parameter name -> the option's name on the command line, for every option declared here.
OPTION_OF: dict[str, str] = {}
#: Parameter name -> the config fields whose value the option decides: a ConfigError about
#: one of them names the option (configs.option_for).
FIELDS: dict[str, tuple[str, ...]] = {}
#: Config field -> the flag that sets it to its negation (--untie: tie_embeddings = False).
NEGATED: dict[str, str] = {}


def option(
    name: str, type_: Any, *decls: str, help: str, panel: str, fields: tuple[str, ...] = (),
    negates: str | None = None, **kw: Any,
) -> Any:  # fmt: skip
    """The alias of an option: ``type_`` annotated with its Typer declaration. ``name`` is
    the parameter that takes it in every command; it rides along in the alias (Typer reads
    only the Option), so a test holds each command's parameter names to it. ``fields``: the
    config fields it decides besides the one named ``name``; ``negates``: the field a flag
    sets to its negation."""
    OPTION_OF.setdefault(name, decls[0].split("/")[0])
    decided = (*FIELDS.get(name, (name,)), *fields, *([negates] if negates else []))
    FIELDS[name] = tuple(dict.fromkeys(decided))
    if negates:
        NEGATED[negates] = name
    kw.setdefault("show_default", True)
    return Annotated[type_, typer.Option(*decls, help=help, rich_help_panel=panel, **kw), name]


def preset_defaults(preset: Preset, taken: Iterable[str]) -> dict[str, Any]:
    """The values a preset gives the parameters ``taken`` (a command's), by the model field
    each sets: a field's own parameter, or the flag that negates it (tie_embeddings: --untie)."""
    taken = set(taken)
    out = {}
    for field, value in preset.model.items():
        if field in taken:
            out[field] = value
        elif NEGATED.get(field) in taken:
            out[NEGATED[field]] = not value
        elif LISTS.get(field) in taken:  # a command's list of widths: the preset's one
            out[LISTS[field]] = str(value)
    return out


#: Model field -> the parameter of a command that takes a comma list of its values (lr-sweep, coord-check).
LISTS = {"d_model": "widths"}


# --- checks of values that a type alone does not say ---


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


def _formats(value: str) -> list[str]:
    """The plot formats to write: always PNG, then the ones asked for."""
    out = [v.strip().lower() for v in value.split(",") if v.strip()]
    bad = [v for v in out if v not in FORMATS]
    if bad or not out:
        raise typer.BadParameter(f"{value!r}: give a comma list of {', '.join(FORMATS)}")
    return list(dict.fromkeys(["png", *out]))


def positive(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"{value} is not a positive number")
    return value


def learning_rate(value: float) -> float:
    """A learning rate: a positive number up to MAX_LR (tinit.model.config says why)."""
    if not (math.isfinite(value) and 0 < value <= MAX_LR):
        raise typer.BadParameter(f"{value} is not a number > 0 and <= {MAX_LR:g} ({LR_WHY})")
    return value


def _nonneg(value: float) -> float:
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
            # parsing: checked then (configs.Options, before any run folder exists)
            return value
        raise typer.BadParameter(str(exc.args[0])) from None
    return value


def _preset(ctx: typer.Context, value: str | None) -> str | None:
    """--preset NAME: the preset's model fields become the defaults of the options that set
    them in this command (click's default map), so an option given on the command line
    still wins; fields no option sets reach the model in configs.Options.model_config."""
    if value is None:
        return None
    if value not in PRESETS:
        raise typer.BadParameter(f"unknown preset {value!r}; choose from {', '.join(PRESETS)}")
    taken = [p.name for p in ctx.command.params]
    ctx.default_map = {**(ctx.default_map or {}), **preset_defaults(PRESETS[value], taken)}
    return value


# --- Model ---

PresetName = option(
    "preset", str | None, "--preset", panel=MODEL, callback=_preset, is_eager=True, show_default=False,
    metavar="NAME", help="Shape of a known model: " + ", ".join(PRESETS) + ". Sets the model options it "
    "defines (not batch or --seq-len); options given explicitly override it.",
)  # fmt: skip
#: --layers, in the two forms a command takes it: one depth (a model), or the depths a
#: command runs one after the other (depth-sweep, train, lr-sweep), parsed by
#: experiments.measure.depth_sweep.parse_layers.
Layers = option("n_layers", int, "--layers", "-L", help="Number of layers L (2L residual additions).",
                panel=MODEL, min=1)  # fmt: skip
Depths = option(
    "layers", str, "--layers", "-L", panel=MODEL, fields=("n_layers",),
    help="Depths to sweep: a comma list (1,2,4,12,80), an arithmetic range start:stop:step (12:96:12, "
    "stop included), a geometric range start:stop:xFACTOR (4:128:x2), or a mix.",
)  # fmt: skip
DModel = option("d_model", int, "--d-model", help="Residual-stream width d.", panel=MODEL, min=1)
#: --d-model as the widths a command runs one after the other (lr-sweep): a comma list
Widths = option("widths", str, "--d-model", panel=MODEL, fields=("d_model", "d_ff"), metavar="48,96,...",
                help="Widths d: a comma list (64,128,256), each divisible by --heads; each width takes its "
                "default FFN width.")  # fmt: skip
Heads = option("n_heads", int, "--heads", help="Attention heads; must divide --d-model.", panel=MODEL, min=1)
DFF = option("d_ff", int | None, "--d-ff", panel=MODEL, min=1, show_default=False,
             help="FFN hidden size (default: 8d/3 rounded up to 64 for swiglu, 4d for gelu).")  # fmt: skip
Vocab = option("vocab_size", int, "--vocab", help="Vocabulary size V.", panel=MODEL, min=1)
Norm = option("norm", NormKind, "--norm", help="Normalisation layer.", panel=MODEL)
Ffn = option(
    "ffn", FfnKind, "--ffn", panel=MODEL,
    help="Feed-forward network: gated SwiGLU or GeGLU (Gemma), classic GELU, or relu^2 (nanochat). "
    "Gemma's and nanochat's schemes build their codebase's own.",
)  # fmt: skip
Positions = option("positions", PositionsKind, "--positions", panel=MODEL,
                   help="Position information: RoPE, none, or a learned table.")  # fmt: skip
Attention = option("attention", AttentionKind, "--attention", help="Attention mask.", panel=MODEL)
Untie = option("untie", bool, "--untie", panel=MODEL, negates="tie_embeddings",
               help="Untied output head (default: head reuses the embedding).")  # fmt: skip
Bias = option("bias", bool, "--bias", help="Zero-initialised biases on every linear layer.", panel=MODEL)
NoAttnScale = option("no_attn_scale", bool, "--no-attn-scale", panel=MODEL, negates="attn_scale",
                     help="Drop the 1/sqrt(d_h) logit scale (to study why it is there).")  # fmt: skip
PreNorm = option("pre_norm", bool, "--pre-norm", panel=MODEL,
                 help="Run pre-norm configurations (neither flag: both).")  # fmt: skip
PostNorm = option("post_norm", bool, "--post-norm", panel=MODEL,
                  help="Run post-norm configurations (neither flag: both).")  # fmt: skip
NormPositions = option(
    "norm_positions", str | None, "--norm-position", panel=MODEL, fields=("norm_position",),
    callback=_placements, show_default=False,
    metavar="pre,post,sandwich,reordered,none",
    help="Norm placements, a comma list of pre (x+F(N(x))), post (N(x+F(x))), sandwich (x+N(F(N(x)))), "
    "reordered (x+N(F(x))), none (default: --pre-norm/--post-norm if given, else each scheme's own "
    "placement, or pre and post).",
)  # fmt: skip
QKNorm = option(
    "qk_norm", bool | None, "--qk-norm/--no-qk-norm", panel=MODEL, show_default=False,
    help="RMSNorm on every head's q and k (default: as the scheme presumes; olmo2, nanochat).",
)  # fmt: skip
KVHeads = option(
    "n_kv_heads", int | None, "--kv-heads", panel=MODEL, min=1, show_default=False,
    help="K/V heads (grouped-query attention); must divide --heads (default: --heads).",
)  # fmt: skip
Branch = option(
    "branch", BranchKind, "--branch", panel=MODEL,
    help="'gaussian' replaces every branch by independent N(0, --branch-var) noise: the one model in "
    "which v_2L = v0 + 2L s^2 holds exactly.",
)  # fmt: skip
BranchVar = option("branch_var", float, "--branch-var", panel=MODEL, callback=_nonneg,
                   help="Variance S2 of each Gaussian branch (with --branch gaussian).")  # fmt: skip

# --- Initialisation ---

Init = option(
    "init", str, "--init", panel=INIT, fields=("recipe",), callback=_init_list,
    metavar="SCHEME[,SCHEME...]|all|both",
    help="Init schemes, a comma list of " + ", ".join(scheme_names()) + " (scaled = gpt2); 'all' for the "
    "whole catalogue; 'both' = naive,scaled. 'tinit inits' lists them.",
)  # fmt: skip
InitFile = option("init_file", Path | None, "--init-file", panel=INIT, show_default=False,
                  help="A TOML file declaring your own scheme (per-role std formulas); "
                  "see docs/reference/inits.md. Alone without --init, else with its schemes.")  # fmt: skip
BaseWidth = option("base_width", int, "--base-width", help="Base width d0 of mup/completep/depth-mup.",
                   panel=INIT, min=1)  # fmt: skip
BaseDepth = option("base_depth", int, "--base-depth", help="Base depth L0 of completep/depth-mup.",
                   panel=INIT, min=1)  # fmt: skip
Sigma = option("sigma", str, "--sigma", panel=INIT, parser=_sigma, metavar="FLOAT|inv-sqrt-d",
               help="Base init std: a number, or 'inv-sqrt-d' for 1/sqrt(d).")  # fmt: skip
EmbedStd = option("embed_std", float | None, "--embed-std", panel=INIT, callback=positive, show_default=False,
                  help="Std of the embedding (and learned positions) (default: --sigma).")  # fmt: skip
Seed = option("seed", int, "--seed", panel=INIT, min=0,
              help="Seed of the weights (drawn per seed, layer, role) and the tokens.")  # fmt: skip

# --- Run ---

SeqLen = option("seq_len", int, "--seq-len", help="Tokens per sequence.", panel=RUN, min=1,
                fields=("max_seq_len",))  # fmt: skip
Batch = option("batch", int, "--batch", help="Sequences per batch.", panel=RUN, min=1)
Device = option("device", Literal["auto", "cpu", "cuda"], "--device", panel=RUN,
                help="Where to run: cuda when available (auto), cpu, or cuda.")  # fmt: skip
DType = option("dtype", DTypeName, "--dtype", panel=RUN,
               help="Weights and activations dtype; statistics accumulate in float32 (float64 for float64 "
               "runs).")  # fmt: skip
Stream = option(
    "stream", bool | None, "--stream/--no-stream", panel=RUN, show_default=False,
    help="Build each block just before it runs and drop it after, so memory does not grow with depth "
    "(default: a forward without gradients on the CPU always; otherwise when the built model would not fit).",
)  # fmt: skip
TF32 = option("tf32", bool, "--tf32", panel=RUN,
              help="Allow TF32 matmuls on CUDA in float32 runs (faster, 10-bit mantissa; recorded in "
              "config.json as tf32_matmul).")  # fmt: skip
Threads = option(
    "threads", int | None, "--threads", panel=RUN, min=1, show_default=False,
    help="CPU threads for torch (default: $OMP_NUM_THREADS when set, else 1: on a shared or busy CPU more "
    "threads wait for each other; recorded in config.json as torch_threads).",
)  # fmt: skip

# --- Output ---

def _out(value: str | Path) -> Path:
    """--out: a path (an empty one would be the current folder, unasked)."""
    if not str(value).strip():
        raise typer.BadParameter(f"{str(value)!r} is an empty path; give a folder (--out . for this one)")
    return Path(value)


Out = option("out", Path | None, "--out", "-o", panel=OUTPUT, show_default=False, parser=_out, metavar="DIR",
             help="Run folder (must be new or empty) (default: results/COMMAND/TIMESTAMP-ID).")  # fmt: skip
Format = option("format", str, "--format", panel=OUTPUT, parser=_formats, metavar="png,pdf,svg",
                help="Plot formats, a comma list of png, pdf, svg; the PNG is always written.")  # fmt: skip
Quiet = option("quiet", bool, "--quiet", "-q", help="Print only the run folder's path.", panel=OUTPUT)

# --- Training and its data (train, lr-sweep, claims) ---

Data = option(
    "data", str, "--data", panel=DATA, metavar="markov|stdlib|FILE",
    help="markov: a seeded sparse Markov chain with an exact entropy rate (--vocab tokens, --markov-k "
    "successors each); stdlib: the Python standard library's .py files as bytes (vocab 256); or a FILE: "
    "text (bytes), .npy tokens or raw uint16 .bin (nanoGPT), memory-mapped. The last 10% of a file is "
    "held out.",
)  # fmt: skip
MarkovK = option("markov_k", int, "--markov-k", help="Successors per token of the Markov language.",
                 panel=DATA, min=1)  # fmt: skip
EvalBatches = option("eval_batches", int, "--eval-batches", panel=DATA, min=1,
                     help="Held-out batches per evaluation (fixed set).")  # fmt: skip
Steps = option("steps", int, "--steps", help="Optimizer steps per run.", panel=TRAIN, min=1)
WeightDecay = option("weight_decay", float, "--weight-decay", panel=TRAIN, min=0.0,
                     help="AdamW decoupled weight decay (matrices only).")  # fmt: skip
MinLrRatio = option("min_lr_ratio", float, "--min-lr-ratio", panel=TRAIN, min=0.0, max=1.0,
                    help="Cosine decay ends at this fraction of the peak lr.")  # fmt: skip
GradClip = option("grad_clip", float, "--grad-clip", help="Max global gradient norm; 0: no clipping.",
                  panel=TRAIN, min=0.0)  # fmt: skip
EvalEvery = option("eval_every", int, "--eval-every", panel=TRAIN, min=1,
                   help="Held-out loss every N steps (and at 0 and the last step); eval_loss is blank in "
                   "train.csv elsewhere.")  # fmt: skip
DivergeMargin = option("diverge_margin", float, "--diverge-margin", panel=TRAIN, callback=positive,
                       help="A run whose training loss is non-finite or exceeds its first step's loss by "
                       "this many nats is stopped and marked diverged.")  # fmt: skip
ProbePoints = option("probe_points", int, "--probe-points", panel=TRAIN, min=0,
                     help="Variance profiles (at the 2L additions) at this many evenly spaced steps, 0 and "
                     "the last included.")  # fmt: skip
def _on_off(value: str) -> bool:
    if value not in ("on", "off"):
        raise typer.BadParameter(f"{value!r}: give on or off")
    return value == "on"


ParamRules = option(
    "param_rules", str, "--param-rules", panel=TRAIN, parser=_on_off, metavar="on|off",
    help="on: train each scheme with its optimizer rules (mup: hidden-matrix lr / m and weight decay x m; "
    "completep, depth-mup: their depth rules and Adam eps; megatron-mup: hidden lr and eps / m; "
    "config.json records every group's lr); off: the same init with one lr. Schemes without rules (gpt2, "
    "naive, ...) train with one lr either way.",
)  # fmt: skip
Compile = option("compile", bool, "--compile", panel=TRAIN,
                 help="torch.compile the model (for long GPU runs).")  # fmt: skip
NoAutocast = option("no_autocast", bool, "--no-autocast", panel=TRAIN, negates="autocast",
                    help="Train in float32 on CUDA too (default: bf16 autocast on CUDA; the CPU always runs "
                    "float32).")  # fmt: skip
