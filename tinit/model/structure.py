"""A scheme is a whole model: from an init scheme's name to the model its upstream runs.

An init scheme (:mod:`tinit.model.schemes`) says how every weight is drawn and which
multipliers the forward applies; its upstream code also fixes part of the model's
*structure*: the norm placement, whether the head is tied to the embedding, the norm
kind and eps, biases, QK-norm and its span (per head or across the full width), its own
FFN, the RoPE base. ``ModelConfig.from_scheme`` (:func:`apply_scheme` over the defaults) is the one
resolution from a scheme's name to that model, as litgpt's ``Config.from_name`` is for a
checkpoint's: the scheme's structure over ModelConfig's defaults, with the fields the
user sets on top. The CLI builds every configuration of a run through it
(:func:`apply_scheme`, called by ``experiments.configs.configure`` and the training
grids), so the library and the CLI build the same model for the same words.

Precedence: a field the user sets (``ModelConfig.user_set``: the CLI puts there the
options given on the command line, ``ModelConfig.from_scheme`` its keyword arguments) wins over
the scheme, even where the upstream never does it (nanochat tied): such an override is
honoured, never refused, and recorded (:func:`scheme_overrides`: config.json's
``structure`` and the terminal's header name it). A scheme's own FFN (nanochat's relu^2,
Gemma's GeGLU, torchscale's GELU) is part of its code and is built whatever ``ffn``
says. ``Transformer(cfg, InitConfig(name))`` whose ``cfg`` contradicts the scheme on a
field the user did not set warns once, naming the field and both values
(:func:`structure_warnings`).

No torch here: the CLI's option parsing imports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from .catalogue import get_scheme
from .checks import ConfigError
from .draws import ffn_of
from .schemes import Scheme

#: The fields of a ModelConfig an init scheme's upstream may fix: :meth:`ModelConfig.from_scheme`
#: takes them from the scheme unless the user set them (``ModelConfig.user_set``).
STRUCTURE_FIELDS = ("norm_position", "tie_embeddings", "norm", "bias", "qk_norm", "qk_norm_span", "ffn",
                    "d_ff", "norm_eps", "rope_base")  # fmt: skip


def user_schemes(schemes: Iterable[Scheme]) -> tuple[Scheme, ...]:
    """The user's schemes as a tuple of Scheme values; anything else (a number, a string,
    one Scheme not in a tuple, a tuple holding a name) a ConfigError naming ``schemes``."""
    how = "give a tuple of Scheme values (tinit.model.scheme_file.load_scheme returns one)"
    if isinstance(schemes, Scheme):
        raise ConfigError("schemes", f"got the Scheme {schemes.name!r} itself: {how}, e.g. schemes=(scheme,)")
    if isinstance(schemes, str | bytes) or not isinstance(schemes, Iterable):
        raise ConfigError("schemes", f"got {schemes!r}: {how}")
    out = tuple(schemes)
    bad = next((s for s in out if not isinstance(s, Scheme)), None)
    if bad is not None:
        raise ConfigError("schemes", f"holds {bad!r}, not a Scheme: {how} (a catalogue scheme is named by "
                          "the first argument, not listed here)")  # fmt: skip
    return out


def _scheme(scheme: str | Scheme, schemes: Iterable[Scheme] = ()) -> Scheme:
    schemes = user_schemes(schemes)
    if isinstance(scheme, Scheme):
        return scheme
    if not isinstance(scheme, str):
        raise ConfigError("scheme", f"got {scheme!r}: give a scheme's name (a str) or a Scheme")
    try:
        return get_scheme(scheme, schemes)
    except KeyError as exc:
        raise ConfigError("scheme", str(exc.args[0])) from None


def scheme_structure(scheme: str | Scheme, cfg, schemes: Iterable[Scheme] = ()) -> dict[str, Any]:
    """The fields of :data:`STRUCTURE_FIELDS` the scheme's upstream fixes, at ``cfg``'s
    shape (its FFN's width may depend on d): field -> value. A field the upstream leaves
    open is absent."""
    s = _scheme(scheme, schemes)
    out: dict[str, Any] = {}
    if s.placement is not None:
        out["norm_position"] = s.placement
    if s.tied is not None:
        out["tie_embeddings"] = s.tied
    if s.norm is not None:
        out["norm"] = s.norm
    if s.bias is not None:
        out["bias"] = s.bias
    if s.qk_norm:
        out["qk_norm"] = True
        out["qk_norm_span"] = s.qk_norm_span
    if s.ffn is not None:
        out["ffn"] = s.ffn
        if s.d_ff is not None:
            out["d_ff"] = ffn_of(cfg, s)[1]
    if s.norm_eps is not None:
        out["norm_eps"] = s.norm_eps
    if s.rope_base is not None:
        out["rope_base"] = s.rope_base
    return out


def apply_scheme(cfg, scheme: str | Scheme, schemes: Iterable[Scheme] = (), **set_now: Any):
    """``cfg`` with the scheme's structure on every structure field the user did not set
    (``cfg.user_set``), after ``set_now`` (fields the caller sets for this configuration,
    e.g. the grid's placement, which count as set by the user)."""
    s = _scheme(scheme, schemes)
    user = tuple(dict.fromkeys((*cfg.user_set, *(f for f in set_now if f in STRUCTURE_FIELDS))))
    base = dataclasses.replace(cfg, **set_now, user_set=user)
    structure = scheme_structure(s, base)
    fixed = {f: v for f, v in structure.items() if f not in user}
    if s.ffn is not None:
        # the scheme's own FFN is part of its code: built whatever --ffn says, at its own
        # width, else at the user's --d-ff, else at the default width of its kind (4d for GELU)
        fixed["ffn"] = s.ffn
        if "d_ff" in structure:
            fixed["d_ff"] = structure["d_ff"]
        elif "d_ff" not in user and base.ffn != s.ffn:
            fixed["d_ff"] = None
    return dataclasses.replace(base, **fixed) if fixed else base


def scheme_overrides(name: str | Scheme, cfg, schemes: Iterable[Scheme] = ()) -> dict[str, tuple[Any, Any]]:
    """The structure fields on which ``cfg`` contradicts the scheme: field ->
    (the scheme's value, the config's). QK-norm left to the scheme (None) agrees."""
    s = _scheme(name, schemes)
    out = {}
    for f, v in scheme_structure(s, cfg).items():
        have = getattr(cfg, f)
        if have is None and f in ("qk_norm", "qk_norm_span"):
            continue  # None: the scheme decides when the blocks are built
        if f == "ffn" or (f == "d_ff" and s.d_ff is not None):
            continue  # the scheme's own FFN is built whatever the config says
        if have != v:
            out[f] = (v, have)
    return out


def structure_record(name: str | Scheme, cfg, schemes: Iterable[Scheme] = ()) -> dict[str, Any]:
    """What config.json records of one configuration's structure: the fields the scheme
    fixed (``from_scheme``: field -> value, as built) and those the user overrode
    (``overridden``: field -> {"scheme": value, "user": value})."""
    s = _scheme(name, schemes)
    fixed = scheme_structure(s, cfg)
    over = scheme_overrides(s, cfg)
    return {
        "from_scheme": {f: v for f, v in fixed.items() if f not in over},
        "overridden": {f: {"scheme": a, "user": b} for f, (a, b) in over.items()},
    }


def describe_structure(scheme: str | Scheme, cfg, schemes: Iterable[Scheme] = ()) -> str:
    """The model ``cfg`` builds under the scheme, in words, for ``tinit inits NAME``:
    placement, tying, norm, biases, QK-norm and its span, FFN, soft-caps, embedding scale
    (each marked "(set)" where the user overrode the scheme)."""
    s = _scheme(scheme, schemes)
    over = scheme_overrides(s, cfg)
    ffn, d_ff = ffn_of(cfg, s)

    def mark(field: str, text: str) -> str:
        return text + (f" (set; its upstream: {over[field][0]!r})" if field in over else "")

    qk = s.qk_norm if cfg.qk_norm is None else cfg.qk_norm
    span = (s.qk_norm_span if cfg.qk_norm_span is None else cfg.qk_norm_span) if qk else None
    parts = [
        mark("norm_position", f"placement {cfg.norm_position}"),
        mark("tie_embeddings", "head tied to the embedding" if cfg.tie_embeddings else "untied head"),
        mark("norm", cfg.norm) + mark("norm_eps", f" eps {cfg.norm_eps:g}"),
        mark("bias", ("biases" + (f" (like weights on {', '.join(s.bias_like)})" if s.bias_like else " 0"))
             if cfg.bias else "no biases"),
        mark("qk_norm", "no QK-norm" if not qk else "QK-norm " + ("per head" if span == "head" else "across "
                                                                   "the full width")),
        f"FFN {ffn} of width {d_ff}",
        mark("rope_base", f"RoPE base {cfg.rope_base:g}") if cfg.positions == "rope" else f"{cfg.positions} "
        "positions",
        "embedding" + (f" x {s.embed_mult}" if s.embed_mult.text != "1" else " x 1")
        + (", RMS-normed" if s.embed_norm else ""),
    ]  # fmt: skip
    caps = [f"{what} {c}" for what, c in (("attention", s.attn_softcap), ("logits", s.logit_softcap)) if c]
    parts.append("soft-caps: " + ", ".join(caps) if caps else "no soft-caps")
    return "; ".join(parts)


def override_lines(records: dict[str, dict[str, Any]]) -> list[str]:
    """One line per scheme whose structure the user overrode, for the terminal's header:
    ``nanochat: tie_embeddings True (nanochat's upstream: False)``."""
    lines = []
    for name, rec in records.items():
        over = rec.get("overridden") or {}
        if over:
            parts = [f"{f} {v['user']!r} (its upstream: {v['scheme']!r})" for f, v in over.items()]
            lines.append(f"{name}: " + "; ".join(parts))
    return lines


#: (scheme, its contradicted fields and values) already warned about in this process.
_WARNED: set[tuple[str, str]] = set()


def structure_warning(scheme: Scheme, cfg) -> str | None:
    """The message, once per process for each scheme and set of contradictions, when
    ``cfg`` contradicts ``scheme``'s structure on fields the user did not set
    (``cfg.user_set``): a model built so is not the one the scheme's upstream runs
    (``ModelConfig.from_scheme`` builds that). None when there is nothing (new) to say."""
    over = {f: v for f, v in scheme_overrides(scheme, cfg).items() if f not in cfg.user_set}
    if not over:
        return None
    what = ", ".join(f"{f}={want!r} (the config: {have!r})" for f, (want, have) in over.items())
    key = (scheme.name, what)
    if key in _WARNED:
        return None
    _WARNED.add(key)
    return (
        f"init scheme {scheme.name!r} runs {what} upstream; "
        f"ModelConfig.from_scheme({scheme.name!r}, ...) builds its model (a field listed in the "
        "config's user_set is kept without this warning)"
    )


__all__ = ["STRUCTURE_FIELDS", "apply_scheme", "describe_structure", "override_lines", "scheme_overrides",
           "scheme_structure", "structure_record", "structure_warning", "user_schemes"]  # fmt: skip
