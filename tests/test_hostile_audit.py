"""Issue 22, `tinit audit`: each case reproduced. Case 3: a wrong --sites printed PASS
(exit 0) while audit.md said the rebuilt stream disagreed, and PASS counted unchecked
parameters. Case 6: sys.exit in a --module. Case 9: transformers' validation errors as
tracebacks. Case 10: hostile forwards and a meta-device model. Case 15: options audit
cannot use, errors naming options that were not given, files beside a --module file,
`expected` written nan for unknown roles. And from issue 21: the --expect help and
error, and a model with fewer positions than the default --seq-len."""

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest
from helpers import assert_one_line_error, figures_built_not_saved, reference_page
from typer.testing import CliRunner

from tinit.cli import app
from tinit.model.catalogue import names as scheme_names

runner = CliRunner()  # (its click command built once: conftest)


@pytest.fixture(autouse=True)
def _no_png(monkeypatch):
    """The tests here are about the input an audit is given (exit codes, verdicts, errors):
    figures are built, not rendered (tests/test_audit_module.py and the tied cases of
    tests/test_audit_schemes.py render the audit's PNGs)."""
    figures_built_not_saved(monkeypatch)


HERE = Path(__file__).resolve().parent
MODELS, HOSTILE = str(HERE / "audit_models.py"), str(HERE / "hostile_models.py")
TINY = ["--seq-len", "8", "--batch", "2"]
NEEDS_HF = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
LLAMA = [
    "--hf",
    "llama",
    "--set",
    "num_hidden_layers=2",
    "--set",
    "hidden_size=32",
    "--set",
    "intermediate_size=64",
    "--set",
    "num_attention_heads=2",
    "--set",
    "num_key_value_heads=2",
    "--set",
    "vocab_size=64",
]


def audit(tmp_path, *args):
    out = tmp_path / "run"
    return runner.invoke(app, ["audit", *TINY, "--no-grads", *args, "--out", str(out)]), out


# --- case 3: a wrong --sites, and what PASS counts ---------------------------------------


@pytest.mark.parametrize("spec", ["layers:attn:attn", "layers:ln1:mlp", "layers:attn>ln2:mlp"])
def test_sites_that_do_not_rebuild_the_stream_are_refused(tmp_path, spec):
    """The issue's `model.layers:mlp:mlp` and `self_attn>post_attention_layernorm` printed
    PASS and exited 0 (audit.md: relative difference 0.32 and 50)."""
    res, out = audit(tmp_path, "--module", f"{MODELS}:good_model", "--sites", spec)
    assert_one_line_error(res, "--sites", out)
    assert "does not describe the residual stream" in res.stderr


def test_the_right_sites_still_pass(tmp_path):
    """The right sites rebuild the stream: each addition's stream variance is that of the
    sum of the stream before it and the branch, Var(a + b) = Var a + Var b + 2 Cov(a, b),
    computed here from variance.csv's own stream, branch and correlation columns."""
    res, out = audit(tmp_path, "--module", f"{MODELS}:good_model", "--sites", "layers:attn:mlp", "-q")
    assert res.exit_code == 0, res.output
    v = pd.read_csv(out / "variance.csv")
    assert list(v["sublayer"]) == ["embed"] + ["attn", "ffn"] * 3  # good_model: 3 layers
    prev, cur = v.iloc[:-1].reset_index(drop=True), v.iloc[1:].reset_index(drop=True)
    cov = cur["cross_corr"] * (prev["stream_var"] * cur["branch_var"]) ** 0.5
    want = prev["stream_var"] + cur["branch_var"] + 2 * cov
    assert ((cur["stream_var"] / want - 1).abs() < 1e-4).all(), (cur["stream_var"], want)


def test_pass_counts_only_the_parameters_it_checked(tmp_path):
    """PASS said "all N parameters match" with unchecked ones among the N; and their
    `expected` (and rel_err) cells were nan, flagged as non-finite measurements."""
    res, out = audit(tmp_path, "--module", f"{HOSTILE}:with_unknown_parameter")
    assert res.exit_code == 0, res.output
    w = pd.read_csv(out / "weights.csv", keep_default_na=False)
    side = w[w["param"] == "side.weight"].iloc[0]
    assert side["role"] == "unknown" and side["verdict"] == "unchecked"
    assert side["expected"] == "" and side["rel_err"] == ""
    n = len(w)
    assert f"PASS: all {n - 1} checked parameters match" in res.stdout and "1 unchecked" in res.stdout
    doc = json.loads((out / "config.json").read_text())
    assert doc["non_finite_total"] == 0 and doc["n_unchecked"] == 1


