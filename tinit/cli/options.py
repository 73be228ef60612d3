"""Every option, declared once (docs/design.md §2, §12).

An option that sets a config field is declared on that field (its dataclass metadata,
:mod:`tinit.model.flags`): ``ModelConfig``, ``InitConfig``, ``RunConfig`` and
``TrainConfig`` each make a **group** of options, the field's name being the parameter's
(``n_layers``; a negating flag has its own, ``untie``). A field's flag may also declare
its **list form** (``--layers 1,2,4`` as ``layers``; ``--d-model 64,128`` as ``widths``;
``--lr``, ``--warmup``), which the commands that run one value after another take
instead. The options that set no field as they are (``--preset``, ``--init``,
``--pre-norm``, ``--out``, ``--threads``, ``--seeds``, the training data, ...) are
declared here.

A command takes the options of the groups its registry row names (:mod:`tinit.cli.registry`),
the shared ones its module lists in ``OPTIONS`` and its own (:class:`Param`, declared
there); the row gives its own defaults and, where an option means something narrower
for it, its own help. No option is declared twice (tests/test_cli_options.py)."""

import copy
import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import typer

from ..model.catalogue import names as scheme_names
from ..model.catalogue import parse_init_list
from ..model.checks import MAX_BATCHES, MAX_MF_DRAWS, MAX_SEEDS  # noqa: F401 -- the commands' bounds, as opt.MAX_*
from ..model.checks import learning_rate as _learning_rate
from ..model.checks import positive as _positive
from ..model.config import InitConfig, ModelConfig, RunConfig
from ..model.flags import DATA, FIELD_DEFAULT, INIT, MODEL, OUTPUT, RUN, TRAIN, Flag, flag_of  # noqa: F401
from ..model.placements import PLACEMENTS
from ..model.presets import PRESETS, Preset
from ..results.formats import FORMATS


def usage_error(check: Callable) -> Callable:
    """A value check raising ValueError, as an option's parser or callback: its message
    becomes the usage error naming the option."""

    @functools.wraps(check)
    def checked(value):
        try:
            return check(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None

    return checked


positive = usage_error(_positive)
learning_rate = usage_error(_learning_rate)


@dataclasses.dataclass(frozen=True)
class Option:
    """One option as every command that takes it takes it: the parameter's name, its type
    and Typer declaration, its default, and the config fields it decides (a ConfigError
    about one names it; ``user_set`` and the presets go by them)."""

    param: str
    type: Any
    info: Any  # typer.Option(...) or typer.Argument(...)
    default: Any = None
    fields: tuple[str, ...] = ()  # the fields it decides (the first: the one it sets as it is)
    negates: str | None = None  # the field it sets to its negation (--untie: tie_embeddings)
    lists: str | None = None  # the field whose values it takes as a comma list (--d-model 64,128)
    many: "Option | None" = None  # its list form (--layers 1,2,4 for --layers 4), when it has one

    @property
    def flag(self) -> str:
        """Its name on the command line (``--layers``; a parameter's name for an argument)."""
        decls = [d for d in (self.info.default, *(self.info.param_decls or ())) if isinstance(d, str)]
        return next((d.split("/")[0] for d in decls if d.startswith("--")), self.param)

    def param_of(self, default: Any, help: str | None = None) -> inspect.Parameter:
        """The parameter Typer reads, at a command's ``default`` (and with its ``help``)."""
        return _parameter(self.param, self.type, self.info, default, help)


def _parameter(name: str, type_: Any, info: Any, default: Any, help: str | None) -> inspect.Parameter:
    if help is not None:
        info = copy.copy(info)
        info.help = help
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[type_, info])  # fmt: skip


