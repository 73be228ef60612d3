"""Guards the placements as values (tinit/model/placements.py): one registry that the
config, the catalogue and the CLI read; a block whose norms sit where each placement's
textbook formula puts them, under the names the state dict, the init's draw keys and
grad-norms' tensor column have always had; the audit of tinit's own model in every
placement; and that a new placement is one registry entry: a placement the code has
never seen (a norm before the branch and one after the sum) is accepted by the config
and the CLI, built, measured, predicted, counted and drawn."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import figures_built_not_saved
from typer.testing import CliRunner

from tinit import theory
from tinit.cli import app
from tinit.experiments.audit.audit import Expectation, audit_weights, measure_stream
from tinit.experiments.audit.roles import classify_roles
from tinit.experiments.audit.sites import find_sites
from tinit.experiments.device import make_tokens
from tinit.experiments.measure.grad_norms import run_grad_norms
from tinit.experiments.measure.variance import run_variance
from tinit.model.catalogue import CATALOGUE, get_scheme
from tinit.model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from tinit.model.params import count_params
from tinit.model.placements import PLACEMENTS, Placement, get_placement
from tinit.model.transformer import Block, Transformer
from tinit.results.plots import plot_variance

runner = CliRunner()
TINY = ModelConfig(n_layers=3, d_model=32, n_heads=2, vocab_size=64, max_seq_len=16)
RUN = RunConfig(batch=2, seq_len=16, device="cpu")
#: The norms each placement had before placements were values (Block._add), by name.
NORMS = {"pre": {"norm1", "norm2"}, "post": {"norm1", "norm2"}, "reordered": {"norm1", "norm2"},
         "sandwich": {"norm1", "norm2", "norm1o", "norm2o"}, "none": set()}  # fmt: skip


def test_the_registry_is_the_list_every_reader_uses():
    """The five names, in the CLI's order; the config accepts exactly them (and resolves
    the value); every catalogue scheme presumes one of them or none."""
    assert list(PLACEMENTS) == ["pre", "post", "sandwich", "reordered", "none"]
    for name, value in PLACEMENTS.items():
        assert ModelConfig(norm_position=name).placement is value is get_placement(name)
    with pytest.raises(ConfigError) as err:
        ModelConfig(norm_position="middle")
    assert err.value.field == "norm_position"
    assert str(err.value) == "'middle' is not one of 'pre', 'post', 'sandwich', 'reordered', 'none'"
    with pytest.raises(KeyError, match="choose from pre, post, sandwich, reordered, none"):
        get_placement("middle")
    assert {get_scheme(s).placement for s in CATALOGUE} - {None} <= set(PLACEMENTS)


def _textbook(name: str, block: Block, x: torch.Tensor, rope) -> torch.Tensor:
    """The block by each placement's formula (a = g = 1), written from the papers, not
    from the registry: pre x + F(N(x)); post N(x + F(x)); sandwich x + N_o(F(N(x)));
    reordered x + N(F(x)); none x + F(x)."""
    for sub, n in (("attn", "1"), ("ffn", "2")):
        branch, norm = getattr(block, sub), getattr(block, f"norm{n}", None)

        def f(h, rope, branch=branch, sub=sub):  # attention reads the positions, the FFN does not
            return branch(h, rope) if sub == "attn" else branch(h)

        if name == "pre":
            x = x + f(norm(x), rope)
        elif name == "post":
            x = norm(x + f(x, rope))
        elif name == "sandwich":
            x = x + getattr(block, f"norm{n}o")(f(norm(x), rope))
        elif name == "reordered":
            x = x + norm(f(x, rope))
        else:
            x = x + f(x, rope)
    return x


@pytest.mark.parametrize("name", list(PLACEMENTS))
def test_block_puts_its_norms_where_the_formula_does(name):
    cfg = dataclasses.replace(TINY, norm_position=name, d_ff=48)
    net = Transformer(cfg, InitConfig(seed=5, sigma=0.2), dtype=torch.float64)
    block = net.blocks[1]
    norms = {key.split(".")[0] for key in block.state_dict() if key.startswith("norm")}
    assert norms == NORMS[name]
    assert sum(isinstance(m, torch.nn.Identity) for m in block.modules()) == 0  # slots are not submodules
    x = torch.randn(2, 16, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(block(x, net.rope), _textbook(name, block, x, net.rope), rtol=0, atol=0)
    assert (net.final_norm is not None) == (name in ("pre", "sandwich", "reordered"))


@pytest.mark.parametrize("name", list(PLACEMENTS))
def test_audit_of_tinits_model_in_every_placement_gives_tinit_variance(name):
    """The audit finds each placement's sites (the branch's output norm is what is added,
    a norm after the sum continues as the stream) and measures tinit variance's numbers."""
    cfg = dataclasses.replace(TINY, norm_position=name)
    model = Transformer(cfg, InitConfig(scheme="gpt2"))
    want = run_variance(cfg, InitConfig(), RUN, inits=("gpt2",), norm_positions=(name,))["variance"]
    tokens = make_tokens(cfg, RUN, 0, torch.device("cpu"))
    sites, _ = find_sites(model, tokens[:1, :4])
    b = sites.blocks[2]
    added = {"sandwich": "blocks.2.norm2o", "reordered": "blocks.2.norm2"}.get(name)
    assert (b.ffn_added, b.ffn_stream) == (added, "blocks.2.norm2" if name == "post" else None)
    assert sites.norm_position == ("post" if name == "post" else "pre")
    raw, rel = measure_stream(model, sites, tokens)
    assert max(rel) == 0.0
    cols = ["k", "stream_var", "branch_var", "cross_corr", "stream_var_normed"]
    pd.testing.assert_frame_equal(raw[cols], want[cols], check_exact=True)


