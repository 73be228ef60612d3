"""GPU-only checks (skipped without CUDA), one file so a device session runs them all
in one call (`benchmarks/device_check.sh`):
  - the overlapped streaming path (weights generated on a side stream) gives the same
    numbers as a fully built model on the same device, in float32 and bfloat16;
  - bf16 runs keep float32 statistics; streamed and built variance runs agree exactly;
  - the layer-wise backward equals autograd on the GPU (float64, where the kernels
    are deterministic enough to compare at 1e-10);
  - TF32 is used only when asked, recorded in the metadata, and switched off again;
  - the cost the run records (peak GPU memory per configuration) is real and bounded;
  - the CLI runs on cuda and says so.
"""

import json

import pytest
import torch
from typer.testing import CliRunner

from tinit.cli import app
from tinit.experiments.measure.grad_norms import run_grad_norms
from tinit.experiments.measure.variance import run_variance
from tinit.model.config import InitConfig, ModelConfig, RunConfig
from tinit.model.transformer import Transformer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("overlap", [True, False])
def test_streamed_equals_built_on_cuda(overlap, dtype):
    cfg = ModelConfig(n_layers=6, d_model=128, n_heads=4, vocab_size=256, max_seq_len=32)
    init = InitConfig(scheme="scaled", seed=3)
    tokens = torch.randint(0, 256, (2, 32), device="cuda")
    built = Transformer(cfg, init, "cuda", dtype, stream=False)
    streamed = Transformer(cfg, init, "cuda", dtype, stream=True, overlap=overlap)
    with torch.no_grad():
        assert torch.equal(built(tokens), streamed(tokens))


def test_weights_drawn_on_cuda_match_the_scheme():
    """The per-(seed, layer, role) draws happen on the device: their spread is the
    scheme's std (sample std of n normals has relative SE 1/sqrt(2n); allow 6 SE)."""
    cfg = ModelConfig(n_layers=2, d_model=256, n_heads=4, vocab_size=256)
    net = Transformer(cfg, InitConfig(scheme="scaled", sigma=0.02), "cuda", stream=False)
    w_q, w_o = net.blocks[0].attn.q.weight, net.blocks[0].attn.o.weight
    assert w_q.is_cuda
    for w, std in ((w_q, 0.02), (w_o, 0.02 / (2 * cfg.n_layers) ** 0.5)):
        tol = 6 / (2 * w.numel()) ** 0.5
        assert abs(float(w.detach().float().std()) / std - 1) < tol


def test_variance_on_cuda_bf16_and_streaming():
    cfg = ModelConfig(n_layers=4, d_model=128, n_heads=4, vocab_size=256)
    a = run_variance(cfg, run=RunConfig(batch=2, seq_len=32, device="cuda", dtype="bfloat16", stream=True))
    b = run_variance(cfg, run=RunConfig(batch=2, seq_len=32, device="cuda", dtype="bfloat16", stream=False))
    assert a["variance"]["stream_var"].equals(b["variance"]["stream_var"])
    assert a["variance"]["stream_var"].dtype == "float64"  # fp32 statistics, reported as float64
    assert a.meta["device"].startswith("cuda")


@pytest.mark.parametrize("position", ["pre", "post"])
def test_layerwise_backward_equals_autograd_on_cuda(position):
    cfg = ModelConfig(n_layers=4, d_model=64, n_heads=4, vocab_size=128, max_seq_len=32)
    runs = [
        run_grad_norms(
            cfg,
            run=RunConfig(batch=2, seq_len=32, device="cuda", dtype="float64", stream=s),
            inits=("naive",),
            norm_positions=(position,),
        )
        for s in (False, True)
    ]
    built, layerwise = (r["grad_norms"]["grad_norm"].to_numpy() for r in runs)
    assert built.shape == layerwise.shape and (built > 0).all()
    assert abs(layerwise / built - 1).max() < 1e-10
    assert runs[1].meta["streamed"] and not runs[0].meta["streamed"]


def test_tf32_only_when_asked_and_restored():
    cfg = ModelConfig(n_layers=2, d_model=64, n_heads=2, vocab_size=64)
    before = torch.backends.cuda.matmul.allow_tf32
    on = run_variance(cfg, run=RunConfig(batch=2, seq_len=16, device="cuda", tf32=True))
    off = run_variance(cfg, run=RunConfig(batch=2, seq_len=16, device="cuda", tf32=False))
    assert on.meta["tf32_matmul"] is True and off.meta["tf32_matmul"] is False
    assert torch.backends.cuda.matmul.allow_tf32 == before


def test_cost_records_gpu_peak_per_configuration():
    cfg = ModelConfig(n_layers=4, d_model=256, n_heads=4, vocab_size=256)
    res = run_variance(cfg, run=RunConfig(batch=2, seq_len=64, device="cuda", stream=True))
    peaks = res.meta["peak_gpu_memory_gib"]
    assert set(peaks) == set(res.meta["seconds"])
    block_gib = 4 * 12 * 256**2 / 2**30  # about 12 d^2 float32 parameters per block
    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    for peak in peaks.values():
        assert block_gib < peak < total_gib


def test_cli_runs_on_cuda(tmp_path):
    out = tmp_path / "run"
    args = ["variance", "--device", "cuda", "--layers", "2", "--d-model", "64", "--heads", "2",
            "--batch", "2", "--seq-len", "16", "--dtype", "bfloat16", "--out", str(out)]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "Measured on cuda" in res.output and "peak GPU memory" in res.output
    meta = json.loads((out / "config.json").read_text())
    assert meta["device"].startswith("cuda") and meta["run"]["dtype"] == "bfloat16"


def test_checkpoint_audit_streams_to_cuda(tmp_path):
    """issue 45: a sharded HF folder and a tinit run audited with --device cuda (each block
    read on the CPU into pinned memory, converted on the GPU) give the CPU's numbers."""
    import numpy as np
    from helpers import skip_module_without

    skip_module_without("transformers")
    import warnings

    from transformers import AutoModelForCausalLM, LlamaConfig

    from tinit.experiments.audit.sources import find_checkpoints
    from tinit.experiments.audit.trained import run_checkpoint_audit

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=100, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path, max_shard_size="40KB")
    run = RunConfig(batch=2, seq_len=16)
    out = {}
    for dev in ("cpu", "cuda"):
        res = run_checkpoint_audit(find_checkpoints(tmp_path), run, torch.device(dev), torch.float32)
        out[dev] = res
    for frame, col in (("variance", "stream_var"), ("drift", "std"), ("drift", "spectral_norm")):
        got, want = (out[d][frame][col].to_numpy(float) for d in ("cuda", "cpu"))
        np.testing.assert_allclose(got, want, rtol=1e-3)
    assert out["cuda"].meta["peak_gpu_memory_gib"]
