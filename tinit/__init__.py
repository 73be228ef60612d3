"""tinit: transformer initialization and depth studies.

>>> from tinit import ModelConfig, RunConfig, run_variance
>>> result = run_variance(ModelConfig(n_layers=12), run=RunConfig(batch=4))
>>> result["summary"]

The names below are imported on first use (PEP 562), so ``import tinit`` and the
command line's ``--help`` do not pay for torch, pandas and matplotlib.
"""

from .lazy import lazy

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


__getattr__, __dir__ = lazy(__name__, _LAZY, {"__version__": _version})
