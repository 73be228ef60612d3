"""tinit: transformer initialization and depth studies.

>>> from tinit import ModelConfig, RunConfig, run_variance
>>> result = run_variance(ModelConfig(n_layers=12), run=RunConfig(batch=4))
>>> result["summary"]

The names below are imported on first use (PEP 562), so ``import tinit`` and the
command line's ``--help`` do not pay for torch, pandas and matplotlib.
"""

from importlib import import_module

#: public name -> the submodule that defines it
_LAZY = {
    **dict.fromkeys(
        (
            "ExperimentResult",
            "IncompleteRun",
            "run_attention_scale",
            "run_check",
            "run_depth_sweep",
            "run_grad_norms",
            "run_norms",
            "run_params",
            "run_variance",
        ),
        ".experiments",
    ),  # fmt: skip
    **dict.fromkeys(("ConfigError", "InitConfig", "ModelConfig", "RunConfig", "Transformer"), ".model"),
}

__all__ = [
    "ConfigError", "ExperimentResult", "IncompleteRun", "InitConfig", "ModelConfig",
    "RunConfig", "Transformer", "__version__", "run_depth_sweep", "run_grad_norms", "run_variance",
]  # fmt: skip
__all__ += ["run_attention_scale", "run_norms"]
__all__ += ["run_check", "run_params"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tinit")
    except PackageNotFoundError:  # running from a source tree
        return "0.0.0+unknown"


def __getattr__(name: str):
    if name == "__version__":
        value = globals()["__version__"] = _version()
        return value
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"__version__"})
