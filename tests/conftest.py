"""Shared fixtures: tiny seeded configurations that run in milliseconds on the CPU."""

import pytest
import torch

from tinit.model.config import InitConfig, ModelConfig, RunConfig


@pytest.fixture(autouse=True)
def _deterministic_threads():
    # small models are faster single-threaded and results do not depend on the thread count
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def tiny_model() -> ModelConfig:
    return ModelConfig(n_layers=3, d_model=32, n_heads=2, vocab_size=64, max_seq_len=16)


@pytest.fixture
def tiny_run() -> RunConfig:
    return RunConfig(batch=2, seq_len=16, device="cpu")


@pytest.fixture
def tiny_init() -> InitConfig:
    return InitConfig(seed=3)
