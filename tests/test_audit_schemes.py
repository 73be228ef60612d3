"""The audit and the catalogue agree: tinit's own model, built with each scheme, passes
`tinit audit` (every weight ok, exit 0), whatever the scheme draws (truncated normals,
uniforms, exact zeros, ReZero's zero gain, Gemma's (1 + w) norms); `audit --init`
re-draws each scheme's own distribution; a zero expectation is judged by equality."""

import math

import pandas as pd
import pytest
import torch
from helpers import figures_built_not_saved
from typer.testing import CliRunner

from tinit.cli import app
from tinit.criteria import DEVIATING
from tinit.experiments.audit.audit import Expectation, audit_weights, run_audit
from tinit.experiments.audit.roles import classify_roles
from tinit.experiments.audit.sites import find_sites
from tinit.model.catalogue import names
from tinit.model.config import InitConfig, ModelConfig
from tinit.model.transformer import Transformer

runner = CliRunner()
#: The issue's shape: at d 256, L 2 the truncated normals' 1.3% lower std is 5-9 standard
#: errors, which an expectation at the nominal std failed (mitchell exited 3).
CFG = ModelConfig(n_layers=2, d_model=256, n_heads=4, vocab_size=512, max_seq_len=16, tie_embeddings=False)
MODULE = """
import torch
from tinit.model.config import InitConfig, ModelConfig
from tinit.model.transformer import Transformer


def build():
    cfg = ModelConfig(n_layers=2, d_model=256, n_heads=4, vocab_size=512, max_seq_len=16,
                      tie_embeddings={tied})
    return Transformer(cfg, InitConfig(scheme={scheme!r}, seed=1))
"""


@pytest.mark.parametrize("scheme", names())
def test_audit_of_tinits_own_model_passes_for_every_scheme(tmp_path, monkeypatch, scheme):
    """`tinit audit --module f.py:build` of tinit's model built with ``scheme``: exit 0,
    every weight ok against the model's declared scheme (untied: the head too). Its
    figures are built, not rendered (two PNGs were 2.3 of the 3.1 s a scheme); the tied
    cases below render theirs (but depth-init), ReZero's zero gains and Gemma 3's (1 + w)
    norms included."""
    figures_built_not_saved(monkeypatch)
    f = tmp_path / "m.py"
    f.write_text(MODULE.format(scheme=scheme, tied=False))
    out = tmp_path / "a"
    res = runner.invoke(app, ["audit", "--module", f"{f}:build", "--seq-len", "16", "--batch", "2",
                              "--no-grads", "-q", "-o", str(out)])  # fmt: skip
    w = pd.read_csv(out / "weights.csv")
    bad = w[w["verdict"] != "ok"][["param", "role", "std", "expected", "z_std", "verdict"]]
    assert res.exit_code == 0, (res.output, bad.to_string())
    assert set(w["verdict"]) == {"ok"} and "unknown" not in set(w["role"])


