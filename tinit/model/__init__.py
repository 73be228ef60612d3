"""The canonical model: configs, layers, the stack, and the init recipes."""

from .config import ConfigError, InitConfig, ModelConfig, RunConfig, swiglu_hidden
from .init import RECIPES, ROLES, STREAM_WRITERS, init_weights_, role_of, role_std
from .transformer import Block, Probe, Transformer, build_block

__all__ = [
    "RECIPES", "ROLES", "STREAM_WRITERS", "Block", "ConfigError", "InitConfig", "ModelConfig",
    "Probe", "RunConfig", "Transformer", "build_block", "init_weights_", "role_of", "role_std",
    "swiglu_hidden",
]  # fmt: skip
