"""From a command's option values to the configs it runs, by config field name, and from
a ConfigError back to the option that caused it.

A command's body gets an ``Options`` (built by :func:`tinit.cli.options.command`): the
values of its parameters, named after the fields they set, become ``ModelConfig``,
``InitConfig``, ``RunConfig`` (and any other config dataclass) field by field; what a
command does not take keeps the config's default."""

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import typer

from ..model.catalogue import parse_init_list
from ..model.config import STRUCTURE_FIELDS, ConfigError, InitConfig, ModelConfig, RunConfig
from .clickcompat import current_context, given
from .init_file import load_init_file
from .options import DECLARED, Option

C = TypeVar("C")
#: The model fields an option sets: a preset's value of one reaches the model as that
#: option's default (tinit.cli.options' --preset), never past an option given.
SET_BY_OPTIONS = frozenset(f for o in DECLARED for f in (*o.fields, o.negates) if f)


def default_threads() -> int:
    """torch's CPU threads when --threads is not given: $OMP_NUM_THREADS when set (a
    whole number >= 1), else 1 (see docs/performance.md, Threads, for why)."""
    try:
        n = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        return 1
    return n if n >= 1 else 1


def max_threads() -> int:
    """The most CPU threads a run takes: 4 per CPU (more only wait for each other, and
    tens of thousands crash OpenMP as it starts them)."""
    return 4 * (os.cpu_count() or 1)


def set_threads(n: int | None) -> int:
    """Set torch's intra-op CPU threads (``None``: :func:`default_threads`); returns it.
    More than :func:`max_threads` (given, or from $OMP_NUM_THREADS) is a usage error
    naming --threads."""
    most = max_threads()
    if n is not None and n > most:
        raise typer.BadParameter(f"{n} is more than {most} (4 per CPU, {most // 4} CPUs here): give 1 to "
                                 f"{most}", param_hint="'--threads'")  # fmt: skip
    if n is None and default_threads() > most:
        raise typer.BadParameter(f"$OMP_NUM_THREADS={default_threads()} is more than {most} (4 per CPU, "
                                 f"{most // 4} CPUs here): set it, or give --threads, from 1 to {most}",
                                 param_hint="'--threads'")  # fmt: skip
    import torch

    n = default_threads() if n is None else n
    torch.set_num_threads(n)
    return n