def option(param: str, type_: Any, *decls: str, help: str, panel: str | None, default: Any = None,
           fields: tuple[str, ...] = (), negates: str | None = None, lists: str | None = None,
           **kw: Any) -> Option:  # fmt: skip
    """An option declared with Typer's keywords (``show_default`` on unless said)."""
    kw.setdefault("show_default", True)
    info = typer.Option(*decls, help=help, rich_help_panel=panel, **kw)
    return Option(param, type_, info, default, fields, negates, lists)


def from_field(f: dataclasses.Field, hints: dict, spec: Flag) -> Option:
    """The option a config field's ``flag`` metadata declares."""
    kw = dict(spec.kw)
    for key in ("parser", "callback"):
        if key in kw:
            kw[key] = usage_error(kw[key])
    if spec.default is not FIELD_DEFAULT:
        default = spec.default
    else:
        default = (not f.default) if spec.negates else f.default
    one = option(
        spec.param or f.name, spec.type or hints[f.name], *spec.decls, help=spec.help, panel=spec.panel,
        default=default, fields=() if spec.negates else (f.name,), negates=f.name if spec.negates else None,
        **kw,
    )  # fmt: skip
    if spec.many is None:
        return one
    m = spec.many
    many = option(m.param, str, *spec.decls, help=m.help, panel=spec.panel, default=str(default),
                  fields=(f.name, *m.also), lists=f.name, metavar=m.metavar)  # fmt: skip
    return dataclasses.replace(one, many=many)


def group(cls: Any, *extra: Option, order: Iterable[str] = ()) -> tuple[Option, ...]:
    """The options of a config's fields (in field order) and ``extra`` ones; ``order``
    puts the named ones first (the order of --help), the others after them as declared."""
    import typing

    hints = typing.get_type_hints(cls)
    found = [from_field(f, hints, spec) for f in dataclasses.fields(cls) if (spec := flag_of(f))]
    options = {o.param: o for o in (*found, *extra)}
    first = [options.pop(p) for p in order if p in options]
    return (*first, *options.values())


# --- checks of values that a type alone does not say ---


def _formats(value: str) -> list[str]:
    """The plot formats to write: always PNG, then the ones asked for."""
    out = [v.strip().lower() for v in value.split(",") if v.strip()]
    bad = [v for v in out if v not in FORMATS]
    if bad or not out:
        raise typer.BadParameter(f"{value!r}: give a comma list of {', '.join(FORMATS)}")
    return list(dict.fromkeys(["png", *out]))


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


def preset_defaults(preset: Preset, options: Iterable[Option]) -> dict[str, Any]:
    """The values a preset gives a command's ``options``, by the model field each sets: a
    field's own option, the flag that negates it (tie_embeddings: --untie), or a list of
    its values (--d-model 48,96: the preset's one width)."""
    out = {}
    for o in options:
        for f, value in preset.model.items():
            if f in o.fields[:1] and o.lists is None:
                out[o.param] = value
            elif f == o.negates:
                out[o.param] = not value
            elif f == o.lists:
                out[o.param] = str(value)
    return out


def _preset(ctx: typer.Context, value: str | None) -> str | None:
    """--preset NAME: the preset's model fields become the defaults of the options that set
    them in this command (click's default map), so an option given on the command line
    still wins; fields no option sets reach the model in configs.Options.model_config."""
    if value is None:
        return None
    if value not in PRESETS:
        raise typer.BadParameter(f"unknown preset {value!r}; choose from {', '.join(PRESETS)}")
    taken = {p.name for p in ctx.command.params}
    options = [o for o in DECLARED if o.param in taken]
    ctx.default_map = {**(ctx.default_map or {}), **preset_defaults(PRESETS[value], options)}
    return value


def _out(value: str | Path) -> Path:
    """--out: a path (an empty one would be the current folder, unasked)."""
    if not str(value).strip():
        raise typer.BadParameter(f"{str(value)!r} is an empty path; give a folder (--out . for this one)")
    return Path(value)


# --- the options that set no config field as they are ---

