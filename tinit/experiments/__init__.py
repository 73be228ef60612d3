"""Experiments: functions from configs to tidy DataFrames. No printing, no files."""

from .attention_scale import run_attention_scale
from .audit import run_audit
from .check import run_check
from .common import ExperimentResult, IncompleteRun
from .depth_sweep import run_depth_sweep
from .grad_norms import run_grad_norms
from .norms import run_norms
from .params import run_params
from .variance import run_variance

__all__ = ["ExperimentResult", "IncompleteRun", "run_depth_sweep", "run_grad_norms", "run_variance"]
__all__ += ["run_attention_scale", "run_norms"]
__all__ += ["run_check", "run_params"]
__all__ += ["run_audit"]
