"""Experiments: functions from configs to tidy DataFrames. No printing, no files."""

from .common import ExperimentResult, IncompleteRun
from .variance import run_variance

__all__ = ["ExperimentResult", "IncompleteRun", "run_variance"]
