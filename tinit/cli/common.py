"""Helpers more than one command uses (command modules never import each other)."""

from collections.abc import Callable
from contextvars import ContextVar

import typer

from ..model.config import ModelConfig
from .configs import Options

#: Set by ``tinit sweep``: :func:`execute` hands it (command, opts, plan, outputs) and runs nothing.
SWEEP_CAPTURE: ContextVar[Callable | None] = ContextVar("SWEEP_CAPTURE", default=None)
#: True in a process started as ``tinit`` (the console entry point), not in one that
#: calls the CLI in-process (tests): it has run nothing before the command.
CONSOLE: ContextVar[bool] = ContextVar("CONSOLE", default=False)


def describe(opts: Options, model: ModelConfig) -> str:
    """The one-line description of a model run that titles its table and plot."""
    return (
        f"L={model.n_layers}, d={model.d_model}, heads={model.n_heads}, d_ff={model.d_ff}, "
        f"{model.norm}, {model.ffn}, sigma={opts.sigma}, batch {opts.batch} x seq {opts.seq_len}, "
        f"{opts.dtype}, seed {opts.seed}"
        + (f", Gaussian branches S2={model.branch_var:g}" if model.branch == "gaussian" else "")
    )


def positive_int_list(value: str | list[int], option: str) -> list[int]:
    """A comma list of whole numbers >= 1, for ``option``; a BadParameter otherwise."""
    if isinstance(value, list):
        return value
    parts = [p.strip() for p in str(value).split(",")]
    try:
        out = [int(p) for p in parts]
    except ValueError:
        out = []
    if not out or any(v < 1 for v in out):
        raise typer.BadParameter(
            f"{value!r}: give a comma list of whole numbers >= 1", param_hint=f"'{option}'"
        )
    return out
