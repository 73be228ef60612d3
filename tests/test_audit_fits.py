"""Guards the memory check of `tinit audit --hf`: the bound on a model's parameters read
from its config (which lets a small audit skip building the model twice) is never
below the parameters transformers actually builds, for every family it covers, at a
tiny shape and at the family's full-size default; a full-size default is still
refused before anything is allocated."""

import pytest
import torch
from helpers import skip_module_without

skip_module_without("transformers")

from tinit.experiments.audit import loaders  # noqa: E402
from tinit.experiments.audit.loaders import BOUNDED_FAMILIES, hf_config, param_bound  # noqa: E402
from tinit.model.config import ConfigError  # noqa: E402

TINY = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 100}  # fmt: skip


def built_params(config) -> int:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())


def config_class(model_type: str):
    """transformers' config class of ``model_type`` (imported when a test runs, not at
    collection)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]


def tiny_config(model_type: str):
    cls = config_class(model_type)
    amap = getattr(cls, "attribute_map", {}) or {}
    kw = {amap.get(k, k): v for k, v in TINY.items()}
    if model_type == "phi3":
        kw["pad_token_id"] = 0  # its default padding id lies outside a 100-token vocabulary
    return cls(**kw)


@pytest.mark.parametrize("model_type", BOUNDED_FAMILIES)
def test_the_bound_is_never_below_the_built_parameters(model_type):
    for config in (tiny_config(model_type), config_class(model_type)()):
        bound, built = param_bound(config), built_params(config)
        assert bound is not None and bound >= built, (model_type, bound, built)


def test_a_full_size_default_is_still_refused(monkeypatch):
    """llama's default (6.7B parameters) with 8 GiB free: the bound does not fit, the
    model is counted on the meta device and refused. A mixture of experts has no bound."""
    from transformers import AutoModelForCausalLM

    from tinit.experiments import memory

    assert param_bound(config_class("mixtral")()) is None
    calls = []
    real = loaders.param_bound
    monkeypatch.setattr(loaders, "param_bound", lambda c: calls.append(c) or real(c))
    monkeypatch.setattr(memory, "available_memory", lambda device: 8 * 2**30)
    config = hf_config("llama", {})
    with pytest.raises(ConfigError, match="B parameters need"):
        loaders._check_fits(AutoModelForCausalLM, config, "llama", torch.device("cpu"), torch.float32)
    assert calls  # the bound was asked first; it did not fit, so the model was counted
