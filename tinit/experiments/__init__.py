"""Experiments: functions from configs to tidy DataFrames. No printing, no files.

Grouped by what they are for: :mod:`.measure` (at initialization), :mod:`.training`,
:mod:`.audit` (models tinit did not build) and :mod:`.bench` (speed of building blocks);
what they share is at this level: :mod:`.driver` (the loop every experiment runs
under) and :mod:`.result` (what it returns, how it fails), :mod:`.device` (device,
dtype, tokens), :mod:`.memory` (memory limits, the streaming decision), :mod:`.configs`
(the configuration grid), :mod:`.meta` (config.json's settings) and :mod:`.points`
(a grid as a sweep's points).

The names below are imported on first use (PEP 562): importing one experiment's
module (``tinit.experiments.points`` to plan a sweep, say) does not import the others."""

from ..lazy import lazy

#: public name -> the submodule that defines it
_LAZY = {
    "ExperimentResult": ".result", "IncompleteRun": ".result",
    "run_attention_scale": ".measure.attention_scale", "run_audit": ".audit.audit",
    "run_check": ".measure.check", "run_depth_sweep": ".measure.depth_sweep",
    "run_grad_norms": ".measure.grad_norms", "run_norms": ".bench.norms", "run_params": ".measure.params",
    "run_variance": ".measure.variance",
}  # fmt: skip

__all__ = ["ExperimentResult", "IncompleteRun", "run_depth_sweep", "run_grad_norms", "run_variance"]
__all__ += ["run_attention_scale", "run_norms"]
__all__ += ["run_check", "run_params"]
__all__ += ["run_audit"]


__getattr__, __dir__ = lazy(__name__, _LAZY)
