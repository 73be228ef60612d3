"""``--init-file FILE``: a user's own init scheme, declared in TOML.

The parsing is the library's (:mod:`tinit.model.scheme_file`, which documents the
format); here its FormulaError becomes a one-line usage error naming the option
(exit 2). The scheme is returned, not registered: the run's InitConfig carries it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import typer

from ..model.formula import FormulaError
from ..model.scheme_file import load_scheme
from ..model.schemes import Scheme


@functools.lru_cache(maxsize=16)
def _load(resolved: str) -> Scheme:
    try:
        return load_scheme(resolved)
    except FormulaError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--init-file'") from None


def load_init_file(path: Path) -> Scheme:
    """Parse and check the scheme of ``path``. Errors are ``typer.BadParameter``
    naming the file and the role."""
    return _load(str(Path(path).resolve()))
