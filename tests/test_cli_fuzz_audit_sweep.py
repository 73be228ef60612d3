"""The fuzz of tests/test_cli_fuzz*.py extended to the two commands it left out (issue
22): `tinit audit` over a set of small models (HF configs and user modules, hostile ones
among them) with random overrides and options, each run whole; and `tinit sweep` with
the local executor over random options of the sweepable commands, with a fault injected
in a worker (killed, or its memory cut off) while it runs.

The figures are built in every call, and rendered only where the numbers can leave a
figure's axes nothing finite to show (:func:`renders`: a sigma that overflows, bfloat16);
elsewhere they are built, not saved (helpers.figures_built_not_saved: rendering was most of
an accepted call's time, and tests/test_reader_rules.py draws every command's figures).

Every call must end in one of the documented ways, never a traceback: exit 0 (or audit's
3) with config.json complete; exit 1 with config.json saying why and nothing claiming to
be complete; exit 2 with one line naming an option and no run folder."""

import importlib.util
import itertools
import json
import os
import resource
import signal
from pathlib import Path

import pytest
from helpers import at_sweep_update, children_of, figures_built_not_saved, start_fork_server, tiny
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tinit.cli import app
from tinit.cli.registry import SWEEPABLE

runner = CliRunner()
_counter = itertools.count()
HERE = Path(__file__).resolve().parent
HAS_HF = importlib.util.find_spec("transformers") is not None


def check_outcome(res, out: Path, argv, ok=(0,)) -> dict | None:
    """The documented endings; returns config.json when the run folder exists."""
    assert "Traceback" not in res.output, (argv, res.output)
    assert res.exception is None or isinstance(res.exception, SystemExit), (argv, repr(res.exception))
    if res.exit_code == 2:
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error:"), (argv, res.stderr)
        assert not out.exists(), argv  # bad input leaves no folder
        return None
    assert res.exit_code in (*ok, 1), (argv, res.exit_code, res.output)
    doc = json.loads((out / "config.json").read_text())
    if res.exit_code == 1:
        assert doc["complete"] is False and doc.get("error"), (argv, doc.get("error"))
        assert [line for line in res.stderr.splitlines() if line.startswith("Error:")], (argv, res.stderr)
    else:
        assert doc["complete"] is True, (argv, doc.get("error"))
    return doc


#: The drawn values whose numbers may overflow or lose their spread: a call that draws one
#: renders its figures (matplotlib failed at draw time on such numbers: a log axis with
#: nothing positive, found by this sweep fuzz at --sigma 1e30).
RENDERED = {("--sigma", "1e30"), ("--sigma", "1e300"), ("--dtype", "bfloat16")}


def renders(args: dict) -> bool:
    return any(item in RENDERED for item in args.items())


def invoke(argv: list[str], args: dict):
    """runner.invoke, the figures rendered only when :func:`renders`."""
    with pytest.MonkeyPatch.context() as mp:
        if not renders(args):
            figures_built_not_saved(mp)
        return runner.invoke(app, argv)


def assert_rendered(out: Path, args: dict, argv) -> None:
    """A call that renders wrote each figure whole (not the empty file of an unrendered one)."""
    if renders(args):
        figures = [p for p in out.iterdir() if p.suffix in (".png", ".svg")]
        assert figures and all(p.stat().st_size > 0 for p in figures), argv


# --- audit ----------------------------------------------------------------------------