ARCHITECTURES = ("naive", "gpt2", "rezero", "nanochat", "gemma2", "magneto", "deepnet", "olmo2")
AUDITED = sorted({(s, p) for s in ARCHITECTURES for p in PLACEMENTS}
                 | {(s, get_scheme(s).placement) for s in CATALOGUE if get_scheme(s).placement})  # fmt: skip


@pytest.mark.parametrize("scheme,name", AUDITED)
def test_audit_passes_tinits_model_in_each_placement(scheme, name):
    """Every weight of tinit's model, built with the scheme in the placement, is ok
    against the scheme (the audit's roles come from the parameter names, kept as they
    were; tests/test_audit_schemes.py runs every scheme in pre-norm)."""
    cfg = ModelConfig(n_layers=2, d_model=256, n_heads=4, vocab_size=512, max_seq_len=16,
                      tie_embeddings=False, norm_position=name)  # fmt: skip
    model = Transformer(cfg, InitConfig(scheme=scheme, seed=1))
    tokens = torch.randint(cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    sites, tr = find_sites(model, tokens[:1, :4])
    roles = classify_roles(model, sites, tr, cfg.vocab_size)
    w = audit_weights(model, roles, Expectation(scheme, 0.02, 0.02, "x"), sites)
    assert "unknown" not in set(w["role"])
    assert set(w["verdict"]) == {"ok"}, w[w["verdict"] != "ok"].to_string()


# --- a placement the code has never seen: one registry entry ------------------------------

DUAL = Placement(
    "dual", "N(x + F(N(x)))", "a test: pre- and post-norm at once",
    norm_in=True, norm_out=False, norm_stream=True, final_norm=False,
    stream_law="reset", branch_law="init",
    label="dual-norm", heading="Dual norm", title="Dual norm: variance of each sum", short_title="Dual norm",
    shade=0.9, marker="*",
)  # fmt: skip


@pytest.fixture
def dual(monkeypatch):
    monkeypatch.setitem(PLACEMENTS, "dual", DUAL)
    return dataclasses.replace(TINY, norm_position="dual")


def test_a_new_entry_builds_a_block_with_its_norms(dual):
    net = Transformer(dual, InitConfig(seed=2), dtype=torch.float64)
    block = net.blocks[0]
    assert net.final_norm is None and block.norm_names == {
        "attn_in": "norm1",
        "ffn_in": "norm2",
        "attn_stream": "norm1o",
        "ffn_stream": "norm2o",
    }
    x = torch.randn(2, 16, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    h = block.norm1o(x + block.attn(block.norm1(x), net.rope))
    want = block.norm2o(h + block.ffn(block.norm2(h)))
    torch.testing.assert_close(block(x, net.rope), want, rtol=0, atol=0)
    built = sum(p.numel() for p in net.parameters())
    assert count_params(dual).total == built


def test_a_new_entry_is_measured_against_its_own_law(dual):
    """variance: the sum before the stream norm is predicted from the measured stream
    entering and branch, v_in + s^2 (the naive scheme: a = g = 1); the normalised stream
    is reported (unit mean square: variance ~1). grad-norms: the identity path passes
    the stream norms, prod 1/sqrt(var s_j + eps)."""
    v = run_variance(dual, InitConfig(), RUN, inits=("naive",), norm_positions=("dual",))["variance"]
    adds = v[v["k"] > 0]
    s_in = np.concatenate([[v["stream_var"].iloc[0]], adds["stream_var_normed"].to_numpy()[:-1]])
    np.testing.assert_allclose(adds["pred_cumulative"], s_in + adds["branch_var"], rtol=1e-6)
    np.testing.assert_allclose(adds["stream_var_normed"], 1.0, atol=0.05)
    g = run_grad_norms(dual, InitConfig(), RUN, inits=("naive",), norm_positions=("dual",))["stream_grads"]
    want = theory.identity_gain_post(adds["stream_var"].to_numpy(), dual.norm_eps)
    np.testing.assert_allclose(g["pred_identity_gain"], want, rtol=1e-6)
    fig = plot_variance(v, "dual")
    assert "Dual norm: variance of each sum" in {ax.get_title() for ax in fig.axes}


def test_the_cli_takes_a_new_entry(dual, tmp_path, monkeypatch):
    figures_built_not_saved(monkeypatch)  # (summary.csv; test_cli_variance draws the figure)
    out = tmp_path / "v"
    shape = ["--layers", "2", "--d-model", "16", "--heads", "2", "--vocab", "32", "--seq-len", "8",
             "--batch", "2"]  # fmt: skip
    res = runner.invoke(app, ["variance", *shape, "--init", "naive", "--norm-position", "pre,dual", "-q",
                              "-o", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["norm_position"]) == ["pre", "dual"]
    assert summary["v_final_normed"].isna().tolist() == [True, False]  # only dual's stream is normalised
