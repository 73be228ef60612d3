"""A run's metadata for config.json: the resolved settings, what ran, and the
versions and device that produced it."""

from __future__ import annotations

import platform
from typing import Any

import torch

from ..model.config import InitConfig, ModelConfig, RunConfig
from .configs import structure_meta
from .device import device_name


def _tinit_version() -> str:
    from .. import __version__

    return __version__


def run_meta(
    model: ModelConfig, init: InitConfig, run: RunConfig, device: torch.device, **extra
) -> dict[str, Any]:
    """The resolved settings of a run, for config.json, with the versions that produced
    it. With ``configurations`` (the (scheme, norm position) grid that ran), the model's
    ``norm_position`` and the init's ``scheme`` name what ran (a list when more than one
    value ran), not the single value of the base configs; and ``structure``, per
    configuration, the structure fields its model took from the scheme and those the user
    overrode (``{"naive/pre": {"from_scheme": {...}, "overridden": {field: {"scheme": ..,
    "user": ..}}}}``)."""
    model_d, init_d = model.to_dict(), init.to_dict()
    configs = extra.get("configurations") or []
    if configs and all(isinstance(c, tuple | list) and len(c) == 2 for c in configs):
        # per configuration, what its model took from the scheme and what the user overrode
        extra = {**extra, "structure": structure_meta(model, init, run, [tuple(c) for c in configs])}
    if extra.get("configurations"):
        for d, key, i in ((init_d, "scheme", 0), (model_d, "norm_position", 1)):
            ran = list(dict.fromkeys(c[i] for c in extra["configurations"]))
            d[key] = ran[0] if len(ran) == 1 else ran
    return {
        "tinit_version": _tinit_version(),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "model": model_d,
        "init": init_d,
        "sigma_resolved": init.resolved_sigma(model.d_model),
        "embed_std_resolved": init.resolved_embed_std(model.d_model),
        "run": run.to_dict(),
        "device": str(device),
        "device_name": device_name(device),
        "torch_threads": torch.get_num_threads(),
        "tf32_matmul": bool(run.tf32 and device.type == "cuda" and run.dtype == "float32"),
        **extra,
    }
