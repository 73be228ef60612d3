"""What a run folder records matches what ran and what docs/run-folders.md promises: the PNG
beside any --format, config.json = result.meta plus the invocation, the grid of
configurations (not one misleading value), and --threads."""

import json

import pytest
import torch
from helpers import figures_built_not_saved, tiny
from typer.testing import CliRunner

from tinit import InitConfig, ModelConfig, RunConfig, run_variance
from tinit.cli import app
from tinit.cli.registry import COMMANDS

runner = CliRunner()
TINY = tiny(2)  # the tiny model at 2 layers
ONE = [*TINY, "--pre-norm", "--init", "naive"]  # one configuration

#: config.json's keys that describe the invocation or the outcome, not the run's settings
#: (docs/library.md names them); everything else is result.meta.
INVOCATION = {
    "command", "argv", "created", "git_commit", "host", "pid", "complete", "error", "non_finite",
    "non_finite_total",
}  # fmt: skip
#: measured costs: differ between two runs of the same settings
COSTS = {"seconds", "peak_rss_mib", "rss_mib", "peak_gpu_memory_gib"}


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _config(out):
    return json.loads((out / "config.json").read_text())


def test_format_pdf_alone_still_writes_the_png(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["variance", *ONE, "--format", "pdf", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "variance.png").is_file() and (out / "variance.pdf").is_file()
    assert not (out / "variance.svg").exists()


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory):
    """`variance` over its default grid (2 schemes x 2 placements), run once for the tests
    of its config.json."""
    out = tmp_path_factory.mktemp("grid") / "run"
    with pytest.MonkeyPatch.context() as mp:
        figures_built_not_saved(mp)  # (config.json is read; the PNG beside --format is drawn above)
        res = runner.invoke(app, ["variance", *TINY, "--threads", "1", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def test_config_json_is_result_meta_plus_the_invocation(grid_run):
    cfg = _config(grid_run)
    meta = run_variance(
        ModelConfig(n_layers=2, d_model=16, n_heads=2, vocab_size=32, max_seq_len=8),
        InitConfig(),
        RunConfig(batch=2, seq_len=8),
    ).meta
    meta = json.loads(json.dumps(meta))  # as JSON has it (tuples -> lists)
    assert set(cfg) - INVOCATION == set(meta)
    for key in set(meta) - COSTS:
        assert cfg[key] == meta[key], key


def test_grid_is_recorded_as_the_grid(grid_run, tmp_path, monkeypatch):
    figures_built_not_saved(monkeypatch)
    cfg = _config(grid_run)
    grid = [["naive", "pre"], ["scaled", "pre"], ["naive", "post"], ["scaled", "post"]]
    assert cfg["configurations"] == grid
    assert cfg["init"]["scheme"] == ["naive", "scaled"]
    assert cfg["model"]["norm_position"] == ["pre", "post"]
    one = tmp_path / "one"
    args = ["variance", *TINY, "--init", "scaled", "--post-norm", "-o", str(one)]
    assert runner.invoke(app, args).exit_code == 0
    cfg = _config(one)
    assert cfg["init"]["scheme"] == "scaled" and cfg["model"]["norm_position"] == "post"


def test_threads_option_sets_and_records_torch_threads(tmp_path, monkeypatch):
    figures_built_not_saved(monkeypatch)
    torch.set_num_threads(1)
    res = runner.invoke(app, ["variance", *ONE, "--threads", "2", "-o", str(tmp_path / "two")])
    assert res.exit_code == 0, res.output
    assert _config(tmp_path / "two")["torch_threads"] == 2
    # the default: 1 without OMP_NUM_THREADS, whatever torch had
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert runner.invoke(app, ["variance", *ONE, "-o", str(tmp_path / "default")]).exit_code == 0
    assert _config(tmp_path / "default")["torch_threads"] == 1
    res = runner.invoke(app, ["variance", *TINY, "--threads", "0"])
    assert res.exit_code == 2 and "--threads" in res.stderr and "Traceback" not in res.output


#: every command but sweep, which passes its options on to the command it sweeps
@pytest.mark.parametrize("command", [c.name for c in COMMANDS if not c.passes_options])
def test_every_command_has_threads(command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    assert "--threads" in runner.invoke(app, [command, "-h"]).output
