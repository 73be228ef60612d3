"""The configurations of a run: the (init scheme, norm position) grid in its fixed
order, the model and init of one configuration, the check, before anything runs, that
every scheme of the grid is defined at every layer of every depth, and the list of
widths of a width axis (coord-check, lr-sweep)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Sequence
from numbers import Integral

from ..model.catalogue import placements_for
from ..model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from ..model.placements import PLACEMENTS
from ..model.structure import apply_scheme, structure_record

#: Placements a run uses when neither the user nor the scheme chose one.
DEFAULT_PLACEMENTS = ("pre", "post")


def scheme_list(inits: str | Iterable[str], custom: Iterable = ()) -> list[str]:
    """The schemes a library caller gave: a list of names, or one string read as --init
    reads it (``"gpt2"``, ``"naive,gpt2"``, ``"all"``) -- never iterated by character. A
    ConfigError (field ``init``) for an empty list, a name that is no string, or two
    names of one scheme."""
    from ..model.catalogue import ALIASES, parse_init_list

    if isinstance(inits, str):
        try:
            return list(parse_init_list(inits, custom))
        except KeyError as exc:
            raise ConfigError("init", str(exc.args[0])) from None
    out = list(inits)
    if not out:
        raise ConfigError("init", "no init scheme given")
    bad = [v for v in out if not isinstance(v, str)]
    if bad:
        raise ConfigError("init", f"{bad[0]!r} is not a scheme's name")
    seen: dict[str, str] = {}
    for v in out:
        if seen.setdefault(ALIASES.get(v, v), v) != v:
            raise ConfigError("init", f"{seen[ALIASES.get(v, v)]!r} and {v!r} are the same scheme: give one")
    return list(dict.fromkeys(out))


def position_list(norm_positions: str | Iterable[str] | None) -> list[str] | None:
    """The norm placements a library caller gave: None, a list, or a comma string
    (``"pre,post"``); each a name of PLACEMENTS, at least one. ConfigError (field
    ``norm_position``) otherwise."""
    if norm_positions is None:
        return None
    out = norm_positions.split(",") if isinstance(norm_positions, str) else list(norm_positions)
    out = [v.strip() if isinstance(v, str) else v for v in out]
    bad = [v for v in out if v not in PLACEMENTS]
    if bad or not out:
        got = repr(bad[0]) if bad else "none"
        raise ConfigError("norm_position", f"{got} is not a placement; give some of {', '.join(PLACEMENTS)}")
    return list(dict.fromkeys(out))


def grid(
    inits: str | Iterable[str], norm_positions: str | Iterable[str] | None, custom: Iterable = ()
) -> Iterator[tuple[str, str]]:
    """The (init scheme, norm position) configurations of a run, in a fixed order
    (placement, then scheme). ``norm_positions`` None: each scheme in the placement
    it presumes (olmo2 reordered, deepnet post, ...), the others in pre and post.
    ``custom``: the user's schemes the run's InitConfig carries. A string is a comma
    list (:func:`scheme_list`, :func:`position_list`)."""
    custom = tuple(custom)
    inits, norm_positions = scheme_list(inits, custom), position_list(norm_positions)
    if norm_positions is None:
        wanted = {scheme: placements_for(scheme, DEFAULT_PLACEMENTS, custom) for scheme in inits}
        norm_positions = [p for p in PLACEMENTS if any(p in w for w in wanted.values())]
    else:
        wanted = {scheme: tuple(norm_positions) for scheme in inits}
    for norm_position in norm_positions:
        for scheme in inits:
            if norm_position in wanted[scheme]:
                yield scheme, norm_position


def config_name(config: tuple[str, str]) -> str:
    """``naive/pre``: a configuration's name in config.json's timings."""
    return "/".join(config)


def config_label(config: tuple[str, str]) -> str:
    """``naive/pre-norm``: a configuration as a failure message names it."""
    return f"{config[0]}/{config[1]}-norm"


def configure(
    model: ModelConfig, init: InitConfig, run: RunConfig, scheme: str, norm_position: str
) -> tuple[ModelConfig, InitConfig]:
    """The model and init of one configuration: ``model`` with the scheme's structure
    (:func:`tinit.model.structure.apply_scheme`: its tying, norm, biases, QK-norm span,
    FFN, ... on every field the user did not set, ``model.user_set``; the same resolution
    as ``ModelConfig.from_scheme``) in ``norm_position``; the sequence cache fits the run."""
    cfg = dataclasses.replace(model, max_seq_len=max(model.max_seq_len, run.seq_len))
    cfg = apply_scheme(cfg, scheme, init.schemes, norm_position=norm_position)
    return cfg, dataclasses.replace(init, scheme=scheme)


def structure_meta(model: ModelConfig, init: InitConfig, run: RunConfig,
                   configs: Iterable[tuple[str, str]]) -> dict[str, dict]:  # fmt: skip
    """config.json's ``structure``: per configuration (``naive/pre``) what its model took
    from the scheme and what the user overrode (:func:`tinit.model.structure.structure_record`)."""
    out = {}
    for scheme, norm_position in configs:
        cfg, ini = configure(model, init, run, scheme, norm_position)
        out[config_name((scheme, norm_position))] = structure_record(ini.definition, cfg)
    return out


def check_configs(
    model: ModelConfig, init: InitConfig, run: RunConfig, configs: Iterable[tuple[str, str]],
    depths: Iterable[int] | None = None, optimizer: bool = False,
) -> None:  # fmt: skip
    """Before anything runs: every (scheme, norm position) of ``configs`` at every depth
    (default ``model.n_layers``) has rules and multipliers defined at every layer
    (:func:`tinit.model.rulecheck.check_scheme`), and with ``optimizer`` (a run that
    trains with the scheme's optimizer rules) every optimizer rule in range at that shape
    (:func:`tinit.model.rulecheck.check_param_rules`). A ConfigError naming
    ``--init-file`` (a user's scheme) or ``--init`` otherwise, so a bad formula never
    stops a run part-way."""
    from ..model.catalogue import CATALOGUE
    from ..model.formula import FormulaError
    from ..model.rulecheck import check_param_rules, check_scheme

    configs = list(configs)
    for L in depths if depths is not None else [model.n_layers]:
        for scheme, norm_position in configs:
            cfg, ini = configure(dataclasses.replace(model, n_layers=L), init, run, scheme, norm_position)
            try:
                check_scheme(cfg, ini)
                if optimizer:
                    check_param_rules(cfg, ini)
            except FormulaError as exc:
                if ini.definition.name in CATALOGUE:
                    raise ConfigError("scheme", str(exc)) from None
                raise ConfigError("init_file", f"{ini.definition.sources[0]}: {exc}") from None


def parse_widths(spec: str | int | Sequence[int]) -> list[int]:
    """The widths of a width axis (coord-check, lr-sweep), ascending, from a comma list
    (``64,128,256``) or ints; each a whole number >= 1, once. A ConfigError naming ``d_model`` otherwise."""
    items = [spec] if isinstance(spec, int) and not isinstance(spec, bool) else spec
    parts = [p.strip() for p in items.split(",")] if isinstance(items, str) else list(items)
    how = "give a comma list of whole numbers >= 1 (64,128,256,512)"
    out = []
    for p in parts:
        try:
            v = int(p) if not isinstance(p, bool) else -1
        except (TypeError, ValueError):
            v = -1
        if v < 1 or (isinstance(p, float) and p != v):
            raise ConfigError("d_model", f"{p!r} is not a width; {how}")
        out.append(v)
    if not out:
        raise ConfigError("d_model", f"no widths given; {how}")
    repeated = sorted({v for v in out if out.count(v) > 1})
    if repeated:
        raise ConfigError("d_model", f"{', '.join(map(str, repeated))} is given twice; give each width once")
    return sorted(out)


#: The most depths one sweep takes (a range giving more is refused before it is built).
MAX_DEPTHS = 1000


_INT = r"\s*(\d+)\s*"
_RANGE = re.compile(rf"^{_INT}:{_INT}(?::\s*(x?)\s*(\d+)\s*)?$")
LAYERS_HELP = (
    "give a comma list of whole numbers >= 1 (1,2,4,12,80), a range start:stop:step (12:96:12, "
    "stop included), a geometric range start:stop:xFACTOR (4:128:x2), or a mix (1,2,4:64:x2)"
)


def parse_layers(spec: str | int | Sequence[int]) -> list[int]:
    """The depths of a sweep, ascending, from a spec string (or a list of ints).

    Grammar: comma-separated items, each an integer ``L``, an arithmetic range
    ``start:stop[:step]`` (step 1 by default; ``stop`` included when the steps land on
    it), or a geometric range ``start:stop:xF`` (start, start*F, start*F^2, ... <= stop;
    F a whole number >= 2). Every depth must be >= 1 and appear once. Raises
    :class:`ConfigError` (field ``n_layers``, so the CLI names ``--layers``).
    """
    if isinstance(spec, int) and not isinstance(spec, bool):
        spec = [spec]
    if not isinstance(spec, str):
        values = list(spec)
        if not values:
            raise ConfigError("n_layers", f"no depths given; {LAYERS_HELP}")
        for v in values:
            if isinstance(v, bool) or not isinstance(v, Integral) or v < 1:
                raise ConfigError("n_layers", f"{v!r} is not a whole number >= 1; {LAYERS_HELP}")
        spec = ",".join(str(int(v)) for v in values)
    if not spec.strip():
        raise ConfigError("n_layers", f"empty list; {LAYERS_HELP}")
    out: list[int] = []
    for item in spec.split(","):
        if not item.strip():
            raise ConfigError("n_layers", f"{spec!r} has an empty item; {LAYERS_HELP}")
        out.extend(_parse_item(item.strip()))
        if len(out) > MAX_DEPTHS:
            raise ConfigError(
                "n_layers", f"{spec!r} gives more than {MAX_DEPTHS} depths (the most a sweep takes)"
            )
    seen: set[int] = set()
    for v in out:
        if v in seen:
            raise ConfigError("n_layers", f"{spec!r} gives {v} more than once; each depth must appear once")
        seen.add(v)
    return sorted(out)


def _parse_item(item: str) -> list[int]:
    if re.fullmatch(r"\s*-?\d+\s*", item):
        v = int(item)
        if v < 1:
            raise ConfigError("n_layers", f"{item!r}: depths must be >= 1; {LAYERS_HELP}")
        return [v]
    m = _RANGE.match(item)
    if not m:
        raise ConfigError("n_layers", f"{item!r} is not a depth or a range; {LAYERS_HELP}")
    start, stop = int(m.group(1)), int(m.group(2))
    geometric, step = m.group(3) == "x", int(m.group(4)) if m.group(4) else 1
    if start < 1:
        raise ConfigError("n_layers", f"{item!r}: depths must be >= 1; {LAYERS_HELP}")
    if stop < start:
        raise ConfigError("n_layers", f"{item!r}: stop {stop} is below start {start}")
    if geometric:
        if step < 2:
            raise ConfigError("n_layers", f"{item!r}: the factor must be a whole number >= 2")
        values, v = [], start
        while v <= stop:
            values.append(v)
            v *= step
        return values
    if step < 1:
        raise ConfigError("n_layers", f"{item!r}: the step must be a whole number >= 1")
    count = (stop - start) // step + 1
    if count > MAX_DEPTHS:  # refused before the list is built
        raise ConfigError("n_layers", f"{item!r} gives {count} depths; a sweep takes at most {MAX_DEPTHS}")
    return list(range(start, stop + 1, step))