@pytest.mark.parametrize("scheme", ["depth-init", "mup", "rezero", "gemma3"])
def test_tied_models_pass_too(tmp_path, monkeypatch, scheme):
    """Tied: torchtitan's shared matrix is the output layer's TN; muP's readout is the
    embedding; ReZero's gain is a 'gain' (expected 0), Gemma 3's QK-norms are (1 + w).
    Their weight figures are rendered (muP's zero q, ReZero's zero gains, Gemma 3's
    norms), but depth-init's, whose weights are plain finite non-zero draws like most
    schemes'. Their variance figures are built, not rendered: a stream like any scheme's
    (tests/test_reader_rules.py draws the audit's variance figure, and every scheme's
    stream in the variance command's)."""
    figures_built_not_saved(monkeypatch, rendered=() if scheme == "depth-init" else ("weights",))
    f = tmp_path / "m.py"
    f.write_text(MODULE.format(scheme=scheme, tied=True))
    out = tmp_path / "a"
    res = runner.invoke(app, ["audit", "--module", f"{f}:build", "--seq-len", "16", "--batch", "2",
                              "--no-grads", "-q", "-o", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    w = pd.read_csv(out / "weights.csv")
    assert set(w["verdict"]) == {"ok"}
    if scheme == "rezero":
        gains = w[w["role"] == "gain"]
        assert (
            len(gains) == 2 and (gains["expected"] == 0).all() and (gains["expected_kind"] == "value").all()
        )
    if scheme == "depth-init":  # TN(d^-1/2, +-3 std): its drawn std is 0.9866 d^-1/2
        e = w[w["role"] == "embed"].iloc[0]
        assert e["expected"] == pytest.approx(256**-0.5 * 0.98658, rel=1e-4)


def _model_and_roles(scheme: str, seed: int = 1):
    model = Transformer(CFG, InitConfig(scheme=scheme, seed=seed))
    tokens = torch.randint(CFG.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    sites, tr = find_sites(model, tokens[:1, :4])
    return model, sites, classify_roles(model, sites, tr, CFG.vocab_size), tokens


@pytest.fixture(scope="module")
def naive_audited():
    """One naive model, its sites and roles, for every scheme's re-draw below: the re-draw
    is of a deep copy (as `audit --init` makes it), and the tests assert the original is
    untouched."""
    return _model_and_roles("naive")


@pytest.mark.parametrize("scheme", names())
def test_audit_init_draws_each_schemes_own_distribution(naive_audited, scheme):
    """`audit --init SCHEME` re-initialises a naive model by the scheme: its twin passes
    the scheme's own audit, and its weights have the scheme's shape: a uniform's max is
    sqrt(3) std (no normal tail), a truncated normal stays inside its bound, a zero is 0."""
    model, sites, roles, tokens = naive_audited
    scheme = Expectation(scheme, 0.02, 0.02, f"tinit {scheme}")
    # the stream of 4 tokens (those the sites were found on): only the weights' verdicts are
    # asserted, and 32 tokens' forwards of the model and its twin were a quarter of the time
    tokens = tokens[:1, :4]
    res = run_audit(model, sites, roles, tokens, Expectation("naive", 0.02, 0.02, "n"), scheme, grads=False)
    assert res.meta["scheme_weights_deviating"] == 0, scheme
    assert res.meta["scheme_kept_as_built"] == []
    twin = dict(model.named_parameters())  # the original is untouched: a deep copy was re-drawn
    assert float(twin["blocks.0.attn.q.weight"].detach().std()) == pytest.approx(0.02, rel=0.02)


@pytest.mark.parametrize(
    "scheme,role,dist",
    [
        ("rezero", "o", "uniform"),
        ("nanochat", "q", "uniform"),
        ("mitchell", "o", "trunc"),
        ("deepnet-torchscale", "v", "uniform"),
    ],
)
def test_the_re_drawn_twin_has_the_distribution(naive_audited, scheme, role, dist):
    import copy

    from tinit.experiments.audit.audit import reinit_

    original, sites, roles, _ = naive_audited
    model = copy.deepcopy(original)  # the twin, as run_audit makes it
    kept = {n: p.detach().clone() for n, p in original.named_parameters()}
    expect = Expectation(scheme, 0.02, 0.02, "x")
    reinit_(model, roles, expect, sites, seed=3)
    w = dict(model.named_parameters())[f"blocks.1.attn.{role}.weight"].detach().to(torch.float64)
    draw = expect.draw(role, sites.n_layers, 1, tuple(w.shape))
    assert draw.dist == dist
    if dist == "uniform":
        edge = math.sqrt(3) * draw.std
        assert 0.99 * edge < float(w.abs().max()) <= edge * (1 + 1e-6)
    else:
        assert float(w.abs().max()) <= draw.bound * (1 + 1e-9)
        # the std of the draw, not the nominal std: 0.9733 std at 3 std
        assert float(w.detach().std()) == pytest.approx(draw.std_drawn, rel=0.02)
        assert draw.std_drawn == pytest.approx(0.98658 * draw.std, rel=1e-4)
    # the fixture's model, the other tests' naive one, is untouched
    assert all(torch.equal(p, kept[n]) for n, p in original.named_parameters())


@pytest.mark.parametrize("scheme", ["zero-out", "nanochat", "mup"])
def test_zero_expectations_are_judged_by_equality(naive_audited, scheme):
    """A role the scheme draws as exactly 0 (zero-out's o and down, nanochat's, muP's q) is
    ok when every element is 0 and off-scheme otherwise: no division by the expected 0."""
    model, sites, roles, _ = _model_and_roles(scheme)
    w = audit_weights(model, roles, Expectation(scheme, 0.02, 0.02, "x"), sites).set_index("param")
    zero = "blocks.0.attn.q.weight" if scheme == "mup" else "blocks.0.attn.o.weight"
    assert w.loc[zero, "verdict"] == "ok" and w.loc[zero, "expected"] == 0.0
    assert w.loc[zero, "expected_kind"] == "value"
    assert not w["verdict"].isin(DEVIATING).any()
    naive, sites, roles, _ = naive_audited  # the same check of non-zero weights fails
    v = audit_weights(naive, roles, Expectation(scheme, 0.02, 0.02, "x"), sites).set_index("param")
    assert v.loc[zero, "verdict"] == "off-scheme"


USER_SCHEME = """
name = "per-layer-o"
[roles]
o = "sigma / sqrt(2 * (l + 1))"
down = "sigma / sqrt(2 * (l + 1))"
"""
USER_MODULE = """
from tinit.model.config import InitConfig, ModelConfig
from tinit.model.scheme_file import load_scheme
from tinit.model.transformer import Transformer


def build():
    cfg = ModelConfig(n_layers=4, d_model=256, n_heads=4, vocab_size=512, max_seq_len=16)
    s = load_scheme({toml!r})
    return Transformer(cfg, InitConfig(scheme=s.name, schemes=(s,), seed=1))
"""


def test_audit_expects_a_user_scheme(tmp_path, monkeypatch):
    """--init-file is offered to audit because --expect may name its scheme: a model
    built with a per-layer user scheme passes against it (exit 0) and fails against
    naive, whose o/down std is sigma at every layer (exit 3, o and down off-scheme)."""
    figures_built_not_saved(monkeypatch)  # (the verdicts are the CSV's and the exit code's)
    toml = tmp_path / "s.toml"
    toml.write_text(USER_SCHEME)
    f = tmp_path / "m.py"
    f.write_text(USER_MODULE.format(toml=str(toml)))
    common = ["audit", "--module", f"{f}:build", "--seq-len", "16", "--batch", "2", "--no-grads", "-q"]
    res = runner.invoke(app, [*common, "--init-file", str(toml), "--expect", "per-layer-o", "-o",
                              str(tmp_path / "a")])  # fmt: skip
    w = pd.read_csv(tmp_path / "a" / "weights.csv")
    assert res.exit_code == 0, (res.output, w[w["verdict"] != "ok"].to_string())
    res = runner.invoke(app, [*common, "--expect", "naive", "-o", str(tmp_path / "b")])
    w = pd.read_csv(tmp_path / "b" / "weights.csv")
    off = set(w.loc[w["verdict"] != "ok", "role"])
    assert res.exit_code == 3 and off == {"o", "down"}, w.to_string()
