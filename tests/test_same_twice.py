"""Issue 30, "the same command gives the same answer": every command of the registry
(tinit.cli.registry.COMMANDS), run twice with the same seed into two --out folders,
writes the same numbers in every CSV. `audit --hf` drew its as-built weights from an
unseeded generator (three runs of one command gave v_2L = 2.077, 2.023, 1.992).

depth-sweep, lr-sweep, coord-check and sweep itself are run twice by
tests/test_sweep_equals_run.py instead: each is run once in this process and once as a
sweep whose points run in worker processes (another generator state, had anything been
drawn unseeded), and the two folders' CSVs must be the same bytes (less the wall-clock
columns). variance and grad-norms are run twice here too, at other schemes (gpt2, mup).

The figures are not drawn (:func:`_no_drawing`). The only columns left out are
wall-clock measurements, found by name (:data:`TIMING`): ``*_s`` (seconds;
``tokens_per_s``), ``*seconds`` (``train_seconds``), ``mfu`` (a throughput), ``*_ms``
with its ``_min`` and ``_max`` (milliseconds), ``time_ratio*`` (a ratio of two timings)
and ``calls_per_sample`` (how many calls fill one timed sample: calibrated against the
clock). `tinit norms` measures timings: its other columns (the behaviour checks, the
saved bytes, the parameter counts) are compared."""

import importlib.util
import re
from pathlib import Path

import pandas as pd
import pytest
from helpers import click_command, final_result_only
from typer.testing import CliRunner

from tinit.cli import app
from tinit.cli.registry import COMMANDS, SWEEPABLE

runner = CliRunner()  # (its click command built once: conftest)
HERE = Path(__file__).resolve().parent
MODELS = str(HERE / "audit_models.py")
NEEDS_HF = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")

#: Wall-clock columns, by name: the only ones two runs may disagree on.
TIMING = re.compile(r".*_s|.*seconds|mfu|.*_ms(_min|_max)?|time_ratio(_min)?|calls_per_sample")

M = ["--d-model", "32", "--heads", "2", "--seq-len", "16", "--batch", "2", "--vocab", "64"]
TRAIN = ["--d-model", "16", "--heads", "2", "--seq-len", "8", "--batch", "2", "--vocab", "16",
         "--eval-batches", "1"]  # fmt: skip
GPT2 = ["--hf", "gpt2", *[x for s in ("n_layer=2", "n_embd=32", "n_head=2", "vocab_size=64", "n_positions=16")
                          for x in ("--set", s)]]  # fmt: skip

#: Each command at a tiny size (and, where it has them, a user's scheme beside a catalogue one).
RUNS = {
    "variance": ["variance", *M, "--layers", "2", "--init", "gpt2,mup"],
    "grad-norms": ["grad-norms", *M, "--layers", "2"],
    "attention-scale": [
        "attention-scale",
        "--heads",
        "2",
        "--seq-len",
        "16",
        "--batch",
        "2",
        "--vocab",
        "64",
        "--head-dims",
        "8,16",
    ],  # fmt: skip
    "norms": [
        "norms",
        "--rows",
        "8",
        "--d-model",
        "16,32",
        "--repeats",
        "2",
        "--warmup",
        "0",
        "--no-compile",
    ],  # fmt: skip
    "params": ["params", "--layers", "2", "--d-model", "32", "--heads", "2", "--vocab", "64"],
    "check": ["check", *M, "--layers", "2", "--deep-layers", "4", "--head-dims", "8,16"],
    "train": ["train", *TRAIN, "--layers", "2", "--steps", "2", "--eval-every", "1", "--init", "mup"],
    "claims": ["claims", *TRAIN, "--shallow", "1", "--deep", "2", "--seeds", "2", "--steps", "2"],
    "inits": ["inits", "mup", "--layers", "2", "--d-model", "32", "--heads", "2"],
    "audit": ["audit", *GPT2, "--seq-len", "8", "--batch", "2"],
}