# --- cases 6 and 10: a user's module that exits, or a forward that cannot be measured ---


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (f"{HERE}/hostile/exit_at_import.py:build", "sys.exit(0)"),
        (f"{HERE}/hostile/exit3_at_import.py:build", "sys.exit(3)"),
        (f"{HOSTILE}:exits_0", "sys.exit(0)"),
        (f"{HOSTILE}:exits_3", "sys.exit(3)"),
        (f"{HOSTILE}:exits_in_forward", "sys.exit(0)"),
        (f"{HOSTILE}:returns_none", "no logits"),
        (f"{HOSTILE}:returns_dict", "no logits"),
        (f"{HOSTILE}:returns_narrow_logits", "expected (2, 8, vocab)"),
        (f"{HOSTILE}:returns_flat_logits", "expected (2, 8, vocab)"),
        (f"{HOSTILE}:fails_beyond_four_tokens", "my cache holds 4 positions"),
        (f"{HOSTILE}:on_meta_device", "meta device"),
    ],
)
@pytest.mark.parametrize("grads", [False, True])
def test_hostile_modules_are_one_line_errors_naming_module(tmp_path, spec, words, grads):
    """An exit at import or in the factory ended the audit with its own code (0: nothing
    audited, a CI guard passes; 3: "deviating weights"); the forwards were tracebacks
    (a meta-device model left a folder with complete: false, error: null)."""
    out = tmp_path / "run"
    res = runner.invoke(
        app, ["audit", *TINY, *([] if grads else ["--no-grads"]), "--module", spec, "--out", str(out)]
    )
    assert_one_line_error(res, "--module", out)
    assert words in res.stderr


def test_a_module_file_imports_the_files_beside_it(tmp_path, monkeypatch):
    """`path/file.py:factory` could not import a neighbour (ModuleNotFoundError)."""
    monkeypatch.chdir(tmp_path)  # not the tests folder: only the file's own folder can help
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    res, out = audit(tmp_path, "--module", f"{HERE}/hostile/uses_a_neighbour.py:build", "-q")
    assert res.exit_code == 0, res.output
    spec = importlib.util.spec_from_file_location("neighbour", HERE / "hostile" / "neighbour_for_audit.py")
    neighbour = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(neighbour)
    w = pd.read_csv(out / "weights.csv")
    assert list(w["param"]) == [n for n, _ in neighbour.make().named_parameters()]  # the neighbour's model
    assert len(pd.read_csv(out / "variance.csv")) == 1 + 2 * 2  # its 2 blocks


def test_readme_says_module_executes_the_file():
    text = reference_page("audit")
    assert "executes" in text and "sys.path" in text


# --- case 9 and 15: transformers' errors, named by the option that caused them ---------


@NEEDS_HF
@pytest.mark.parametrize(
    ("sets", "option"),
    [
        (["num_hidden_layers=abc"], "--set"),
        (["num_hidden_layers=2.5"], "--set"),
        (["num_hidden_layers=null"], "--set"),
        (["hidden_size=[32]"], "--set"),
        (["initializer_range=-0.02"], "--set"),
        (["initializer_range=0"], "--set"),
        (["initializer_range=NaN"], "--set"),
        (["num_attention_heads=3"], "--set"),
        (["intermediate_size=-5"], "--set"),
        (["num_hidden_layers=0"], "--hf"),  # was blamed on --sites, which nobody gave
        (["vocab_size=0"], "--hf"),  # was blamed on --vocab
        (["intermediate_size=0"], "--hf"),  # an empty matrix: found by the fuzz (max() of nothing)
    ],
)
def test_transformers_validation_errors_are_one_line(tmp_path, sets, option):
    # a key is set once (--set K=1 --set K=3 is refused): LLAMA's value gives way
    keys = {s.split("=")[0] for s in sets}
    base = LLAMA[:2] + [x for kv in LLAMA[3::2] if kv.split("=")[0] not in keys for x in ("--set", kv)]
    args = [x for s in sets for x in ("--set", s)]
    res, out = audit(tmp_path, *base, *args)
    assert_one_line_error(res, option, out)
    assert "--sites" not in res.stderr and "'--vocab'" not in res.stderr


