"""GPU-only checks (skipped without CUDA): the overlapped streaming path (weights
generated on a side stream) gives the same numbers as a fully built model on the
same device, and bf16 runs keep float32 statistics."""

import pytest
import torch

from tinit.experiments.variance import run_variance
from tinit.model.config import InitConfig, ModelConfig, RunConfig
from tinit.model.transformer import Transformer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("overlap", [True, False])
def test_streamed_equals_built_on_cuda(overlap):
    cfg = ModelConfig(n_layers=6, d_model=128, n_heads=4, vocab_size=256, max_seq_len=32)
    init = InitConfig(recipe="scaled", seed=3)
    tokens = torch.randint(0, 256, (2, 32), device="cuda")
    built = Transformer(cfg, init, "cuda", stream=False)
    streamed = Transformer(cfg, init, "cuda", stream=True, overlap=overlap)
    with torch.no_grad():
        assert torch.equal(built(tokens), streamed(tokens))


def test_variance_on_cuda_bf16_and_streaming():
    cfg = ModelConfig(n_layers=4, d_model=128, n_heads=4, vocab_size=256)
    a = run_variance(cfg, run=RunConfig(batch=2, seq_len=32, device="cuda", dtype="bfloat16", stream=True))
    b = run_variance(cfg, run=RunConfig(batch=2, seq_len=32, device="cuda", dtype="bfloat16", stream=False))
    assert a["variance"]["stream_var"].equals(b["variance"]["stream_var"])
    assert a.meta["device"].startswith("cuda")