MODULES = [
    f"{HERE / 'audit_models.py'}:{f}"
    for f in ("good_model", "broken_model", "bad_forward", "tinit_model", "tinit_post_model")
]
MODULES += [
    f"{HERE / 'hostile_models.py'}:{f}"
    for f in (
        "returns_none",
        "returns_dict",
        "returns_narrow_logits",
        "fails_beyond_four_tokens",
        "exits_3",
        "exits_in_forward",
        "on_meta_device",
        "with_unknown_parameter",
    )
]
MODULES += [
    f"{HERE / 'hostile' / 'exit_at_import.py'}:build",
    f"{HERE / 'audit_models.py'}:nothing",
    "no/such/file.py:build",
    "json:loads",
    "not-a-spec",
]
HF_BASE = {
    "llama": [
        "hidden_size=32",
        "intermediate_size=64",
        "num_hidden_layers=2",
        "num_attention_heads=2",
        "num_key_value_heads=2",
        "vocab_size=64",
        "max_position_embeddings=32",
    ],
    "gpt2": ["n_layer=2", "n_embd=32", "n_head=2", "vocab_size=64", "n_positions=32"],
    "gpt_neox": [
        "hidden_size=32",
        "intermediate_size=64",
        "num_hidden_layers=2",
        "num_attention_heads=2",
        "vocab_size=64",
        "max_position_embeddings=32",
    ],
}
HOSTILE_SETS = [
    "num_hidden_layers=0",
    "num_hidden_layers=abc",
    "hidden_size=[32]",
    "initializer_range=-1",
    "initializer_range=0.5",
    "vocab_size=1",
    "vocab_size=0",
    "no_such_field=3",
    "num_attention_heads=3",
    "intermediate_size=0",
    "max_position_embeddings=2",
    "n_layer=1",
    "=3",
    "noequals",
]
AUDIT_OPTIONS = {
    # 64: past the HF models' 32 positions and tinit's 8 (refused), bounded for the modules
    # without a limit (100000 ran a 100000-token forward there: minutes and gigabytes)
    "--seq-len": st.sampled_from(["2", "8", "1", "0", "x", "64"]),
    "--batch": st.sampled_from(["1", "2", "0"]),
    "--expect": st.sampled_from(["declared", "naive", "gpt2", "scaled", "mitchell", "zero-out", "xavier"]),
    "--init": st.sampled_from(["none", "scaled", "naive", "bogus"]),
    "--sigma": st.sampled_from(["0.02", "0", "-1", "nan", "1e300"]),
    "--vocab": st.sampled_from(["2", "16", "1", "1000000000"]),
    "--z-max": st.sampled_from(["5", "-1", "nan", "inf"]),
    "--rtol": st.sampled_from(["0.01", "0", "-0.5"]),
    "--sites": st.sampled_from(
        [
            "layers:attn:mlp",
            "layers:attn:attn",
            "layers:ln1:mlp",
            "model.layers:*:mlp",
            "nope",
            "a:b",
            "blocks:attn:ffn",
        ]
    ),
    "--dtype": st.sampled_from(["float32", "float64", "bfloat16", "int8"]),
    "--device": st.sampled_from(["cpu", "tpu"]),
    "--format": st.sampled_from(["png", "svg", "gif"]),
    "--seed": st.sampled_from(["0", "3", "-1"]),
}


CONFIG_FILES = [
    {
        "model_type": "llama",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "vocab_size": 64,
    },
    {"model_type": ["llama"]},
    {"model_type": "llama", "auto_map": {"x": "y"}},
    {"no": "type"},
    {"model_type": "llama", "num_hidden_layers": "two"},
    {"model_type": "t5"},
    [1, 2],
]


@st.composite
def audit_source(draw) -> tuple[list[str], object]:
    """The model's options, and a config.json document to write for --hf CONFIG (None)."""
    kind = draw(st.sampled_from(["module", "hf", "file"] if HAS_HF else ["module"]))
    if kind == "module":
        return ["--module", draw(st.sampled_from(MODULES))], None
    if kind == "file":
        return ["--hf", "CONFIG"], draw(st.sampled_from(CONFIG_FILES))
    family = draw(st.sampled_from(sorted(HF_BASE)))
    hostile = draw(st.lists(st.sampled_from(HOSTILE_SETS), max_size=2, unique=True))
    # a key is set once (a repeat is refused): the hostile value replaces the base's
    keys = {s.split("=")[0] for s in hostile}
    sets = [s for s in HF_BASE[family] if s.split("=")[0] not in keys] + hostile
    return ["--hf", family, *itertools.chain.from_iterable(("--set", s) for s in sets)], None


