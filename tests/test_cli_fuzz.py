"""Drives `tinit variance` with random option values, valid and invalid, and
asserts that no call ends in a traceback: either exit 0 with the files written, or
a non-zero exit with a one-line message.

Two tests, so that neither spends its time where it learns nothing: the input fuzz
stops every accepted call at its first measured step (parsing, validation, configs,
the run folder's claim and the experiment's own checks all run; helpers.validation_only),
and the run fuzz draws only valid values, so each of its examples is a whole run with
CSVs, plot and config.json: the plot rendered where the drawn values can leave it nothing
finite to show (RENDERED), else built and not saved (helpers.figures_built_not_saved:
rendering was most of a run; every --format is rendered by tests/test_cli_variance.py,
test_norms.py and test_attention_scale.py)."""

import itertools
import json

import pytest
from helpers import figures_built_not_saved, validation_only
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tinit.cli import app

runner = CliRunner()
_counter = itertools.count()

ints = st.one_of(st.integers(-2, 4), st.sampled_from(["x", "1.5", ""]))
OPTIONS = {
    "--layers": st.one_of(st.integers(-1, 3), st.sampled_from(["two", ""])),
    "--d-model": st.sampled_from(["0", "8", "12", "16", "-4", "abc"]),
    "--heads": st.sampled_from(["1", "2", "3", "4", "0"]),
    "--d-ff": st.sampled_from(["1", "24", "0", "-1"]),
    "--vocab": st.sampled_from(["1", "7", "0"]),
    "--seq-len": ints,
    "--batch": ints,
    "--sigma": st.sampled_from(["0.02", "1", "inv-sqrt-d", "0", "-1", "nan", "inf", "x"]),
    "--embed-std": st.sampled_from(["1", "0.5", "0", "-2", "nan"]),
    "--norm": st.sampled_from(["rmsnorm", "layernorm", "batchnorm"]),
    "--ffn": st.sampled_from(["swiglu", "gelu", "relu"]),
    "--positions": st.sampled_from(["rope", "none", "learned", "alibi"]),
    "--attention": st.sampled_from(["causal", "bidirectional", "local"]),
    "--init": st.sampled_from(["naive", "scaled", "both", "xavier"]),
    "--dtype": st.sampled_from(["float32", "float64", "bfloat16", "int8"]),
    "--branch": st.sampled_from(["model", "gaussian", "other"]),
    "--branch-var": st.sampled_from(["0", "0.5", "-1", "inf"]),
    "--seed": st.sampled_from(["0", "3", "-1"]),
    "--format": st.sampled_from(["png", "svg", "png,pdf", "gif", ","]),
    "--device": st.sampled_from(["cpu", "auto", "tpu"]),
}
FLAGS = ["--untie", "--bias", "--no-attn-scale", "--pre-norm", "--post-norm", "--stream", "--no-stream"]


@pytest.fixture
def stop_at_first_step(monkeypatch):
    validation_only(monkeypatch)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chosen=st.dictionaries(st.sampled_from(sorted(OPTIONS)), st.just(None), max_size=6),
    values=st.data(),
    flags=st.lists(st.sampled_from(FLAGS), max_size=3, unique=True),
)
def test_no_call_ends_in_a_traceback(tmp_path, stop_at_first_step, chosen, values, flags):
    # small defaults keep valid calls fast; the drawn options override them
    args = {
        "--layers": "1",
        "--d-model": "16",
        "--heads": "2",
        "--seq-len": "4",
        "--batch": "1",
        "--vocab": "16",
    }
    for opt in chosen:
        args[opt] = str(values.draw(OPTIONS[opt], label=opt))
    out = tmp_path / f"run{next(_counter)}"
    argv = ["variance", *itertools.chain.from_iterable(args.items()), *flags, "--out", str(out), "-q"]
    res = runner.invoke(app, argv)
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    if res.exit_code == 0:
        assert (out / "config.json").is_file()  # accepted: the folder was claimed
    else:
        assert res.exit_code in (1, 2)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error:"), (argv, res.stderr)
        assert "internal error" not in lines[0], (argv, lines[0])  # a bug, not a refusal


#: Valid values only: every example of the run fuzz is a whole run. The extremes
#: (sigma 1e30, a bfloat16 overflow) give non-finite numbers, which must be flagged.
VALID = {
    "--layers": st.sampled_from(["1", "2", "3"]),
    "--d-ff": st.sampled_from(["1", "24"]),
    "--sigma": st.sampled_from(["0.02", "1", "inv-sqrt-d", "1e30"]),
    "--embed-std": st.sampled_from(["1", "1e-30"]),
    "--norm": st.sampled_from(["rmsnorm", "layernorm"]),
    "--ffn": st.sampled_from(["swiglu", "gelu"]),
    "--positions": st.sampled_from(["rope", "none", "learned"]),
    "--attention": st.sampled_from(["causal", "bidirectional"]),
    "--init": st.sampled_from(["naive", "scaled", "both"]),
    "--dtype": st.sampled_from(["float32", "float64", "bfloat16"]),
    "--branch": st.sampled_from(["model", "gaussian"]),
    "--branch-var": st.sampled_from(["0", "0.5"]),
    "--format": st.sampled_from(["png", "svg", "png,pdf"]),
}


#: The valid values whose numbers may overflow, underflow or lose their spread: a run that
#: draws one renders its plot (a log axis with nothing finite and positive failed at draw
#: time in coord-check at --sigma 1e30).
RENDERED = {("--sigma", "1e30"), ("--embed-std", "1e-30"), ("--dtype", "bfloat16")}


# 4 whole runs (under a second each when the plot is not rendered): the simplest call (two
# options at their first values, the tiny run) and 3 random ones of 2-6 of the 13 options
# and up to 2 flags each, so about half of the options at a random valid value per run of the suite
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chosen=st.lists(st.sampled_from(sorted(VALID)), min_size=2, max_size=6, unique=True),
    values=st.data(),
    flags=st.lists(st.sampled_from(["--untie", "--bias", "--no-attn-scale", "--pre-norm", "--stream"]),
                   max_size=2, unique=True),
)  # fmt: skip
def test_valid_calls_run_end_to_end(tmp_path, chosen, values, flags):
    args = {"--layers": "1", "--d-model": "16", "--heads": "2", "--seq-len": "4", "--batch": "1",
            "--vocab": "16"}  # fmt: skip
    for opt in chosen:
        args[opt] = values.draw(VALID[opt], label=opt)
    out = tmp_path / f"run{next(_counter)}"
    argv = ["variance", *itertools.chain.from_iterable(args.items()), *flags, "--out", str(out), "-q"]
    rendered = any(item in RENDERED for item in args.items())
    with pytest.MonkeyPatch.context() as mp:
        if not rendered:
            figures_built_not_saved(mp)
        res = runner.invoke(app, argv)
    assert res.exit_code == 0, (argv, res.output, repr(res.exception))
    assert (out / "variance.csv").is_file() and (out / "summary.csv").is_file()
    for fmt in args["--format"].split(",") if "--format" in args else ["png"]:
        figure = out / f"variance.{fmt}"
        assert figure.stat().st_size > 0 if rendered else figure.is_file(), (argv, fmt)
    doc = json.loads((out / "config.json").read_text())
    assert doc["complete"] is True
    warned = [line for line in res.stderr.splitlines() if line.startswith("Warning:")]
    assert len(warned) == (1 if doc["non_finite_total"] else 0), res.stderr  # flagged, in one line
