"""Experiments: functions from configs to tidy DataFrames. No printing, no files."""

from .common import ExperimentResult, IncompleteRun
from .grad_norms import run_grad_norms
from .variance import run_variance

__all__ = ["ExperimentResult", "IncompleteRun", "run_grad_norms", "run_variance"]