# 10 audits (a whole one under a second unrendered): a model from 18 modules, 3 HF families
# with up to 2 of 14 hostile --set values, or 7 config files, and up to 3 of the 13 options each
@settings(max_examples=10, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    source=audit_source(),
    chosen=st.lists(st.sampled_from(sorted(AUDIT_OPTIONS)), max_size=3, unique=True),
    values=st.data(),
    grads=st.booleans(),
)
def test_audit_never_ends_in_a_traceback(tmp_path_factory, source, chosen, values, grads):
    args = {"--seq-len": "8", "--batch": "2"}
    for opt in chosen:
        args[opt] = values.draw(AUDIT_OPTIONS[opt], label=opt)
    folder = tmp_path_factory.mktemp("audit")
    out, (model, doc) = folder / "run", source
    if doc is not None:
        (folder / "config.json").write_text(json.dumps(doc))
        model = [str(folder / "config.json") if a == "CONFIG" else a for a in model]
    argv = [
        "audit",
        *model,
        *itertools.chain.from_iterable(args.items()),
        *([] if grads else ["--no-grads"]),
        "--out",
        str(out),
        "-q",
    ]
    res = invoke(argv, args)
    doc = check_outcome(res, out, argv, ok=(0, 3))
    if doc is not None and res.exit_code in (0, 3):
        assert (out / "weights.csv").is_file() and (out / "audit.md").is_file(), argv
        assert (res.exit_code == 3) == (doc["n_deviating"] > 0), argv
        assert_rendered(out, args, argv)


# --- sweep ----------------------------------------------------------------------------

SWEEP_TINY = [*tiny(batch=1, vocab=16), "--device", "cpu"]
SWEEP_COMMANDS = {
    "variance": ["--layers", "2"],
    "grad-norms": ["--layers", "2"],
    "depth-sweep": ["--layers", "1,2", "--seeds", "1", "--no-grads"],
    "lr-sweep": [
        "--layers",
        "1",
        "--steps",
        "2",
        "--lr",
        "1e-3,1e-2",
        "--eval-batches",
        "1",
        "--probe-points",
        "0",
    ],
    "coord-check": ["--layers", "1", "--steps", "1", "--seeds", "1"],
}


def test_every_sweepable_command_is_fuzzed():
    """A command made sweepable (cli.registry) fails here until it has its tiny arguments."""
    assert sorted(SWEEP_COMMANDS) == sorted(SWEEPABLE)


SWEEP_OPTIONS = {
    "--init": st.sampled_from(["naive", "scaled", "rezero", "zero-out,deepnet", "bogus"]),
    "--norm-position": st.sampled_from(["pre", "post,none", "sideways"]),
    "--layers": st.sampled_from(["1", "3", "0", "1,1", "x"]),
    "--sigma": st.sampled_from(["0.02", "1e30", "0"]),
    "--dtype": st.sampled_from(["float32", "bfloat16", "int8"]),
    "--workers": st.sampled_from(["1", "2", "0"]),
    "--partition": st.sampled_from(["gpu"]),
    "--slurm-arg": st.sampled_from(["x=1", "bad"]),
    "--format": st.sampled_from(["png", "svg", "gif"]),
}


#: the in-process sweeps' workers come from one preloaded fork server (conftest)
pytestmark = pytest.mark.usefixtures("shared_fork_server")


def hurt_a_worker(fault: str, server: int, hurt: list[int]) -> None:
    """Hurt one of the fork server's workers (appended to ``hurt``): SIGKILL it, or cut its
    address space to what it uses now so its next allocation fails (an out-of-memory
    worker)."""
    for pid in children_of(server)[:1]:
        try:
            if fault == "kill":
                os.kill(pid, signal.SIGKILL)
            else:
                status = Path(f"/proc/{pid}/status").read_text().splitlines()
                size = int(next(line.split()[1] for line in status if line.startswith("VmSize:"))) * 1024
                resource.prlimit(pid, resource.RLIMIT_AS, (size + 2**20, size + 2**20))
            hurt.append(pid)
        except (OSError, StopIteration):
            pass


