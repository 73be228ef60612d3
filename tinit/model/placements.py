"""Norm placements as values: where a block's norms sit, and what the variance law is.

Each addition of a block computes ``x <- Stream(a x + g Out(F(In(x))))``, where F is
the attention or the FFN branch, a and g the init scheme's multipliers, and each of
``In``, ``Out`` and ``Stream`` is either a norm or the identity. A :class:`Placement`
says which of the three are norms (the same in both sublayers), whether the stack ends
in a final norm before the head, how the figures name it, and its theory: how the
stream's variance v_k evolves from addition to addition, and how a branch's variance
s_k^2 is modelled in the closed form (:mod:`tinit.theory` reads both).

:data:`PLACEMENTS` is the one registry: the configuration's ``norm_position`` is one of
its names (:class:`tinit.model.config.ModelConfig` validates against it), as is a
scheme's presumed placement, and ``--norm-position`` lists its names. A new placement
is one entry here (with its theory: see :class:`Placement`); the block builds its norms,
the theory, the experiments and the figures ask it.

Names are data (CSV cells, configs, the CLI); code that needs to know what a placement
does resolves the name with :func:`get_placement` and asks the value. The module holds
no torch, so option parsing and the figures can import it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Where a norm may sit in one addition: on the branch's input, on its output, on the sum.
SLOTS = ("in", "out", "stream")
#: The per-addition laws: the stream is the running sum, or a norm resets it after each sum.
STREAM_LAWS = ("sum", "reset")
#: How the closed form models a branch's variance s_k^2 (see :class:`Placement`).
BRANCH_LAWS = ("init", "unit", "input")


@dataclass(frozen=True)
class Placement:
    """One norm placement: the norms of each addition, the final norm, the names the
    figures use, and the theory of its residual stream.

    Theory (:mod:`tinit.theory`), with the scheme's multipliers a, g at addition k and
    s_k^2 the variance of the branch F before g (after its own output norm, if any):

    ``stream_law``
        ``"sum"``: the stream is the running sum, v_k = a^2 v_{k-1} + g^2 s_k^2;
        ``pred_cumulative`` is that recursion from v0 over the measured s_k^2 (with the
        scheme's x0 mix and backout). ``"reset"``: a norm follows every sum, so what is
        measured at k is the sum before it, v_k = a^2 v_in + g^2 s_k^2 with v_in the
        (normalised) stream entering; ``pred_cumulative`` takes the measured v_in at each
        k, and nothing accumulates. A placement with a norm on the stream resets.
    ``branch_law``
        s_k^2 in the closed form ``pred_closed``, from an L-independent reference s^2 per
        sublayer and the scheme's depth factor r_k: ``"init"``, ref r_k (the branch reads
        a normalised input: its variance is its init's); ``"unit"``, ref (a norm on the
        branch's output sets its variance, whatever the init); ``"input"``, ref r_k v_in
        (nothing normalises the branch: it scales with the stream entering).

    A placement whose theory is none of these needs its law in :mod:`tinit.theory`
    (``pred_cumulative_scheme``, ``reference_branch_vars``, ``pred_closed_scheme``)."""

    name: str  # the word of --norm-position, the config and the CSVs' norm_position
    formula: str  # one addition, in words: "x + F(N(x))"
    source: str  # who runs it
    norm_in: bool  # a norm on the branch's input: F(N(x))
    norm_out: bool  # a norm on the branch's output: N(F(.))
    norm_stream: bool  # a norm on the sum: x <- N(a x + g F) (the stream is normalised)
    final_norm: bool  # a norm between the last addition and the head
    stream_law: str  # "sum" or "reset" (above)
    branch_law: str  # "init", "unit" or "input" (above)
    label: str  # in a configuration's label: "naive init, pre-norm"
    heading: str  # a depth-sweep panel's title: "Pre-norm"
    title: str  # a variance panel's title
    short_title: str  # a variance panel's title, two or three panels a row
    shade: float  # the scheme's colour times this (< 1 darker, > 1 lighter; pre-norm: 1)
    marker: str | None = None  # its own marker in figures; None: the scheme's

    def __post_init__(self) -> None:
        for field, allowed in (("stream_law", STREAM_LAWS), ("branch_law", BRANCH_LAWS)):
            value = getattr(self, field)
            if value not in allowed:
                raise ValueError(f"placement {self.name}: {field} {value!r} is not one of {allowed}")
        # the probe reports the sum and, after a stream norm, the normalised stream: the
        # law that reads the normalised stream entering is the one for a normalised stream
        if self.norm_stream != (self.stream_law == "reset"):
            raise ValueError(f"placement {self.name}: a norm on the stream goes with stream_law 'reset'")

    @property
    def slots(self) -> tuple[str, ...]:
        """The slots of :data:`SLOTS` that hold a norm, in that order."""
        held = (self.norm_in, self.norm_out, self.norm_stream)
        return tuple(slot for slot, on in zip(SLOTS, held, strict=True) if on)

    @property
    def block_norms(self) -> int:
        """Norms per block (both sublayers)."""
        return 2 * len(self.slots)

    @property
    def resets(self) -> bool:
        """A norm follows every sum: the stream is normalised, the probe's ``stream_out``
        is the sum before the norm, and the backward identity path passes the norms."""
        return self.stream_law == "reset"

    @property
    def tag(self) -> str:
        """The label as one word, for notes: "pre-norm", "no-norm"."""
        return self.label.replace(" ", "-")


_REGISTRY = (
    Placement(
        "pre", "x + F(N(x))", "GPT-2 onwards",
        norm_in=True, norm_out=False, norm_stream=False, final_norm=True,
        stream_law="sum", branch_law="init",
        label="pre-norm", heading="Pre-norm", title="Pre-norm: residual-stream variance",
        short_title="Pre-norm", shade=1.0,
    ),
    Placement(
        "post", "N(x + F(x))", "Vaswani et al. 2017; DeepNet",
        norm_in=False, norm_out=False, norm_stream=True, final_norm=False,
        stream_law="reset", branch_law="init",
        label="post-norm", heading="Post-norm", title="Post-norm: variance of each sum",
        short_title="Post-norm (each sum)", shade=0.6,
    ),
    Placement(
        "sandwich", "x + N_out(F(N_in(x)))", "Gemma 2, Peri-LN",
        norm_in=True, norm_out=True, norm_stream=False, final_norm=True,
        stream_law="sum", branch_law="unit",
        label="sandwich-norm", heading="Sandwich norm", title="Sandwich norm: residual-stream variance",
        short_title="Sandwich norm", shade=1.3, marker="D",
    ),
    Placement(
        "reordered", "x + N(F(x))", "OLMo 2",
        norm_in=False, norm_out=True, norm_stream=False, final_norm=True,
        stream_law="sum", branch_law="unit",
        label="reordered-norm", heading="Reordered norm",
        title="Reordered norm (x + Norm(F(x))): stream variance", short_title="Reordered norm",
        shade=0.8, marker="P",
    ),
    Placement(
        "none", "x + F(x)", "ReZero, T-Fixup",
        norm_in=False, norm_out=False, norm_stream=False, final_norm=False,
        stream_law="sum", branch_law="input",
        label="no norm", heading="No norm", title="No norm: residual-stream variance",
        short_title="No norm", shade=0.45, marker="X",
    ),
)  # fmt: skip

#: The registry, name -> placement, in the order of the CLI's list and the figures' panels.
PLACEMENTS: dict[str, Placement] = {p.name: p for p in _REGISTRY}


def get_placement(name: str | Placement) -> Placement:
    """The placement ``name`` (a placement passes through); KeyError naming the choices."""
    if isinstance(name, Placement):
        return name
    try:
        return PLACEMENTS[name]
    except (KeyError, TypeError):
        raise KeyError(f"unknown norm placement {name!r}; choose from {', '.join(PLACEMENTS)}") from None


def normed_stream_names() -> tuple[str, ...]:
    """The placements whose stream a norm resets after every sum (post-norm): only they
    have a normalised stream to report and a norm on the backward identity path."""
    return tuple(p.name for p in PLACEMENTS.values() if p.resets)
