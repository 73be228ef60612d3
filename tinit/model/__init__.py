"""The canonical model: configs, layers, the stack, and the init schemes.

The configs are plain dataclasses and import at once; the torch parts (init schemes,
the stack) are imported on first use, so option parsing and ``--help`` need no torch."""

from ..lazy import lazy
from .config import ConfigError, InitConfig, ModelConfig, RunConfig, swiglu_hidden

_LAZY = {
    **dict.fromkeys(("ROLES", "STREAM_WRITERS", "role_of"), ".roles"),
    **dict.fromkeys(("init_weights_", "role_std"), ".init"),
    **dict.fromkeys(("Block", "Probe", "Transformer", "build_block"), ".transformer"),
}

__all__ = [
    "ROLES", "STREAM_WRITERS", "Block", "ConfigError", "InitConfig", "ModelConfig",
    "Probe", "RunConfig", "Transformer", "build_block", "init_weights_", "role_of", "role_std",
    "swiglu_hidden",
]  # fmt: skip


__getattr__, __dir__ = lazy(__name__, _LAZY)
