"""Names a package hands on from its submodules, imported on first use (PEP 562), so
``import tinit`` and the command line's ``--help`` pay for no torch, pandas or
matplotlib they do not use."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy(package: str, table: Mapping[str, str], made: Mapping[str, Callable[[], Any]] | None = None):
    """``__getattr__`` and ``__dir__`` for ``package`` (its ``__name__``): a name of
    ``table`` is imported from its submodule (relative to the package) on first use, a
    name of ``made`` made by its function; either then stays in the package."""
    namespace = sys.modules[package].__dict__
    made = dict(made or {})

    def __getattr__(name: str) -> Any:
        if name in made:
            value = made[name]()
        elif name in table:
            value = getattr(import_module(table[name], package), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table) | set(made))

    return __getattr__, __dir__
