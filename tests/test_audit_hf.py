"""Guards `tinit audit --hf` on the families it promises (Llama, Qwen2, Mistral, GPT-2,
OLMo 2, Gemma 3, GPT-NeoX), each built offline from a config made here at a tiny
shape: the additions found and checked against the model's own block outputs and
hidden states, the stream-writing matrices found by structure, GPT-2's depth scaling
as transformers 5.x runs it, Llama against gpt2 and naive, and tinit's own weights
loaded into LlamaForCausalLM giving tinit's variance.csv to 1e-6 in float64."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import skip_module_without

skip_module_without("transformers")

from tinit.experiments.audit.audit import Expectation, audit_weights, measure_stream, run_audit  # noqa: E402
from tinit.experiments.audit.loaders import load_hf  # noqa: E402
from tinit.experiments.audit.roles import classify_roles  # noqa: E402
from tinit.experiments.audit.sites import find_sites  # noqa: E402
from tinit.experiments.device import make_tokens  # noqa: E402
from tinit.experiments.measure.variance import add_theory, run_variance  # noqa: E402
from tinit.model.config import InitConfig, ModelConfig, RunConfig  # noqa: E402
from tinit.model.transformer import Transformer  # noqa: E402

V = 64
DECODER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": V, "max_position_embeddings": 32}  # fmt: skip
FAMILIES = {
    "llama": DECODER,
    "qwen2": DECODER,
    "mistral": DECODER,
    "olmo2": DECODER,
    "gemma3_text": {**DECODER, "head_dim": 8},
    "gpt_neox": {k: v for k, v in DECODER.items() if k != "num_key_value_heads"},
    "gpt2": {"n_layer": 12, "n_embd": 32, "n_head": 4, "vocab_size": V, "n_positions": 32},
}
#: the stream writers, by the names each family's modeling file gives them (the truth
#: the structural finder must reproduce without using names)
WRITERS = {
    "gpt2": ("attn.c_proj.weight", "mlp.c_proj.weight"),
    "gpt_neox": ("attention.dense.weight", "mlp.dense_4h_to_h.weight"),
}
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def built():
    """Each family once: (model, sites, trace, roles, tokens)."""
    out = {}
    for family, sets in FAMILIES.items():
        torch.manual_seed(0)
        model = load_hf(family, dict(sets), CPU, torch.float32)
        tokens = make_tokens(ModelConfig(vocab_size=V), RunConfig(batch=2, seq_len=8), 0, CPU)
        sites, tr = find_sites(model, tokens[:1, :4])
        out[family] = (model, sites, tr, classify_roles(model, sites, tr, V), tokens)
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_sites_roles_and_stream(built, family):
    model, sites, _tr, roles, tokens = built[family]
    L = FAMILIES[family].get("num_hidden_layers", FAMILIES[family].get("n_layer"))
    assert sites.family == family and sites.n_layers == L
    assert sites.parallel == (family == "gpt_neox")
    normed = family in ("olmo2", "gemma3_text")
    assert (sites.blocks[0].attn_added is not None) == normed
    by_role = {}
    for r in roles:
        by_role.setdefault(r.role, []).append(r.name)
    attn_w, ffn_w = WRITERS.get(family, ("self_attn.o_proj.weight", "mlp.down_proj.weight"))
    assert sorted(by_role["o"]) == sorted(n for n, _ in model.named_parameters() if n.endswith(attn_w))
    assert sorted(by_role["down"]) == sorted(n for n, _ in model.named_parameters() if n.endswith(ffn_w))
    assert len(by_role["o"]) == len(by_role["down"]) == L
    assert "unknown" not in by_role, by_role.get("unknown")
    raw, rel = measure_stream(model, sites, tokens)
    assert list(raw["k"]) == list(range(2 * L + 1))
    assert max(rel) <= 1e-5  # stream_in + branch reproduces every block's output
    # independent: the model's own hidden states are the block inputs; their pooled
    # variance is the stream at k = 0, 2, ..., 2L-2 (numpy, not the probe)
    with torch.no_grad():
        hs = model(tokens, output_hidden_states=True).hidden_states
    for i in range(L):
        want = hs[i].double().numpy().var()
        assert raw.loc[2 * i, "stream_var"] == pytest.approx(want, rel=1e-5)
    # hidden_states[-1] is after the final norm: the last addition is not it
    assert not math.isclose(raw.iloc[-1]["stream_var"], hs[-1].double().numpy().var(), rel_tol=1e-3)


def test_declared_init_passes_for_every_family(built):
    for family, (model, sites, _tr, roles, _t) in built.items():
        rng = model.config.initializer_range
        exp = Expectation(sites.declared_scheme or "naive", rng, rng, "declared")
        w = audit_weights(model, roles, exp, sites)
        assert set(w["verdict"]) == {"ok"}, (family, w[w["verdict"] != "ok"][["param", "std", "expected"]])


def test_gpt2_is_depth_scaled_and_passes_expect_gpt2(built):
    model, sites, _tr, roles, _t = built["gpt2"]
    # transformers 5.x GPT2PreTrainedModel._init_weights re-draws c_proj at 0.02/sqrt(2 n_layer)
    # (the 4.x bug of issue 47458, scaling skipped, does not reproduce here): measured directly
    target = 0.02 / math.sqrt(24)
    c_proj = torch.cat(
        [p.detach().flatten() for n, p in model.named_parameters() if n.endswith("c_proj.weight")]
    )
    assert c_proj.std().item() == pytest.approx(target, rel=0.02)
    w = audit_weights(model, roles, Expectation("scaled", 0.02, 0.02, "gpt2"), sites)
    assert set(w["verdict"]) == {"ok"}
    naive = audit_weights(model, roles, Expectation("naive", 0.02, 0.02, "naive"), sites)
    assert set(naive.loc[naive["verdict"] != "ok", "role"]) == {"o", "down"}


def test_llama_fails_gpt2_on_exactly_o_and_down_and_passes_naive(built):
    model, sites, _tr, roles, _t = built["llama"]
    w = audit_weights(model, roles, Expectation("scaled", 0.02, 0.02, "gpt2"), sites)
    bad = w[w["verdict"] != "ok"]
    assert sorted(bad["param"]) == sorted(n for n, _ in model.named_parameters()
                                          if n.endswith(("o_proj.weight", "down_proj.weight")))  # fmt: skip
    assert set(bad["verdict"]) == {"off-scheme"}
    assert set(audit_weights(model, roles, Expectation("naive", 0.02, 0.02, "naive"), sites)["verdict"]) == {
        "ok"
    }


def test_scheme_beside_as_built(built):
    model, sites, _tr, roles, tokens = built["llama"]
    res = run_audit(model, sites, roles, tokens, Expectation("naive", 0.02, 0.02, "n"),
                    scheme=Expectation("scaled", 0.02, 0.02, "s"))  # fmt: skip
    assert list(res["summary"]["init"]) == ["as-built", "scaled"]
    assert res.meta["scheme_weights_deviating"] == 0 and res.meta["scheme_kept_as_built"] == []
    s = res["summary"].set_index("init")["branch_var_mean"]
    assert s["scaled"] < s["as-built"]  # o and down at 1/sqrt(2L) of the std: smaller branches
    assert set(res["grad_norms"]["init"]) == {"as-built", "scaled"}
    assert all(np.isfinite(res["stream_grads"]["stream_grad_rms"]))


def _tinit_in_hf_llama():
    """tinit's model in float64 and LlamaForCausalLM configured to its shape (RMSNorm,
    SwiGLU, RoPE with the same rotate-half pairing: tinit rotates (x[:h/2], x[h/2:]) as
    HF's rotate_half does, so q and k need no permutation; tied head, no bias), holding
    the same weights. Returns (tinit's variance.csv rows, the audit's rows with theory)."""
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, vocab_size=V, max_seq_len=16)
    run = RunConfig(batch=2, seq_len=16, device="cpu", dtype="float64")
    ref = run_variance(cfg, InitConfig(), run, inits=("naive",), norm_positions=("pre",))["variance"]
    net = Transformer(cfg, InitConfig(scheme="naive"), dtype=torch.float64)
    hf = load_hf("llama", {"hidden_size": 32, "intermediate_size": cfg.d_ff, "num_hidden_layers": 2,
                           "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": V,
                           "max_position_embeddings": 16, "rms_norm_eps": cfg.norm_eps,
                           "rope_theta": cfg.rope_base,
                           "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
                           "hidden_act": "silu"}, CPU, torch.float64)  # fmt: skip
    names = {"embed.weight": "model.embed_tokens.weight", "final_norm.weight": "model.norm.weight"}
    for i in range(2):
        pre = f"model.layers.{i}."
        names |= {f"blocks.{i}.norm1.weight": pre + "input_layernorm.weight",
                  f"blocks.{i}.norm2.weight": pre + "post_attention_layernorm.weight"}  # fmt: skip
        names |= {f"blocks.{i}.attn.{r}.weight": f"{pre}self_attn.{r}_proj.weight" for r in "qkvo"}
        names |= {f"blocks.{i}.ffn.{r}.weight": f"{pre}mlp.{r}_proj.weight" for r in ("gate", "up", "down")}
    state = {names[k]: v for k, v in net.state_dict().items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    tokens = make_tokens(cfg, run, 0, CPU)
    sites, _ = find_sites(hf, tokens[:1, :4])
    raw, rel = measure_stream(hf, sites, tokens)
    assert max(rel) <= 1e-12
    got = add_theory(raw, "pre")
    np.testing.assert_array_equal(got["k"].to_numpy(), ref["k"].to_numpy())
    return ref, got


VAR_COLS = ["stream_var", "branch_var", "stream_var_rel", "pred_cumulative", "pred_closed"]


def test_tinit_weights_in_hf_llama_give_tinit_variance():
    ref, got = _tinit_in_hf_llama()
    np.testing.assert_allclose(
        got[VAR_COLS].to_numpy(float), ref[VAR_COLS].to_numpy(float), rtol=1e-6, atol=0
    )
    # HF Llama computes RMSNorm and the RoPE tables in float32 even in a float64 model
    # (~1e-7 per element): a correlation near 0 then agrees in absolute, not relative, terms
    np.testing.assert_allclose(got["cross_corr"], ref["cross_corr"], rtol=0, atol=1e-7)


def test_tinit_weights_in_hf_llama_all_columns_once_hf_computes_in_float64(monkeypatch):
    """The remaining cross_corr gap is HF's float32 casts: with RMSNorm and the RoPE
    tables computed in float64 every column, cross_corr too, agrees to 1e-6 relative."""
    from transformers.models.llama import modeling_llama as ml

    def rmsnorm64(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rope64(self, x, position_ids):
        d = 2 * self.inv_freq.numel()
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        emb = (position_ids[..., None].double() * inv).repeat(1, 1, 2)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    monkeypatch.setattr(ml.LlamaRMSNorm, "forward", rmsnorm64)
    monkeypatch.setattr(ml.LlamaRotaryEmbedding, "forward", rope64)
    ref, got = _tinit_in_hf_llama()
    cols = [*VAR_COLS, "cross_corr"]
    np.testing.assert_allclose(got[cols].to_numpy(float), ref[cols].to_numpy(float), rtol=1e-6, atol=0)


def test_readme_gpt2_example_through_the_cli(tmp_path, monkeypatch):
    """The README's worked example config, through the command: exit 0 against gpt2
    (and declared), exit 3 against naive with exactly the 24 c_proj matrices deviating."""
    import json
    import re

    from helpers import figures_built_not_saved, reference_page
    from typer.testing import CliRunner

    from tinit.cli import app

    section = reference_page("audit")
    doc = json.loads(re.search(r"```json\n(.*?)```", section, flags=re.S).group(1))
    config = tmp_path / "gpt2-tiny.json"
    config.write_text(json.dumps(doc))
    runner = CliRunner()
    base = ["audit", "--hf", str(config), "--seq-len", "8", "--batch", "2", "--no-grads"]
    ok = runner.invoke(app, [*base, "--expect", "gpt2", "-o", str(tmp_path / "ok")])
    assert ok.exit_code == 0, ok.output
    assert "PASS: all 148 parameters" in ok.stdout
    # a healthy model's audit flags nothing: every empty cell is a declared not-applicable one
    assert json.loads((tmp_path / "ok" / "config.json").read_text())["non_finite_total"] == 0
    figures_built_not_saved(monkeypatch)  # (the second run: its exit code and weights.csv)
    bad = runner.invoke(app, [*base, "--expect", "naive", "-q", "-o", str(tmp_path / "bad")])
    assert bad.exit_code == 3, bad.output
    w = pd.read_csv(tmp_path / "bad" / "weights.csv")
    deviating = w[w["verdict"] != "ok"]
    assert len(deviating) == 24 and deviating["param"].str.endswith("c_proj.weight").all()
    assert deviating["std"].to_numpy() == pytest.approx(0.02 / math.sqrt(24), rel=0.05)


def test_generic_finder_follows_the_normed_branch_of_olmo2(built, monkeypatch):
    """With OLMo 2 unknown to the family table, the generic finder must find, by data
    flow alone, that the block adds post_attention_layernorm(attn) and
    post_feedforward_layernorm(mlp), and the reconstruction must then match the model."""
    from tinit.experiments.audit import sites as sites_mod

    model, _sites, _tr, _roles, tokens = built["olmo2"]
    monkeypatch.delitem(sites_mod.FAMILIES, "olmo2")
    found, _ = find_sites(model, tokens[:1, :4])
    b = found.blocks[1]
    assert found.family == "generic"
    assert (b.attn, b.ffn) == ("model.layers.1.self_attn", "model.layers.1.mlp")
    assert (b.attn_added, b.ffn_added) == (
        "model.layers.1.post_attention_layernorm",
        "model.layers.1.post_feedforward_layernorm",
    )
    _raw, rel = measure_stream(model, found, tokens)
    assert max(rel) <= 1e-5


def test_wrong_sites_are_reported_by_the_stream_check(built):
    """Naming OLMo 2's raw branch outputs as the additions (forgetting the norm) cannot
    reproduce the block outputs: the check says so instead of passing silently."""
    model, _sites, _tr, roles, tokens = built["olmo2"]
    wrong, _ = find_sites(model, tokens[:1, :4], "model.layers:self_attn:mlp")
    _raw, rel = measure_stream(model, wrong, tokens)
    assert min(rel) > 0.1
    res = run_audit(model, wrong, roles, tokens, Expectation("naive", 0.02, 0.02, "n"), grads=False)
    assert res.meta["stream_check"]["as-built"]["agrees"] is False
