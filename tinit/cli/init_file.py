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
from ..userfile import UserFileError, regular_file


@functools.lru_cache(maxsize=16)
def _load(resolved: str) -> Scheme:
    try:
        return load_scheme(resolved)
    except FormulaError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--init-file'") from None


def load_init_file(path: Path) -> Scheme:
    """Parse and check the scheme of ``path``. Errors are ``typer.BadParameter``
    naming the file and the role. The file is checked before its path is resolved (a
    symlink loop, a FIFO, a device), and again when read (tinit.userfile)."""
    try:
        regular_file(path)
        resolved = Path(path).resolve()
    except UserFileError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--init-file'") from None
    except (OSError, RuntimeError) as exc:  # Path.resolve's own "Symlink loop" (RuntimeError)
        raise typer.BadParameter(f"{path}: cannot resolve it ({exc})", param_hint="'--init-file'") from None
    return _load(str(resolved))