def check_sweep(res, out: Path, argv) -> None:
    doc = check_outcome(res, out, argv)
    if doc is None:
        return
    counts = doc["sweep"]["counts"]
    assert counts["queued"] == counts["running"] == 0, (argv, counts)
    assert counts["done"] + counts["failed"] == len(doc["sweep"]["points"]), argv
    assert (res.exit_code == 0) == (counts["failed"] == 0), (argv, counts)


# 3 sweeps (each accepted one starts a fork server and a worker process: seconds) of a
# random command with 1 to 3 of the 9 options. Without an option the call is the command's
# tiny grid, which tests/test_sweep_equals_run.py sweeps for every command (on two workers),
# and which Hypothesis would otherwise spend its first example on every time
@settings(
    max_examples=3,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    command=st.sampled_from(sorted(SWEEP_COMMANDS)),
    chosen=st.lists(st.sampled_from(sorted(SWEEP_OPTIONS)), max_size=3, unique=True),
    values=st.data(),
)
def test_sweep_never_ends_in_a_traceback(tmp_path_factory, monkeypatch, command, chosen, values):
    assume(chosen)  # (not min_size=1: Hypothesis's first example would be the same each run)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    args = {"--workers": "1"}
    for opt in chosen:
        args[opt] = values.draw(SWEEP_OPTIONS[opt], label=opt)
    out = tmp_path_factory.mktemp("sweep") / "run"
    argv = [
        "sweep",
        command,
        *SWEEP_TINY,
        *SWEEP_COMMANDS[command],
        *itertools.chain.from_iterable(args.items()),
        "--out",
        str(out),
        "-q",
    ]
    res = invoke(argv, args)
    check_sweep(res, out, argv)
    if res.exit_code == 0:
        assert_rendered(out, args, argv)


@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs resource.prlimit (Linux)")
@pytest.mark.parametrize("fault", ["memory"])  # (a killed worker: tests/test_hostile_sweep.py)
def test_sweep_with_a_fault_in_a_worker(tmp_path, monkeypatch, fault):
    """A worker killed, or left without memory, while the points run: the sweep still ends
    in a documented way, every point done or failed, the rows of the done points merged."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "run"
    argv = [
        "sweep",
        "depth-sweep",
        *SWEEP_TINY,
        "--layers",
        "1,2,4,8",
        "--seeds",
        "2",
        "--pre-norm",  # 16 points
        "--no-grads",
        "--workers",
        "2",
        "--out",
        str(out),
        "-q",
    ]
    hurt, server = [], start_fork_server()
    figures_built_not_saved(monkeypatch)  # (what is tested is the points and their rows)
    # at the first point done, 15 still to run
    at_sweep_update(
        monkeypatch, lambda counts: counts["done"] >= 1, lambda: hurt_a_worker(fault, server, hurt)
    )
    res = runner.invoke(app, argv)
    assert hurt, "no worker was hurt while the points ran"
    check_sweep(res, out, argv)
    doc = json.loads((out / "config.json").read_text())
    failed = [p["reason"] for p in doc["sweep"]["points"].values() if p["state"] == "failed"]
    if fault == "kill":  # only the point the killed worker was running
        assert len(failed) <= 1 and all("killed by SIGKILL" in r for r in failed), failed
    else:  # the points the starved worker takes fail for memory (or it dies); the others do not
        assert all("memory" in r or "worker process" in r for r in failed), failed
        assert len(failed) < len(doc["sweep"]["points"])
    rows = (out / "depth_sweep.csv").read_text().count("\n") - 1
    assert rows == doc["sweep"]["counts"]["done"]