@NEEDS_HF
@pytest.mark.parametrize(
    ("doc", "extra", "words"),
    [
        ({"model_type": "llama", "num_hidden_layers": "two"}, [], "num_hidden_layers"),
        ({"model_type": "llama", "initializer_range": 1e400}, [], "initializer_range"),
        ({"model_type": ["llama"]}, [], "no model_type string"),
        ({"model_type": "t5", "num_layers": 2}, [], "not a causal language model"),
    ],
)
def test_hostile_config_files_are_one_line_errors(tmp_path, doc, extra, words):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc).replace("Infinity", "1e400"))
    res, out = audit(tmp_path, "--hf", str(path), *extra)
    assert_one_line_error(res, "--hf", out)
    assert words in res.stderr


@NEEDS_HF
def test_a_model_type_that_is_no_causal_lm_and_a_small_phi3_vocab(tmp_path):
    res, out = audit(tmp_path, "--hf", "vit")
    assert_one_line_error(res, "--hf", out)
    phi3 = [*LLAMA[2:], "--hf", "phi3"]  # phi3's pad id 32000 lies outside a 64-token vocabulary
    res, out = audit(tmp_path, *phi3)
    assert_one_line_error(res, "--set", out)
    assert "Padding_idx" in res.stderr


@NEEDS_HF
def test_a_model_with_fewer_positions_runs_at_its_own_length(tmp_path):
    """The default --seq-len 128 exceeded a 16-position model: an error for an option
    nobody gave. Given explicitly, it is still refused."""
    out = tmp_path / "own"
    res = runner.invoke(
        app,
        [
            "audit",
            "--batch",
            "2",
            "--no-grads",
            *LLAMA,
            "--set",
            "max_position_embeddings=16",
            "--out",
            str(out),
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads((out / "config.json").read_text())["seq_len"] == 16
    res, out = audit(tmp_path, *LLAMA, "--set", "max_position_embeddings=4", "--seq-len", "8")
    assert_one_line_error(res, "--seq-len", out)


# --- case 15 and issue 21: what audit offers ----------------------------------------------


NOT_OFFERED = [
    "--norm-position",
    "--qk-norm",
    "--no-qk-norm",
    "--kv-heads",
    "--base-width",
    "--base-depth",
    "--layers",
    "--d-model",
    "--preset",
    "--pre-norm",
    "--post-norm",
    "--stream",
]


@pytest.mark.parametrize("option", NOT_OFFERED)
def test_audit_does_not_offer_model_options_it_cannot_use(tmp_path, option):
    """--norm-position post, --qk-norm, --kv-heads, --base-* were accepted and ignored
    (the audited model has its own shape, placement and init). (--init-file is offered:
    --expect and --init may name its scheme, test_audit_expects_a_user_scheme.)"""
    flag = option in ("--qk-norm", "--no-qk-norm", "--pre-norm", "--post-norm", "--stream")
    res, out = audit(tmp_path, "--module", f"{MODELS}:good_model", option, *([] if flag else ["post"]))
    assert res.exit_code == 2 and f"No such option: {option}" in res.stderr
    assert option not in runner.invoke(app, ["audit", "--help"]).stdout.replace("--no-grads", "")


def test_expect_lists_every_scheme_and_its_error_each_once(tmp_path):
    helptext = " ".join(runner.invoke(app, ["audit", "--help"]).stdout.split())
    expect = helptext.split("--expect", 1)[1].split("--init", 1)[0]
    for name in scheme_names(custom=False):
        assert name in expect, name
    res, out = audit(tmp_path, "--module", f"{MODELS}:good_model", "--expect", "xavier")
    assert_one_line_error(res, "--expect", out)
    listed = res.stderr.split("is not one of", 1)[1].strip().split(", ")
    assert len(listed) == len(set(listed)) and "gpt2" in listed and "mitchell" in listed
