"""A sweep equals the single run, for every sweepable command (cli/registry.SWEEPABLE):
`tinit sweep COMMAND ARGS` (its points on two local workers, or as one SLURM array task
on a real one-node cluster) writes the very CSVs `tinit COMMAND ARGS` writes in this
process, byte for byte (less the wall-clock columns, which no two runs share), and the
same non-finite counts in config.json. Each command runs its tiny grid: a user's scheme
from --init-file (docs/reference/inits.md's example) and schemes whose branches pass no
gradient (rezero, zero-out) where the command takes them, whose empty (not applicable)
cells must come back empty from the points' CSVs. The figures are left out on both sides
(drawing them is most of these tiny runs' time; tests/test_sweep.py checks a sweep's
figure)."""

import json
import re
from pathlib import Path

import pytest
from helpers import ROOT, slurm_polls_every
from typer.testing import CliRunner

import tinit.cli.runner
import tinit.results.writer
from tinit.cli import app
from tinit.cli.registry import SWEEPABLE

runner = CliRunner()
SIZE = ["--heads", "2", "--seq-len", "8", "--batch", "2", "--vocab", "16", "--device", "cpu"]
#: the user's scheme: docs/reference/inits.md's --init-file example (per-layer std, a
#: truncated and a uniform role, its own structure), which must reach the workers whole
USER = re.search(r"```toml\n(.*?)```", (ROOT / "docs" / "reference" / "inits.md").read_text(), re.S).group(1)
SCHEMES = ["--init", "naive,rezero,zero-out,per-layer-gpt2", "--init-file", "{scheme_file}"]
#: each sweepable command's tiny grid, and its number of points
CASES = {
    "depth-sweep": (
        [
            "--d-model",
            "16",
            *SIZE,
            "--layers",
            "1,2",
            "--seeds",
            "2",
            "--init",
            "naive,per-layer-gpt2",
            "--init-file",
            "{scheme_file}",
            "--pre-norm",
        ],
        2 * 2 * 2,
    ),  # fmt: skip
    "variance": (["--d-model", "16", *SIZE, "--layers", "2", *SCHEMES, "--pre-norm"], 4),
    "grad-norms": (["--d-model", "16", *SIZE, "--layers", "2", *SCHEMES, "--pre-norm"], 4),
    "lr-sweep": (
        [
            "--init",
            "gpt2",
            "--pre-norm",
            "--base-width",
            "16",
            "--d-model",
            "16",
            *SIZE,
            "--layers",
            "1,2",
            "--steps",
            "2",
            "--seeds",
            "1",
            "--lr",
            "1e-2,3e-2",
            "--probe-points",
            "2",
            "--eval-every",
            "2",
            "--eval-batches",
            "1",
        ],
        2 * 2,
    ),  # fmt: skip
    "coord-check": (
        ["--init", "mup", "--d-model", "16,32", "--layers", "1,2", "--seeds", "1", "--steps", "1", *SIZE],
        2 * 2,
    ),  # fmt: skip
}
#: measured wall-clock: differs between any two runs of the same grid
TIMED = re.compile(r"train_seconds|tokens_per_s|model_flops_per_s")


def test_every_sweepable_command_has_a_case():
    assert sorted(CASES) == sorted(SWEEPABLE)


def _args(command: str, tmp_path: Path) -> list[str]:
    (tmp_path / "mine.toml").write_text(USER)
    return [command, *(a.format(scheme_file=tmp_path / "mine.toml") for a in CASES[command][0]), "-q"]


def _untimed(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    keep = [i for i, c in enumerate(lines[0].split(",")) if not TIMED.fullmatch(c)]
    return [",".join(row.split(",")[i] for i in keep) for row in lines]


def _same_run(one: Path, swept: Path, points: int) -> None:
    csvs = sorted(p.name for p in one.glob("*.csv"))
    assert csvs and csvs == sorted(p.name for p in swept.glob("*.csv"))
    for name in csvs:
        if (one / name).read_bytes() != (swept / name).read_bytes():  # only the timings may differ
            assert _untimed(one / name) == _untimed(swept / name), name
    a, b = (json.loads((d / "config.json").read_text()) for d in (one, swept))
    assert a["complete"] is True and b["complete"] is True, b.get("error")
    assert (a["non_finite"], a["non_finite_total"]) == (b["non_finite"], b["non_finite_total"])
    assert b["sweep"]["counts"]["done"] == points == len(b["sweep"]["points"])


@pytest.fixture(autouse=True)
def no_figures(monkeypatch):
    """The one writer (tinit.results.writer), both callers, without the figures."""
    real = tinit.results.writer.write_result

    def write_result(run_dir, command, result, figures, *args, **kwargs):
        return real(run_dir, command, result, lambda r: {}, *args, **kwargs)

    monkeypatch.setattr(tinit.results.writer, "write_result", write_result)
    monkeypatch.setattr(tinit.cli.runner, "write_result", write_result)


#: the in-process sweeps' workers come from one preloaded fork server (conftest)
pytestmark = pytest.mark.usefixtures("shared_fork_server")


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """`tinit COMMAND` in this process (one thread, conftest), once per command."""
    done: dict[str, Path] = {}

    def run(command: str) -> Path:
        if command not in done:
            base = tmp_path_factory.mktemp(command)
            res = runner.invoke(app, [*_args(command, base), "--out", str(base / "one")])
            assert res.exit_code == 0, res.output
            assert not list((base / "one").glob("*.png"))  # (drawn by neither side)
            done[command] = base / "one"
        return done[command]

    return run


@pytest.mark.parametrize("command", SWEEPABLE)
def test_a_local_sweep_writes_the_single_runs_csvs(tmp_path, single, monkeypatch, command):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the workers' threads, as this process's
    args = ["sweep", *_args(command, tmp_path), "--workers", "2"]
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    _same_run(single(command), tmp_path / "s", CASES[command][1])


#: The SLURM backend end to end (a real sbatch array, its points merged): one command
#: here, the one whose grid carries a user's --init-file scheme and not-applicable cells
#: through the tasks; tests/test_sweep.py runs depth-sweep as a real array (a task
#: cancelled, --resume, the merged CSVs equal to the single run's). The sweep's points run
#: one code path whatever the executor (tinit.sweep.worker), which the local sweeps above
#: run for every command. (Each sbatch round trip costs seconds.)
SLURM_CASES = ["variance"]


@pytest.mark.parametrize("command", SLURM_CASES)
def test_a_slurm_sweep_writes_the_single_runs_csvs(tmp_path, single, slurm_cluster, monkeypatch, command):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    slurm_polls_every(monkeypatch, 0.1)
    n = CASES[command][1]
    args = ["sweep", *_args(command, tmp_path), "--executor", "slurm", "--points-per-job", str(n)]
    args += ["--time", "5"]
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    _same_run(single(command), tmp_path / "s", n)
    sweep = json.loads((tmp_path / "s" / "config.json").read_text())["sweep"]
    assert sweep["executor"] == "slurm" and len(sweep["job_ids"]) == 1
