"""`tinit audit --checkpoint` on Hugging Face folders (issue 32, done-when): tiny Llama
and GPT-2 models built from configs (no download), saved by ``save_pretrained`` in many
shards, audited block by block; the stream variance at every block boundary
(k = 0, 2, ..., 2L - 2) and after the last addition (k = 2L) reproduced by an
independent forward of the model itself with ``output_hidden_states=True`` (for k = 2L:
the same model with its final norm replaced by the identity, so its last hidden state is
the stream before the norm)."""

import copy
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig  # noqa: E402

from tinit.experiments.audit.sources import find_checkpoints  # noqa: E402
from tinit.experiments.audit.tensors import CheckpointError  # noqa: E402
from tinit.experiments.audit.trained import random_tokens, run_checkpoint_audit  # noqa: E402
from tinit.model.config import RunConfig  # noqa: E402

V, L = 100, 4
CONFIGS = {
    "llama": (LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=L, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=V, max_position_embeddings=64), "model.norm"),
    "gpt2": (GPT2Config(n_embd=64, n_layer=L, n_head=4, vocab_size=V, n_positions=64, bos_token_id=0,
                        eos_token_id=0), "transformer.ln_f"),
}  # fmt: skip


def _variances(model, ids) -> list[float]:
    with torch.no_grad():
        hs = model(ids, output_hidden_states=True).hidden_states
    return [float(h.double().var(unbiased=False)) for h in hs]


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_sharded_hf_folder_matches_hidden_states(family, tmp_path):
    config, final_norm = CONFIGS[family]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():  # a "trained" model: weights away from the init, norm gains not 1
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        model.save_pretrained(tmp_path, max_shard_size="40KB")
    shards = list(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > L and (tmp_path / "model.safetensors.index.json").is_file()
    cpu = torch.device("cpu")
    res = run_checkpoint_audit(find_checkpoints(tmp_path), RunConfig(batch=2, seq_len=16), cpu, torch.float32)
    got = res["variance"].sort_values("k")["stream_var"].to_numpy(float)
    assert len(got) == 2 * L + 1
    ids = random_tokens(V, 16, 2, 0, "cpu")
    boundaries = _variances(model, ids)[:L]  # the inputs of blocks 0..L-1: k = 0, 2, ..., 2L - 2
    np.testing.assert_allclose(got[0 : 2 * L : 2], boundaries, rtol=1e-5)
    bare = copy.deepcopy(model)
    parent, _, leaf = final_norm.rpartition(".")
    setattr(bare.get_submodule(parent), leaf, torch.nn.Identity())
    np.testing.assert_allclose(got[2 * L], _variances(bare, ids)[L], rtol=1e-5)
    # spectral norms of the stored matrices, and no init known (rel_change empty)
    drift = res["drift"].set_index("param")
    name = next(n for n in drift.index if ".0." in n and drift.loc[n, "role"] in ("o", "down"))
    w = dict(model.named_parameters())[name].detach().double().numpy()
    assert drift.loc[name, "spectral_norm"] == pytest.approx(np.linalg.norm(w, 2), rel=1e-6)
    assert drift["rel_change"].isna().all() and res.meta["init_source"][tmp_path.name] == "none"


def test_single_file_with_hf_config_and_wrong_config(tmp_path):
    config, _ = CONFIGS["llama"]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config).eval()
        model.save_pretrained(tmp_path / "m")
        config.to_json_file(tmp_path / "config.json")
        wide = copy.deepcopy(config)
        wide.intermediate_size = 256
        wide.to_json_file(tmp_path / "wide.json")
    f = tmp_path / "m" / "model.safetensors"
    small, cpu = RunConfig(batch=1, seq_len=8), torch.device("cpu")
    res = run_checkpoint_audit(find_checkpoints(f, str(tmp_path / "config.json")), small, cpu, torch.float32)
    assert len(res["variance"]) == 2 * L + 1
    with pytest.raises(CheckpointError, match=r"has shape \[128, 64\], the llama model of wide.json needs"):
        run_checkpoint_audit(find_checkpoints(f, str(tmp_path / "wide.json")), small, cpu, torch.float32)