PRESET = option(
    "preset", str | None, "--preset", panel=MODEL, callback=_preset, is_eager=True, show_default=False,
    metavar="NAME", help="Shape of a known model: " + ", ".join(PRESETS) + ". Sets the model options it "
    "defines (not batch or --seq-len); options given explicitly override it.",
)  # fmt: skip
PRE_NORM = option("pre_norm", bool, "--pre-norm", panel=MODEL, default=False,
                  help="Run pre-norm configurations (neither flag: both).")  # fmt: skip
POST_NORM = option("post_norm", bool, "--post-norm", panel=MODEL, default=False,
                   help="Run post-norm configurations (neither flag: both).")  # fmt: skip
NORM_POSITIONS = option(
    "norm_positions", str | None, "--norm-position", panel=MODEL, fields=("norm_position",),
    callback=_placements, show_default=False, metavar="pre,post,sandwich,reordered,none",
    help="Norm placements, a comma list of pre (x+F(N(x))), post (N(x+F(x))), sandwich (x+N(F(N(x)))), "
    "reordered (x+N(F(x))), none (default: --pre-norm/--post-norm if given, else each scheme's own "
    "placement, or pre and post).",
)  # fmt: skip
INIT_LIST = option(
    "init", str, "--init", panel=INIT, fields=("scheme",), callback=_init_list, default="both",
    metavar="SCHEME[,SCHEME...]|all|both",
    help="Init schemes, a comma list of " + ", ".join(scheme_names()) + " (scaled = gpt2); 'all' for the "
    "whole catalogue; 'both' = naive,scaled. 'tinit inits' lists them.",
)  # fmt: skip
INIT_FILE = option("init_file", Path | None, "--init-file", panel=INIT, show_default=False,
                   help="A TOML file declaring your own scheme (per-role std formulas); "
                   "see docs/reference/inits.md. Alone without --init, else with its schemes.")  # fmt: skip
THREADS = option(
    "threads", int | None, "--threads", panel=RUN, min=1, show_default=False,
    help="CPU threads for torch (default: $OMP_NUM_THREADS when set, else 1: on a shared or busy CPU more "
    "threads wait for each other; recorded in config.json as torch_threads).",
)  # fmt: skip
OUT = option("out", Path | None, "--out", "-o", panel=OUTPUT, show_default=False, parser=_out, metavar="DIR",
             help="Run folder (must be new or empty) (default: results/COMMAND/TIMESTAMP-ID).")  # fmt: skip
FORMAT = option("format", str, "--format", panel=OUTPUT, parser=_formats, metavar="png,pdf,svg",
                default="png",
                help="Plot formats, a comma list of png, pdf, svg; the PNG is always written.")  # fmt: skip
QUIET = option("quiet", bool, "--quiet", "-q", help="Print only the run folder's path.", panel=OUTPUT,
               default=False)  # fmt: skip
#: the large-width prediction's Monte Carlo (tinit.mf): variance and depth-sweep
MF_DRAWS = option(
    "mf_draws", int, "--mf-draws", panel=RUN, fields=("mf_draws",), default=RunConfig().mf_draws, min=0,
    max=MAX_MF_DRAWS,
    help="Heads drawn per sequence at each attention by the large-width prediction (the mf_* columns; its "
    "Monte Carlo error falls as 1/sqrt(draws)); 0: no prediction, the mf_* columns empty.",
)  # fmt: skip
DATA_SOURCE = option(
    "data", str, "--data", panel=DATA, metavar="markov|stdlib|FILE", default="markov",
    help="markov: a seeded sparse Markov chain with an exact entropy rate (--vocab tokens, --markov-k "
    "successors each); stdlib: the Python standard library's .py files as bytes (vocab 256); or a FILE: "
    "text (bytes), .npy tokens or raw uint16 .bin (nanoGPT), memory-mapped. The last 10% of a file is "
    "held out.",
)  # fmt: skip
MARKOV_K = option("markov_k", int, "--markov-k", help="Successors per token of the Markov language.",
                  panel=DATA, min=1, default=4)  # fmt: skip
