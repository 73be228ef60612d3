"""The weight roles: one table that the init, the schemes, the scheme files and the
audit all read.

Every parameter has exactly one role (docs/design.md §3): a scheme gives each role a
rule (:mod:`tinit.model.schemes`), :func:`role_of` tells a parameter of tinit's own model
its role from its name, and the audit (``tinit audit``) tells it for a model tinit did
not build from where the parameter sits (:mod:`tinit.experiments.audit.roles`), with
this table's reader patterns only to split an attention branch's inputs for display.

A role's row says:

- ``pattern``: the regular expression its parameters' names match in tinit's model
  (module paths of :mod:`tinit.model.transformer`, with or without the ``blocks.N.``
  prefix); the patterns exclude each other, so a name matches at most one;
- ``draw``: the draw key of its parameters (:func:`tinit.model.init.generator`): the
  role's name (``"role"``: every layer's q draws from (seed, layer, "q"), independent of
  its k) or the parameter's whole name (``"name"``: each norm, bias and gain its own);
- ``shape``: its (out, in) shape in tinit's model (torch's Linear convention) in the
  model's sizes: d, d_ff, kv_d = kv_heads d_h, V the vocabulary, T the positions;
- ``matrix``: drawn from a distribution (an embedding table or a linear weight); the
  others (norm gains, biases, learned branch gains) are constants;
- ``linear``: a linear layer's weight (it may carry a bias); ``writer``: writes into
  the residual stream (what depth scaling touches: W_O, W_down); ``branch``: the branch
  it sits in (attn, ffn; None outside the blocks or anywhere);
- ``reader``: for the audit, the pattern of a branch input's module name that takes
  this role's label (an empty pattern takes every name left: ``qkv``, ``up``);
- ``rule_of``: the role whose rule draws it, where that is another role's (the audit's
  fused attention input ``qkv`` is drawn as ``q``).

The rows are in display order (embedding side, attention, FFN, head, then the constants).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


def _module(name: str) -> str:
    """The parameters (not the bias) of a module called ``name``."""
    return rf"(?:^|\.){name}\.(?!bias$)[^.]+$"


@dataclass(frozen=True)
class Role:
    name: str
    pattern: str | None  # a tinit parameter's name; None: tinit's model has no such parameter
    shape: tuple[str, ...] | None  # (out, in) in tinit's model; None: not one of tinit's
    matrix: bool = True
    linear: bool = False
    writer: bool = False
    branch: str | None = None
    draw: str = "role"  # the draw key: "role" (the role's name) or "name" (the parameter's)
    reader: str | None = None  # the audit: a branch input's module name that takes this label
    rule_of: str | None = None  # the role whose rule draws it (None: its own)

    def draw_key(self, param_name: str) -> str:
        return self.name if self.draw == "role" else param_name


TABLE: tuple[Role, ...] = (
    Role("embed", _module("embed"), ("V", "d")),
    Role("pos", _module("pos"), ("T", "d")),
    Role("q", _module("q"), ("d", "d"), linear=True, branch="attn", reader=r"^(q|query|wq)(_proj)?$"),
    Role("k", _module("k"), ("kv_d", "d"), linear=True, branch="attn", reader=r"^(k|key|wk)(_proj)?$"),
    Role("v", _module("v"), ("kv_d", "d"), linear=True, branch="attn", reader=r"^(v|value|wv)(_proj)?$"),
    Role("qkv", None, None, linear=True, branch="attn", reader="", rule_of="q"),
    Role("o", _module("o"), ("d", "d"), linear=True, writer=True, branch="attn"),
    Role("gate", _module("gate"), ("d_ff", "d"), linear=True, branch="ffn", reader="gate"),
    Role("up", _module("up"), ("d_ff", "d"), linear=True, branch="ffn", reader=""),
    Role("down", _module("down"), ("d", "d_ff"), linear=True, writer=True, branch="ffn"),
    Role("head", _module("head"), ("V", "d"), linear=True),
    # a norm's gains: any module called norm* (norm1, norm2o, norm_q, ...) or final_norm
    Role("norm", r"(?:^|\.)(?:norm[^.]*|final_norm)\.(?!bias$)[^.]+$", ("d",), matrix=False, draw="name"),
    Role("bias", r"(?:^|\.)bias$", ("d",), matrix=False, draw="name"),
    # a block's learned branch gain (ReZero): held by the block itself
    Role("gain", r"^(?:(?:.*\.)?\d+\.)?gain$", (), matrix=False, draw="name"),
)
ROLE: dict[str, Role] = {r.name: r for r in TABLE}

#: The roles of tinit's model, in display order: those a scheme gives a rule.
ROLES = tuple(r.name for r in TABLE if r.pattern is not None)
#: Its roles drawn from a distribution (embedding tables and linear weights).
MATRIX_ROLES = tuple(r for r in ROLES if ROLE[r].matrix)
#: Its linear layers (the roles that may carry a bias).
LINEAR_ROLES = tuple(r for r in ROLES if ROLE[r].linear)
#: The roles that write into the residual stream: the ones depth scaling touches.
STREAM_WRITERS = tuple(r.name for r in TABLE if r.writer)
#: The audit's roles drawn from a distribution (with its fused attention input ``qkv``).
AUDIT_MATRIX_ROLES = tuple(r.name for r in TABLE if r.matrix)

_PATTERNS = tuple((re.compile(r.pattern), r) for r in TABLE if r.pattern is not None)


def role_of(param_name: str) -> tuple[str, str]:
    """(role, draw key) of a parameter of tinit's model, from its name inside a block or
    the model. An unknown name is an error rather than a silently skipped weight (the bug
    class of HF transformers #47458, llama2.c #579)."""
    for pattern, r in _PATTERNS:
        if pattern.search(param_name):
            return r.name, r.draw_key(param_name)
    raise KeyError(f"no init role for parameter {param_name!r}")


def role_shape(role: str, d: int, d_ff: int, d_h: int, kv: int, V: int, T: int) -> tuple[int, ...]:
    """The (out, in) shape of a role's weight in tinit's model (torch's Linear convention)."""
    sizes = {"d": d, "d_ff": d_ff, "kv_d": kv * d_h, "V": V, "T": T}
    return tuple(sizes[s] for s in ROLE[role].shape)


def rule_role(role: str) -> str:
    """The role whose rule draws ``role`` (the audit's ``qkv``: ``q``)."""
    return ROLE[role].rule_of or role


def widths_of(role: str, shape: tuple[int, ...]) -> dict[str, float]:
    """The model's widths d, d_ff and V read off the shape of a ``role`` parameter (a
    model tinit did not build: no config says them); NaN where the shape does not say.
    A reader's d is its input width, a writer's its output width (W_Q's and W_O's inputs
    are heads x d_h, d only when those multiply to d)."""
    r = ROLE[rule_role(role)]
    out = dict.fromkeys(("d", "d_ff", "V"), math.nan)
    if r.shape is None or len(shape) != len(r.shape):
        return out
    axes = list(zip(r.shape, shape, strict=True))
    for symbol, n in axes if r.writer else reversed(axes):
        if symbol in out and math.isnan(out[symbol]):
            out[symbol] = float(n)
    return out


def reader_label(branch: str, module_name: str) -> str:
    """The role label of a linear layer that reads ``branch``'s input (attention's q, k,
    v or a fused qkv; the FFN's gate or up), from its module's name."""
    leaf = module_name.split(".")[-1].lower()
    for r in TABLE:
        if r.branch == branch and r.reader is not None and re.search(r.reader, leaf):
            return r.name
    raise KeyError(f"no reader role in branch {branch!r}")


def writer_role(branch: str) -> str:
    """The role of the linear layer that writes ``branch``'s output into the stream."""
    return next(r.name for r in TABLE if r.branch == branch and r.writer)
