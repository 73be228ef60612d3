"""Drives every command other than `variance` (which test_cli_fuzz.py covers in
depth) with random option values, valid and invalid, and asserts that no call
ends in a traceback: exit 0 with config.json written (or, for `check`, exit 1
after writing check.csv when a claim fails), or a non-zero exit with a one-line
message.

As in test_cli_fuzz.py: the input fuzz stops each accepted call at its first measured
step (helpers.validation_only), and a run fuzz with valid values only runs each
command whole, writing every file: its figures built, and rendered where the drawn values
can leave them nothing finite to show (RENDERED), else not saved (rendering was 60 to 85%
of a tiny run; tests/test_reader_rules.py draws every command's figures)."""

import itertools
import json
import random

import pytest
from helpers import figures_built_not_saved, validation_only
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.main import get_command
from typer.testing import CliRunner

from tinit.cli import app

runner = CliRunner()
_counter = itertools.count()

TINY_MODEL = {"--d-model": "16", "--heads": "2", "--seq-len": "8", "--batch": "1", "--vocab": "16"}
#: Each command's arguments for a tiny run.
TINY = {
    "grad-norms": {**TINY_MODEL, "--layers": "2"},
    "depth-sweep": {**TINY_MODEL, "--layers": "1,2", "--seeds": "1"},
    "attention-scale": {"--head-dims": "4,8", "--seq-len": "8", "--batch": "1", "--vocab": "16"},
    "params": {"--layers": "2", "--d-model": "16", "--heads": "2", "--vocab": "16"},
    "norms": {"--rows": "4", "--d-model": "8", "--repeats": "1", "--warmup": "0"},
    "check": {**TINY_MODEL, "--layers": "2", "--deep-layers": "3", "--head-dims": "4"},
    "train": {**TINY_MODEL, "--layers": "1", "--steps": "2", "--eval-batches": "1"},
    "lr-sweep": {**TINY_MODEL, "--layers": "1", "--steps": "2", "--eval-batches": "1", "--lr": "1e-3,1e-2"},
    "claims": {
        **TINY_MODEL,
        "--shallow": "1",
        "--deep": "2",
        "--seeds": "2",
        "--steps": "2",
        "--eval-batches": "1",
    },
    "inits": {"--layers": "2", "--d-model": "16", "--heads": "2"},
    # one scheme: coord-check draws a figure per scheme beside its summary (gpt2,mup: 3 of them)
    "coord-check": {
        **TINY_MODEL,
        "--d-model": "16,32",
        "--layers": "1",
        "--steps": "1",
        "--seeds": "1",
        "--init": "mup",
    },
}
#: The commands fuzzed in depth elsewhere.
ELSEWHERE = {"variance": "test_cli_fuzz.py", "audit": "test_cli_fuzz_audit_sweep.py",
             "sweep": "test_cli_fuzz_audit_sweep.py"}  # fmt: skip
#: Every other command of the app.
COMMANDS = [c for c in get_command(app).commands if c not in ELSEWHERE]


def test_every_command_is_fuzzed():
    """A new command fails here until it has its tiny arguments (or a fuzz file of its own)."""
    assert sorted(COMMANDS) == sorted(TINY)


OPTIONS = {
    "--layers": st.sampled_from(["0", "1", "2", "-1", "x", "1,2", "1:4:x2", ""]),
    "--d-model": st.sampled_from(["0", "8", "12", "16", "-4", "abc", "8,16"]),
    "--heads": st.sampled_from(["1", "2", "3", "0"]),
    "--d-ff": st.sampled_from(["1", "24", "0"]),
    "--vocab": st.sampled_from(["1", "7", "0"]),
    "--seq-len": st.sampled_from(["1", "4", "0", "x"]),
    "--batch": st.sampled_from(["1", "2", "0"]),
    "--sigma": st.sampled_from(["0.02", "inv-sqrt-d", "0", "nan", "x"]),
    "--norm": st.sampled_from(["rmsnorm", "layernorm", "batchnorm"]),
    "--ffn": st.sampled_from(["swiglu", "gelu", "relu"]),
    "--positions": st.sampled_from(["rope", "none", "learned", "alibi"]),
    "--init": st.sampled_from(["naive", "scaled", "both", "xavier"]),
    "--dtype": st.sampled_from(["float32", "float64", "int8"]),
    "--preset": st.sampled_from(["gpt2-small", "nope"]),
    "--seed": st.sampled_from(["0", "-1"]),
    "--format": st.sampled_from(["png", "svg", "gif"]),
    "--batches": st.sampled_from(["1", "2", "0"]),
    "--tensor": st.sampled_from(["down", "o", "both", "q"]),
    "--seeds": st.sampled_from(["1", "2", "0"]),
    "--head-dims": st.sampled_from(["4", "4,8", "0", "3", "a"]),
    "--rows": st.sampled_from(["4", "0", "4,8", "x"]),
    "--repeats": st.sampled_from(["1", "0"]),
    "--reference-total": st.sampled_from(["1e6", "-1", "nan"]),
    "--deep-layers": st.sampled_from(["3", "0"]),
    "--alpha": st.sampled_from(["0.01", "0", "2"]),
    "--transfer-from": st.sampled_from(["1", "2", "3", "0", "x"]),
}
FLAGS = ["--untie", "--bias", "--pre-norm", "--post-norm", "--stream", "--no-grads", "--tf32"]