class Options:
    """The option values of one command call, by parameter name (``opts.seq_len``), and
    the configs they make. Building it sets torch's threads (--threads) and checks --init
    and --init-file, so a bad value is refused before any run folder exists."""

    def __init__(self, values: Mapping[str, Any], options: Iterable[Option] = ()) -> None:
        self.values = dict(values)
        #: the declared options this command takes (their fields, negations)
        self.options = tuple(options)
        if "threads" in self.values:
            self.values["threads"] = set_threads(self.values["threads"])
        if "init" in self.values:
            self.inits  # noqa: B018 -- loads --init-file and checks --init
        self.placements  # noqa: B018 -- checks --norm-position against --pre-norm/--post-norm

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(f"this command takes no option {name!r}") from None

    def replace(self, **changes: Any) -> "Options":
        """The same call with some values changed (nothing is set or checked again)."""
        new = object.__new__(Options)
        new.values, new.options = {**self.values, **changes}, self.options
        return new

    @property
    def ctx(self) -> typer.Context | None:
        """The click context of the command running now (None for a library caller)."""
        return current_context()

    def given(self, name: str) -> bool:
        """Whether the option ``name`` (a parameter) was given on the command line, not
        left at its default or a preset's; outside a command, False."""
        ctx = self.ctx
        return ctx is not None and name in ctx.params and given(ctx, name)

    def fields(self, cls: Any) -> dict[str, Any]:
        """The values of ``cls``'s fields (a config dataclass) by field name, a field a flag
        negates (tie_embeddings: --untie) from that flag."""
        negated = {o.negates: o.param for o in self.options if o.negates and o.param in self.values}
        kw = {}
        for f in dataclasses.fields(cls):
            if f.name in self.values:
                kw[f.name] = self.values[f.name]
            elif f.name in negated:
                kw[f.name] = not self.values[negated[f.name]]
        return kw

    def config(self, cls: Callable[..., C], **override: Any) -> C:
        """``cls`` (a config dataclass) from :meth:`fields`, then ``override``."""
        return cls(**{**self.fields(cls), **override})

    def model_config(self, **override: Any) -> ModelConfig:
        """The model: the options' fields, the sequence cache sized by --seq-len, ``override``
        on top; with --preset also its fields that no option sets (RoPE base, norm eps) and
        its context (``ModelConfig.from_preset``)."""
        kw: dict[str, Any] = {"max_seq_len": self.values["seq_len"]} if "seq_len" in self.values else {}
        kw.update(self.fields(ModelConfig), **override, user_set=self.user_set)
        return ModelConfig.from_preset(self.values.get("preset"), leave=SET_BY_OPTIONS, **kw)

    @property
    def user_set(self) -> tuple[str, ...]:
        """The structure fields (:data:`STRUCTURE_FIELDS`) whose option was given on the
        command line (not a default, nor a preset's): they override each init scheme's
        structure (:func:`tinit.model.structure.apply_scheme`); the others take it."""
        fields = [f for o in self.options if o.param in self.values and self.given(o.param)
                  for f in (*o.fields, o.negates) if f in STRUCTURE_FIELDS]  # fmt: skip
        return tuple(dict.fromkeys(fields))

    def init_config(self) -> InitConfig:
        return self.config(InitConfig, schemes=self.custom_schemes)

    def run_config(self, **extra: Any) -> RunConfig:
        """The run, with the command's own settings (``extra``) recorded beside it."""
        if self.values.get("preset") is not None:
            extra = {"preset": self.values["preset"], **extra}
        return self.config(RunConfig, extra=extra)

    @property
    def custom_schemes(self) -> tuple:
        """The user's schemes (--init-file), as frozen values the InitConfig carries."""
        path = self.values.get("init_file")
        return (load_init_file(path),) if path is not None else ()

    @property
    def inits(self) -> tuple[str, ...]:
        """The schemes to run: with --init-file and no --init, the file's scheme alone;
        else those of --init (a comma list, ``all`` or ``both``), and the file's scheme
        after them when --init does not name it (every command alike: a file given is
        never dropped)."""
        custom = self.custom_schemes
        if custom and not self._init_given():
            return tuple(s.name for s in custom)
        try:
            named = parse_init_list(self.values["init"], custom)
        except KeyError as exc:
            raise typer.BadParameter(str(exc.args[0]), param_hint="'--init'") from None
        return named + tuple(s.name for s in custom if s.name not in named)

    def _init_given(self) -> bool:
        """Whether the user gave --init (on the command line, not its default or a
        preset's); outside a command (a library caller), whether it differs from ``both``."""
        ctx = current_context()
        if ctx is not None and "init" in ctx.params:
            return given(ctx, "init")
        return self.values["init"] != "both"

    @property
    def placements(self) -> tuple[str, ...] | None:
        """The placements the user chose (--norm-position, --pre-norm, --post-norm), or
        None: each scheme then runs in its presumed placement, or pre and post."""
        if self.values.get("norm_positions"):
            given = self.values["norm_positions"]
            for flag, name in (("--pre-norm", "pre_norm"), ("--post-norm", "post_norm")):
                if self.values.get(name):
                    raise typer.BadParameter(f"{flag} conflicts with --norm-position {given}: give one",
                                             param_hint="'--norm-position'")  # fmt: skip
            return tuple(given.split(","))
        flags = (("pre", self.values.get("pre_norm")), ("post", self.values.get("post_norm")))
        return tuple(p for p, on in flags if on) or None

    @property
    def norm_positions(self) -> tuple[str, ...]:
        return self.placements or ("pre", "post")


def option_for(field: str, params: Iterable = ()) -> str:
    """The option of the running command (``params``: its click parameters) that decides
    config field ``field``: the one that sets it as it is (named after it, or negating
    it), else one that decides it with others (--d-model 64,128 decides d_ff too), else
    one of the command's own named like it; else the first declared option that decides
    it; else the field's own name."""
    params = list(params)
    taken = {p.name for p in params}
    options = [o for o in DECLARED if o.param in taken]
    ranked = [o.param for o in options if o.negates == field or o.fields[:1] == (field,)]
    ranked += [o.param for o in options if field in o.fields]
    ranked.append(field)
    by_name = {p.name: p for p in params}
    for name in ranked:
        if name in by_name:
            p = by_name[name]
            return next((o for o in p.opts if o.startswith("--")), p.opts[0])
    # not an option of this click command (tinit sweep COMMAND runs COMMAND's under its own)
    for o in DECLARED:
        if field in (o.param, o.negates, *o.fields):
            return o.flag
    return field


class OptionError(typer.BadParameter):
    """A ConfigError as a usage error naming the option. The option is found when the
    message is shown: click attaches the running command's context to a usage error raised
    while it runs, and the option is looked up among that command's parameters."""

    def __init__(self, error: ConfigError) -> None:
        super().__init__(error.message)
        self.field = error.field

    def format_message(self) -> str:
        params = self.ctx.command.params if self.ctx is not None else ()
        self.param_hint = f"'{option_for(self.field, params)}'"
        return super().format_message()


def configs_or_exit(build: Callable[[], C]) -> C:
    """Call ``build`` (which makes configs); a ConfigError becomes a usage error naming the option."""
    try:
        return build()
    except ConfigError as exc:
        raise OptionError(exc) from None
