"""Drives `tinit variance` with random option values, valid and invalid, and
asserts that no call ends in a traceback: either exit 0 with the files written, or
a non-zero exit with a one-line message."""

import itertools

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


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chosen=st.dictionaries(st.sampled_from(sorted(OPTIONS)), st.just(None), max_size=6),
    values=st.data(),
    flags=st.lists(st.sampled_from(FLAGS), max_size=3, unique=True),
)
def test_no_call_ends_in_a_traceback(tmp_path, chosen, values, flags):
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
        assert (out / "variance.csv").is_file() and (out / "config.json").is_file()
        assert any(out.glob("variance.*g")) or (out / "variance.pdf").is_file()
    else:
        assert res.exit_code in (1, 2)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error:"), (argv, res.stderr)
