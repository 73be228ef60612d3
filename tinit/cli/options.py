"""Every option, declared once, and the commands built from them (docs/design.md §2, §12).

An option that sets a config field is declared on that field (its dataclass metadata,
:mod:`tinit.model.flags`): ``ModelConfig``, ``InitConfig``, ``RunConfig``,
``TrainConfig`` and ``CoordConfig`` each make a **group** of options, the field's name
being the parameter's (``n_layers``; a negating flag has its own, ``untie``). The options
that set no field as they are (``--preset``, ``--init``, ``--pre-norm``, ``--out``,
``--threads``, the training data, the lists of depths and widths) are declared here.

A command is a registry row (:mod:`tinit.cli.registry`: the groups it takes, the options
it leaves out, its own defaults) and a body ``f(opts)`` in ``tinit/cli/<name>.py`` with
that module's ``OPTIONS`` (the options only it takes, as :class:`Param`). :func:`command`
makes the Typer command from them: its parameters (own options first, then the groups'),
and an :class:`~tinit.cli.configs.Options` value for the body.

Adding a shared option that sets a config field: its field, with ``flag(...)`` metadata;
every command taking the field's config then takes it, a ConfigError about it names it,
and a preset may set it."""

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

    @property
    def flag(self) -> str:
        """Its name on the command line (``--layers``; a parameter's name for an argument)."""
        decls = [d for d in (self.info.default, *(self.info.param_decls or ())) if isinstance(d, str)]
        return next((d.split("/")[0] for d in decls if d.startswith("--")), self.param)

    def param_of(self, default: Any) -> inspect.Parameter:
        return inspect.Parameter(self.param, inspect.Parameter.KEYWORD_ONLY, default=default,
                                 annotation=Annotated[self.type, self.info])  # fmt: skip


def option(param: str, type_: Any, *decls: str, help: str, panel: str | None, default: Any = None,
           fields: tuple[str, ...] = (), negates: str | None = None, lists: str | None = None,
           **kw: Any) -> Option:  # fmt: skip
    """An option declared with Typer's keywords (``show_default`` on unless said)."""
    kw.setdefault("show_default", True)
    info = typer.Option(*decls, help=help, rich_help_panel=panel, **kw)
    return Option(param, type_, info, default, fields, negates, lists)


def argument(param: str, type_: Any, *, help: str, default: Any = None, **kw: Any) -> Option:
    return Option(param, type_, typer.Argument(help=help, **kw), default)


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
    return option(
        spec.param or f.name, spec.type or hints[f.name], *spec.decls, help=spec.help, panel=spec.panel,
        default=default, fields=() if spec.negates else (f.name,), negates=f.name if spec.negates else None,
        **kw,
    )  # fmt: skip


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
#: --layers as the depths a command runs one after the other (depth-sweep, train,
#: lr-sweep, coord-check), parsed by experiments.configs.parse_layers
DEPTHS = option(
    "layers", str, "--layers", "-L", panel=MODEL, fields=("n_layers",), lists="n_layers",
    help="Depths to sweep: a comma list (1,2,4,12,80), an arithmetic range start:stop:step (12:96:12, "
    "stop included), a geometric range start:stop:xFACTOR (4:128:x2), or a mix.",
)  # fmt: skip
#: --d-model as the widths a command runs one after the other (lr-sweep, coord-check)
WIDTHS = option("widths", str, "--d-model", panel=MODEL, fields=("d_model", "d_ff"), lists="d_model",
                metavar="48,96,...", help="Widths d: a comma list (64,128,256), each divisible by --heads; "
                "each width takes its default FFN width.")  # fmt: skip
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


def _groups() -> dict[str, tuple[Option, ...]]:
    from ..experiments.training.configs import CoordConfig, TrainConfig

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
        "coord": group(CoordConfig),
    }


#: The option groups a registry row names, by name.
GROUPS = _groups()
#: Every option declared here or on a config (the list options included).
DECLARED: tuple[Option, ...] = (*(o for g in GROUPS.values() for o in g), DEPTHS, WIDTHS, MF_DRAWS)


class Param(NamedTuple):
    """A command's own option: its parameter name, ``Annotated[type, typer.Option(...)]``
    and default, as the command's module declares it in ``OPTIONS``."""

    name: str
    annotation: Any
    default: Any = None


def parameters(row: Any, own: Iterable[Param | Option]) -> tuple[list[inspect.Parameter], tuple[Option, ...]]:
    """A command's parameters, in --help's order (its own options, then the groups' in the
    row's order), and the declared options among them (for Options: names and fields)."""
    params: list[inspect.Parameter] = []
    declared: list[Option] = []
    for o in own:
        if isinstance(o, Option):
            declared.append(o)
            params.append(o.param_of(row.defaults.get(o.param, o.default)))
        else:
            kind = inspect.Parameter.KEYWORD_ONLY
            params.append(inspect.Parameter(o.name, kind, default=o.default, annotation=o.annotation))
    lists = {o.param: o for o in (DEPTHS, WIDTHS)}
    for name in row.groups:
        for o in GROUPS[name]:
            o = lists[row.replace[o.param]] if o.param in row.replace else o
            if o.param in row.skip or (row.only and o.param not in row.only):
                continue
            declared.append(o)
            params.append(o.param_of(row.defaults.get(o.param, o.default)))
    return params, tuple(declared)


def command(row: Any, body: Callable, own: Iterable[Param | Option] = ()) -> Callable:
    """The Typer command of a registry row: the parameters of :func:`parameters`, its help
    the body's docstring; a call makes the Options value and hands it to the body."""
    from .configs import Options

    params, declared = parameters(row, own)

    def run(**values: Any) -> None:
        body(Options(values, declared))

    run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    run.__doc__, run.__name__ = body.__doc__, body.__name__
    return run


def options_of(name: str) -> tuple[Option, ...]:
    """The declared options of the command ``name`` (for an Options value made outside a
    call of it: tests, a library caller replaying a command line)."""
    import importlib

    from .registry import COMMANDS

    row = next(c for c in COMMANDS if c.name == name)
    own = getattr(importlib.import_module(f"tinit.cli.{row.module}"), "OPTIONS", ())
    return parameters(row, own)[1]