@pytest.fixture(autouse=True)
def _no_drawing(monkeypatch):
    """The figures are built but not drawn (drawing is most of a tiny run's time, and
    this test compares numbers: the CSVs)."""
    import matplotlib.pyplot as plt

    from tinit.results import plots

    def save_figure(fig, run_dir, stem, formats=("png",)):
        plt.close(fig)
        return []

    monkeypatch.setattr(plots, "save_figure", save_figure)


@pytest.fixture(autouse=True)
def _final_result_only(monkeypatch):
    """The CSVs compared are the finished run's: the result so far is not re-assembled and
    re-written after every unit (claims: 18 units), which the final one replaces
    (helpers.final_result_only; the partial results' tests: tests/test_run_promises.py)."""
    final_result_only(monkeypatch)


#: Run twice by tests/test_sweep_equals_run.py: once here, once as a sweep's points in
#: worker processes, the two folders' CSVs equal (sweep itself: its output equals the run's).
TWICE_AS_A_SWEEP = {"depth-sweep", "lr-sweep", "coord-check", "sweep"}


def test_every_command_is_run_twice():
    assert set(RUNS) | TWICE_AS_A_SWEEP == {c.name for c in COMMANDS}
    assert TWICE_AS_A_SWEEP - {"sweep"} <= set(SWEEPABLE)


def frames(folder: Path) -> dict[str, pd.DataFrame]:
    """Every CSV of a run folder (points/ of a sweep included), timing columns left out."""
    out = {}
    for path in sorted(folder.rglob("*.csv")):
        df = pd.read_csv(path, keep_default_na=False, dtype=str)
        out[str(path.relative_to(folder))] = df[[c for c in df.columns if not TIMING.fullmatch(c)]]
    return out


def takes_seed(command: str) -> bool:
    """Whether the command has --seed (params and inits draw nothing)."""
    return any("--seed" in p.opts for p in click_command(app).commands[command].params)


def run_twice(tmp_path: Path, argv: list[str]) -> tuple[dict, dict]:
    seed = ["--seed", "3"] if takes_seed(argv[0]) else []
    got = []
    for name in ("first", "second"):
        res = runner.invoke(app, [*argv, *seed, "-q", "--out", str(tmp_path / name)])
        assert res.exit_code in (0, 1, 3), res.output  # check (1) and audit (3) may find faults
        assert "Traceback" not in res.output
        got.append(frames(tmp_path / name))
    return got[0], got[1]


def assert_same(first: dict, second: dict) -> None:
    assert first and first.keys() == second.keys()
    for name, df in first.items():
        pd.testing.assert_frame_equal(df, second[name], check_exact=True, obj=name)


@pytest.mark.parametrize(
    "command", [pytest.param(c, marks=NEEDS_HF) if c == "audit" else c for c in RUNS]
)  # fmt: skip
def test_the_same_command_writes_the_same_numbers(tmp_path, command):
    assert_same(*run_twice(tmp_path, RUNS[command]))


def test_audit_module_is_seeded_too(tmp_path):
    """A factory that draws its weights from torch's global generator (nn.Linear's own
    init) gives the same model, and the same numbers, at the same --seed; another seed
    another model."""
    argv = ["audit", "--module", f"{MODELS}:TinyLM", "--seq-len", "8", "--batch", "2"]
    first, second = run_twice(tmp_path, argv)
    assert_same(first, second)
    res = runner.invoke(app, [*argv, "--seed", "4", "-q", "--out", str(tmp_path / "other")])
    assert res.exit_code in (0, 3), res.output
    assert not frames(tmp_path / "other")["weights.csv"].equals(first["weights.csv"])


@NEEDS_HF
def test_audit_leaves_the_callers_random_state_as_it_was():
    import torch

    from tinit.experiments.audit.loaders import load_hf

    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    sets = {"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 32, "n_positions": 8}
    a = load_hf("gpt2", sets, torch.device("cpu"), torch.float32, seed=5)
    assert torch.equal(torch.rand(3), expected)
    b = load_hf("gpt2", sets, torch.device("cpu"), torch.float32, seed=5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
