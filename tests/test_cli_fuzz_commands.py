"""Drives every command other than `variance` (which test_cli_fuzz.py covers in
depth) with random option values, valid and invalid, and asserts that no call
ends in a traceback: exit 0 with config.json written (or, for `check`, exit 1
after writing check.csv when a claim fails), or a non-zero exit with a one-line
message."""

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tinit.cli import app

runner = CliRunner()
_counter = itertools.count()

TINY_MODEL = {"--d-model": "16", "--heads": "2", "--seq-len": "8", "--batch": "1", "--vocab": "16"}
COMMANDS = {
    "grad-norms": {**TINY_MODEL, "--layers": "2"},
    "depth-sweep": {**TINY_MODEL, "--layers": "1,2", "--seeds": "1"},
    "attention-scale": {"--head-dims": "4,8", "--seq-len": "8", "--batch": "1", "--vocab": "16"},
    "params": {"--layers": "2", "--d-model": "16", "--heads": "2", "--vocab": "16"},
    "norms": {"--rows": "4", "--d-model": "8", "--repeats": "1", "--warmup": "0"},
    "check": {**TINY_MODEL, "--layers": "2", "--deep-layers": "3", "--head-dims": "4"},
    "train": {**TINY_MODEL, "--layers": "1", "--steps": "2", "--eval-batches": "1"},
}
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
}
FLAGS = ["--untie", "--bias", "--pre-norm", "--post-norm", "--stream", "--no-grads", "--tf32"]


@pytest.mark.parametrize("command", list(COMMANDS))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chosen=st.lists(st.sampled_from(sorted(OPTIONS)), max_size=4, unique=True),
    values=st.data(),
    flags=st.lists(st.sampled_from(FLAGS), max_size=2, unique=True),
)
def test_no_command_ends_in_a_traceback(tmp_path, command, chosen, values, flags):
    args = dict(COMMANDS[command])
    for opt in chosen:
        args[opt] = values.draw(OPTIONS[opt], label=opt)
    out = tmp_path / f"run{next(_counter)}"
    argv = [command, *itertools.chain.from_iterable(args.items()), *flags, "--out", str(out), "-q"]
    res = runner.invoke(app, argv)
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), (argv, repr(res.exception))
    if res.exit_code == 0 or (command == "check" and res.exit_code == 1 and (out / "check.csv").is_file()):
        assert (out / "config.json").is_file(), argv
    else:
        assert res.exit_code in (1, 2), argv
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error:"), (argv, res.stderr)
