"""tinit: transformer initialization and depth studies.

>>> from tinit import ModelConfig, RunConfig, run_variance
>>> result = run_variance(ModelConfig(n_layers=12), run=RunConfig(batch=4))
>>> result["summary"]
"""

from importlib.metadata import PackageNotFoundError, version

from .experiments import (
    ExperimentResult,
    IncompleteRun,
    run_attention_scale,
    run_check,
    run_depth_sweep,
    run_grad_norms,
    run_norms,
    run_params,
    run_variance,
)
from .model import ConfigError, InitConfig, ModelConfig, RunConfig, Transformer

try:
    __version__ = version("tinit")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = [
    "ConfigError", "ExperimentResult", "IncompleteRun", "InitConfig", "ModelConfig",
    "RunConfig", "Transformer", "__version__", "run_depth_sweep", "run_grad_norms", "run_variance",
]  # fmt: skip
__all__ += ["run_attention_scale", "run_norms"]
__all__ += ["run_check", "run_params"]