EVAL_BATCHES = option("eval_batches", int, "--eval-batches", panel=DATA, min=1, default=4,
                      help="Held-out batches per evaluation (fixed set).")  # fmt: skip


#: --seeds: depth-sweep, the training commands, coord-check (each with its own default)
SEEDS = option(
    "seeds", int, "--seeds", panel=INIT, fields=("seeds",), default=1, min=1, max=MAX_SEEDS,
    help="Seeds per configuration: --seed, --seed+1, ... (each draws the weights, and the tokens or the "
    "batch order, anew; a training run's data stays that of --seed).",
)  # fmt: skip
#: --grads/--no-grads: depth-sweep's gradient ratio, audit's gradient norms
GRADS = option("grads", bool, "--grads/--no-grads", panel=RUN, default=True,
               help="Also measure the gradients (one backward per configuration).")  # fmt: skip
#: --head-dims: the head sizes d_h of attention-scale and of check's item (e)
HEAD_DIMS = option("head_dims", str, "--head-dims", panel=MODEL, default="16,32,64,128,256",
                   metavar="INT,INT,...", help="Head sizes d_h, a comma list.")  # fmt: skip
#: --save-steps: train, lr-sweep, claims
SAVE_STEPS = option(
    "save_steps", str | None, "--save-steps", panel=TRAIN, default=None, metavar="0,100,final",
    show_default=False,
    help="Save each run's weights at these steps (0: the init; final: the last step) as safetensors with a "
    "JSON of the model, scheme and seed, in checkpoints/RUN/ of the run folder (tinit audit --checkpoint "
    "reads them).",
)  # fmt: skip


def _groups() -> dict[str, tuple[Option, ...]]:
    from ..experiments.training.configs import TrainConfig

    model_order = ("n_layers", "d_model", "n_heads", "d_ff", "vocab_size", "norm", "ffn", "positions",
                   "attention", "untie", "bias", "no_attn_scale", "pre_norm", "post_norm", "norm_positions",
                   "qk_norm", "n_kv_heads", "branch", "branch_var")  # fmt: skip
    return {
        "model": group(
            ModelConfig, PRESET, PRE_NORM, POST_NORM, NORM_POSITIONS, order=("preset", *model_order)
        ),
        "init": group(
            InitConfig,
            INIT_LIST,
            INIT_FILE,
            order=("init", "init_file", "base_width", "base_depth", "sigma", "embed_std", "seed"),
        ),
        "run": group(RunConfig, THREADS, order=("seq_len", "batch")),
        "output": (OUT, FORMAT, QUIET),
        "data": (DATA_SOURCE, MARKOV_K, EVAL_BATCHES),
        "train": group(TrainConfig),
    }


#: The option groups a registry row names, by name.
GROUPS = _groups()
#: The options that are in no group: a command's module lists those it takes in its OPTIONS.
UNGROUPED: tuple[Option, ...] = (MF_DRAWS, SEEDS, GRADS, HEAD_DIMS, SAVE_STEPS)
#: Every option declared here or on a config, the list forms included.
DECLARED: tuple[Option, ...] = (
    *(o for g in GROUPS.values() for o in g),
    *(o.many for g in GROUPS.values() for o in g if o.many is not None),
    *UNGROUPED,
)


class Param(NamedTuple):
    """A command's own option (one no other command takes): its parameter name,
    ``Annotated[type, typer.Option(...)]`` (or ``typer.Argument``) and default, as the
    command's module declares it in ``OPTIONS``."""

    name: str
    annotation: Any
    default: Any = None

    def param_of(self, default: Any, help: str | None = None) -> inspect.Parameter:
        type_, info = self.annotation.__origin__, self.annotation.__metadata__[0]
        return _parameter(self.name, type_, info, default, help)

    @property
    def param(self) -> str:
        return self.name