@pytest.fixture
def stop_at_first_step(monkeypatch):
    validation_only(monkeypatch)


@pytest.mark.parametrize("command", COMMANDS)
# 12 examples of up to 4 of the 26 options and 2 flags each: about one draw of each option per
# command per run of the suite (each example is cheap: it stops at the first step)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chosen=st.lists(st.sampled_from(sorted(OPTIONS)), max_size=4, unique=True),
    values=st.data(),
    flags=st.lists(st.sampled_from(FLAGS), max_size=2, unique=True),
)
def test_no_command_ends_in_a_traceback(tmp_path, stop_at_first_step, command, chosen, values, flags):
    args = dict(TINY[command])
    for opt in chosen:
        args[opt] = values.draw(OPTIONS[opt], label=opt)
    out = tmp_path / f"run{next(_counter)}"
    argv = [command, *itertools.chain.from_iterable(args.items()), *flags, "--out", str(out), "-q"]
    res = runner.invoke(app, argv)
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), (argv, repr(res.exception))
    if res.exit_code == 0:
        assert (out / "config.json").is_file(), argv  # accepted: the folder was claimed
    else:
        assert res.exit_code in (1, 2), argv
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error:"), (argv, res.stderr)
        assert "internal error" not in lines[0], (argv, lines[0])  # a bug, not a refusal


#: Valid values only, per command where it takes them: every run-fuzz example is a whole run.
VALID = {
    "--sigma": ["0.02", "inv-sqrt-d", "1e30"],
    "--norm": ["rmsnorm", "layernorm"],
    "--ffn": ["swiglu", "gelu"],
    "--positions": ["rope", "none", "learned"],
    "--init": ["naive", "scaled"],
    "--dtype": ["float32", "float64", "bfloat16"],
    "--format": ["png", "svg"],
    "--batches": ["2"],
    "--tensor": ["down", "o"],
    "--seeds": ["2"],
    "--rows": ["4,8"],
    "--reference-total": ["1e6"],
}


#: The valid values whose numbers may overflow or lose their spread: a run that draws one
#: renders its figures (matplotlib failed at draw time on such numbers: coord-check's log
#: axis at --sigma 1e30, found by this fuzz; train's final_vs_depth when every run diverged).
RENDERED = {("--sigma", "1e30"), ("--dtype", "bfloat16")}


def _takes(command: str) -> list[str]:
    params = get_command(app).commands[command].params
    names = {o for p in params for o in p.opts}
    return sorted(o for o in VALID if o in names)


@pytest.mark.parametrize("command", COMMANDS)
def test_valid_calls_run_end_to_end(tmp_path, monkeypatch, command):
    """One whole run per command, its valid options drawn at random: up to three of those
    the command takes, each a random valid value; the figures rendered when a RENDERED
    value is drawn, else built and not saved. Hypothesis would spend the first example on
    the simplest call, the command's tiny arguments alone, which tests/test_same_twice.py
    (or, for the sweepable commands, tests/test_sweep_equals_run.py) already runs whole;
    a failure's message has the argv to rerun."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    takes = _takes(command)
    chosen = rng.sample(takes, rng.randint(0, min(3, len(takes))))
    args = dict(TINY[command])
    for opt in chosen:
        args[opt] = rng.choice(VALID[opt])
    out = tmp_path / "run"
    argv = [command, *itertools.chain.from_iterable(args.items()), "--out", str(out), "-q"]
    rendered = any(item in RENDERED for item in args.items())
    if not rendered:
        figures_built_not_saved(monkeypatch)
    res = runner.invoke(app, argv)
    # check exits 1 when a claim fails (e.g. at sigma 1e30), after writing everything
    assert res.exit_code == 0 or (command == "check" and res.exit_code == 1), (seed, argv, res.output)
    doc = json.loads((out / "config.json").read_text())
    assert doc["complete"] is True, argv
    assert list(out.glob("*.csv")), argv
    if command != "inits":  # the catalogue is a table and a CSV, no figure
        figures = list(out.glob("*.png")) + list(out.glob("*.svg"))
        assert figures, argv
        if rendered:
            assert all(p.stat().st_size > 0 for p in figures), argv


def test_coord_check_with_non_finite_numbers_draws_its_figure(tmp_path):
    """Found by the run fuzz (and by tests/test_cli_fuzz_audit_sweep.py's sweep fuzz): at
    --sigma 1e30 every number is non-finite, which the CSVs flag; the figure raised (a log
    axis with nothing positive to show). It is drawn, with the overflow named in its notes."""
    out = tmp_path / "run"
    argv = ["coord-check", *itertools.chain.from_iterable(TINY["coord-check"].items()), "--sigma", "1e30"]
    res = runner.invoke(app, [*argv, "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "config.json").read_text())["complete"] is True
    assert (out / "coord_check.png").stat().st_size > 0
