"""Where and in what precision a run computes: the device and dtype a RunConfig names,
the statistics' dtype, the matmul precision and CPU threads for the duration of a
run, and the seeded tokens every configuration of a run sees."""

from __future__ import annotations

import platform
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ..model.config import ConfigError, ModelConfig, RunConfig
from ..model.init import generator

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


class DeviceError(ConfigError):
    """The requested device cannot be used here (for example cuda without CUDA)."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError("device", f"{name} requested but no CUDA device is available (use cpu or auto)")
    return torch.device(name)


def resolve_dtype(name: str) -> torch.dtype:
    return DTYPES[name]


def stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """Statistics accumulate in float32, or float64 when the run is float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


@contextmanager
def matmul_precision(run: RunConfig):
    """Allow TF32 matmuls for the duration of a run when ``run.tf32`` (CUDA float32
    only); the global setting is restored afterwards."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = run.tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@contextmanager
def cpu_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` torch CPU threads (None: unchanged), restored afterwards."""
    old = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def make_tokens(cfg: ModelConfig, run: RunConfig, seed: int, device: torch.device) -> torch.Tensor:
    """Uniform random token ids (batch, seq_len), determined by the seed alone, so
    every configuration of a run sees the same tokens."""
    gen = generator(seed, -2, "tokens", device)
    return torch.randint(cfg.vocab_size, (run.batch, run.seq_len), generator=gen, device=device)
