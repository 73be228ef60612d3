"""What a run promises (docs/run-folders.md, "What a run promises"), each numbered case of issue 10
reproduced: exclusive run folders, rows on disk as they are measured, every stop
(SIGINT, SIGTERM, SIGHUP, a second SIGINT while writing, out of memory, a full disk)
keeping the rows and marking the run incomplete, and non-finite numbers flagged."""

import errno
import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer
from helpers import ROOT, assert_one_line_error, figures_built_not_saved, signalled_run
from typer.testing import CliRunner

from tinit.cli import app
from tinit.cli.configs import Options
from tinit.cli.registry import COMMANDS
from tinit.cli.runner import Outputs, RunWriter, execute
from tinit.experiments import memory
from tinit.experiments.measure.grad_norms import _tensor_stats
from tinit.experiments.measure.variance import run_variance
from tinit.experiments.result import ExperimentResult, IncompleteRun, is_out_of_memory
from tinit.model.config import ModelConfig, RunConfig
from tinit.results import rundir
from tinit.results.rundir import FolderTaken, claim_run_dir, format_frame, non_finite_counts
from tinit.results.tables import fmt

runner = CliRunner()  # (its click command built once: conftest)
S = ["--layers", "2", "--d-model", "32", "--heads", "2", "--seq-len", "8", "--batch", "1", "--vocab", "16"]
TINY_MODEL = ModelConfig(n_layers=2, d_model=32, n_heads=2, vocab_size=16)


def config(out: Path) -> dict:
    return json.loads((out / "config.json").read_text())


def options(out: Path) -> Options:
    return Options({"out": out, "quiet": True, "format": ["png"], "device": "cpu"})


def frame(n: int) -> pd.DataFrame:
    return pd.DataFrame({"init": ["naive"] * n, "norm_position": ["pre"] * n, "x": np.arange(n, dtype=float)})


def run_fake(out: Path, experiment, outputs: Outputs | None = None):
    """execute() on a made-up experiment; returns the exit code (0 when it returned)."""
    try:
        execute("fake", options(out), experiment, outputs or Outputs())
    except typer.Exit as exc:
        return exc.exit_code
    return 0


# --- 1. exclusive run folders ---


def test_claim_is_exclusive_under_a_race(tmp_path):
    out, wins, taken = tmp_path / "late", [], []

    def claim():
        try:
            wins.append(claim_run_dir("variance", out))
        except FolderTaken:
            taken.append(1)

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(taken) == 7
    assert config(out)["complete"] is False  # claimed: says incomplete from the first moment


def test_claim_takes_an_existing_empty_folder_once(tmp_path):
    claim_run_dir("variance", tmp_path)
    with pytest.raises(FolderTaken):
        claim_run_dir("variance", tmp_path)


def test_second_run_into_a_claimed_folder_is_refused(tmp_path):
    out = tmp_path / "late"
    claim_run_dir("variance", out)  # a first run that is still measuring
    res = runner.invoke(app, ["variance", *S, "-q", "--out", str(out)])
    assert_one_line_error(res, "--out")
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]  # the first run's folder untouched


def test_out_with_an_overlong_name_is_one_line(tmp_path):
    res = runner.invoke(app, ["variance", *S, "-q", "--out", str(tmp_path / ("a" * 300))])
    assert_one_line_error(res, "--out")


# --- 2, 8. rows written as measured; every stop handled alike ---


def fake_clock(monkeypatch) -> list[float]:
    """The writer's clock, moved by hand: ``now[0]`` seconds."""
    now = [0.0]
    monkeypatch.setattr(RunWriter, "clock", staticmethod(lambda: now[0]))
    return now


def built(now: list[float], n: int):
    """The result so far of n units, as the driver hands it over; building it takes 1 s."""

    def so_far() -> ExperimentResult:
        now[0] += 1
        return ExperimentResult({"rows": frame(n)}, {}, False)

    return so_far


def test_rows_are_on_disk_as_they_are_measured(tmp_path, monkeypatch):
    """The first unit's rows at once; later ones when the time since the last write is
    ten times what it cost (building the frames: 1 s on a fake clock), not before."""
    out, seen, now = tmp_path / "run", [], fake_clock(monkeypatch)

    def experiment(progress, on_partial):
        for n, wait in ((1, 0), (2, 9), (3, 1)):  # written at 0-1 s, due again at 11 s
            now[0] += wait
            on_partial(built(now, n))
            seen.append((len(pd.read_csv(out / "rows.csv")), config(out)["complete"]))
        return ExperimentResult({"rows": frame(4)}, {})

    assert run_fake(out, experiment) == 0
    assert seen == [(1, False), (1, False), (3, False)]
    assert len(pd.read_csv(out / "rows.csv")) == 4 and config(out)["complete"] is True
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary files left


@pytest.mark.parametrize("stop", ["SIGTERM", "error"])
def test_a_stop_between_writes_writes_every_finished_unit(tmp_path, monkeypatch, stop):
    """A unit finished but not yet written (its write not due) is in the files a stop
    writes: a signal between units, or tinit's own error."""
    out, now = tmp_path / "run", fake_clock(monkeypatch)

    def experiment(progress, on_partial):
        for n in (1, 2, 3):  # the first written at 0-1 s; the next due at 11 s
            on_partial(built(now, n))
        assert len(pd.read_csv(out / "rows.csv")) == 1
        if stop == "error":
            raise ValueError("a bug")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here
        raise AssertionError("not stopped")

    assert run_fake(out, experiment) == 1
    assert len(pd.read_csv(out / "rows.csv")) == 3
    doc = config(out)
    assert doc["complete"] is False
    assert (
        doc["error"] == "stopped by SIGTERM"
        if stop == "SIGTERM"
        else doc["error"].startswith("internal error")
    )


def test_the_rows_on_disk_cost_a_bounded_share_of_the_run(tmp_path, monkeypatch):
    """2,000 units of 1 s under the run driver (a fake clock), building the frames of k
    units costing 0.01 k s (fits and summaries grow with the rows). A write after every
    unit built n(n + 1)/2 = 2,001,000 rows and spent 20,010 s writing against 2,000 s
    measuring. Now the writing is at most a tenth of the time between the first write
    and the last, so the rows built grow linearly; the first unit is written at once,
    and the units a hard kill could lose (finished since the last write) took at most ten
    times that write's cost."""
    from tinit.experiments.driver import Run

    out, now, n = tmp_path / "run", fake_clock(monkeypatch), 2000
    rows: list[int] = []
    builds: list[tuple[float, int]] = []  # (when, units in it) of each build

    def assemble():
        builds.append((now[0], len(rows)))
        now[0] += 0.01 * len(rows)
        return {"rows": frame(len(rows))}

    def experiment(progress, on_partial):
        driver = Run({}, assemble, on_partial=on_partial, total=n)

        def measure(i):
            now[0] += 1.0
            return i

        driver.each(range(n), measure, lambda i, v: rows.append(v), label=str)
        return driver.result()

    assert run_fake(out, experiment) == 0
    assert len(pd.read_csv(out / "rows.csv")) == n and config(out)["complete"] is True
    written = builds[:-1]  # (the last is the final result's)
    assert written[0] == (1.0, 1)
    cost = [0.01 * k for _, k in written]
    assert sum(cost[:-1]) <= (written[-1][0] - written[0][0]) / 10
    built = sum(k for _, k in written)
    assert built <= 15 * n and len(written) < 100, (built, len(written))
    for (_, k), (_, k_next), c in zip(written[:-1], written[1:], cost[:-1], strict=True):
        assert (k_next - k - 1) * 1.0 <= 10 * c * (1 + 1e-9)  # finished since a write, not yet written


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP, signal.SIGTERM])
def test_a_stopping_signal_keeps_the_rows(tmp_path, capsys, sig):
    out = tmp_path / "run"

    def experiment(progress, on_partial):
        on_partial(lambda: ExperimentResult({"rows": frame(2)}, {}, False))
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the handler raises here
        raise AssertionError("not stopped")

    assert run_fake(out, experiment) == 1
    assert len(pd.read_csv(out / "rows.csv")) == 2
    doc = config(out)
    assert doc["complete"] is False and doc["error"] == f"stopped by {sig.name}"
    err = capsys.readouterr().err
    assert f"stopped by {sig.name}" in err and str(out) in err
    assert signal.getsignal(sig) is not None  # handlers are put back


def test_second_ctrl_c_while_writing_stops_the_writing_and_marks_incomplete(tmp_path, capsys):
    out = tmp_path / "run"

    def figures(result):
        os.kill(os.getpid(), signal.SIGINT)  # arrives while the files are being written
        return {"a": _figure(), "b": _figure()}

    res = run_fake(
        out, lambda progress, on_partial: ExperimentResult({"rows": frame(2)}, {}), Outputs(figures=figures)
    )
    assert res == 1
    assert (out / "rows.csv").exists() and not (out / "a.png").exists()
    doc = config(out)
    assert doc["complete"] is False and doc["error"].startswith("stopped by SIGINT while writing")
    assert str(out) in capsys.readouterr().err


def _figure():
    from matplotlib.figure import Figure

    fig = Figure()
    fig.subplots().plot([0, 1])
    return fig


def test_sigterm_keeps_the_measured_depth_sweep_points(tmp_path):
    """Issue case 2 with the real command: a SIGTERM mid-sweep keeps every finished
    point, says why and where, exits 1. The process sends it to itself right after its
    first rows are on disk (200 points: 4 configurations x depths 1..50), an event of the
    run, not a guess at its pace."""
    out = tmp_path / "sweep"
    args = ["depth-sweep", "--layers", "1:50", "--no-grads", "--seeds", "1", "-q", "--out", str(out), *S[2:]]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc, stdout, stderr = signalled_run(args, env, "SIGTERM", "rows", 1, figures=True)
    assert proc.returncode == 1, stderr
    assert "stopped by SIGTERM" in stderr and "Traceback" not in stderr
    assert stdout.strip() == str(out)
    sweep = pd.read_csv(out / "depth_sweep.csv")
    # one row per finished point (L, seed, scheme, placement), each once: at least the
    # first write's, not all 200
    assert 1 <= len(sweep) < 200
    assert not sweep.duplicated(["init", "norm_position", "n_layers", "seed"]).any()
    assert config(out)["complete"] is False


def test_a_sigterm_mid_sweep_keeps_every_finished_point(tmp_path, monkeypatch):
    """The real command, in process: a SIGTERM while the 10th of 24 depth-sweep points
    runs keeps the 9 finished ones, each once, though only the first was on disk when the
    signal came (the writer's interval made 1e9 times a write's cost)."""
    from tinit.cli import runner as cli_runner
    from tinit.experiments import driver

    out, real, started, on_disk = tmp_path / "sweep", driver.run_point, [], []
    monkeypatch.setattr(cli_runner, "PARTIAL_INTERVAL", 1e9)
    figures_built_not_saved(monkeypatch)

    def run_point(point, progress=None):
        started.append(point.name)
        if len(started) == 10:
            on_disk.append(len(pd.read_csv(out / "depth_sweep.csv")))
            os.kill(os.getpid(), signal.SIGTERM)
        return real(point, progress)

    monkeypatch.setattr(driver, "run_point", run_point)
    args = ["depth-sweep", *S[2:], "--layers", "1:6", "--no-grads", "--seeds", "1", "-q", "--out", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 1 and "stopped by SIGTERM" in res.stderr, res.output
    assert on_disk == [1] and len(started) == 10
    sweep = pd.read_csv(out / "depth_sweep.csv")
    names = [f"L{r.n_layers}-seed{r.seed}-{r.init}-{r.norm_position}" for r in sweep.itertuples()]
    assert sorted(names) == sorted(started[:9])
    assert config(out)["complete"] is False


# --- 3. out of memory on the CPU ---


def test_cpu_allocator_failure_is_out_of_memory_and_keeps_rows(monkeypatch):
    import tinit.experiments.measure.variance as variance

    real, calls = variance.Transformer, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory")
        return real(*args, **kwargs)

    monkeypatch.setattr(variance, "Transformer", failing)
    with pytest.raises(IncompleteRun) as info:
        run_variance(TINY_MODEL, run=RunConfig(2, 8, "cpu"))
    res = info.value.result
    assert res.error == "out of memory" and res.complete is False
    assert len(res["summary"]) == 2  # the two configurations before the failure


def test_other_runtime_errors_are_not_swallowed(monkeypatch):
    import tinit.experiments.measure.variance as variance

    monkeypatch.setattr(variance, "Transformer", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("bug")))
    with pytest.raises(RuntimeError, match="bug"):
        run_variance(TINY_MODEL, run=RunConfig(2, 8, "cpu"))


def test_memory_error_counts_as_out_of_memory():
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("shape mismatch"))


def test_host_memory_respects_rlimit_as(monkeypatch):
    import resource

    limit = 3 * 2**30
    monkeypatch.setattr(resource, "getrlimit", lambda which: (limit, resource.RLIM_INFINITY))
    vm = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            vm = int(line.split()[1]) * 1024
    assert memory.host_memory() <= max(limit - vm, 0) + 64 * 2**20  # the process grows a little meanwhile


def test_host_memory_respects_the_cgroup_limit(monkeypatch, tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job\n")
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "memory.max").write_text("1000000000\n")
    (tmp_path / "job" / "memory.current").write_text("400000000\n")
    monkeypatch.setattr(memory, "PROC_CGROUP", str(proc))
    monkeypatch.setattr(memory, "CGROUP_MOUNT", str(tmp_path))
    assert memory.host_memory() <= 600_000_000
    # cgroup v1, no limit: the huge number means none
    proc.write_text("4:memory:/job\n")
    (tmp_path / "memory" / "job").mkdir(parents=True)
    (tmp_path / "memory" / "job" / "memory.limit_in_bytes").write_text(str(2**63 - 4096))
    monkeypatch.setattr(memory, "_address_space_headroom", lambda: None)
    assert memory._cgroup_headroom() is None


def test_streaming_decision_follows_the_limit(monkeypatch):
    cfg = ModelConfig(n_layers=4, d_model=64, n_heads=2, vocab_size=16)
    cpu = memory.torch.device("cpu")
    need = 1_600_000  # a built pass of 4 blocks
    monkeypatch.setattr(memory, "_address_space_headroom", lambda: 10 * 2**30)
    assert not memory.should_stream(cfg, memory.torch.float32, cpu, None, need)
    monkeypatch.setattr(memory, "_address_space_headroom", lambda: 100_000)
    assert memory.should_stream(cfg, memory.torch.float32, cpu, None, need)
    # a forward without gradients streams on the CPU whatever the memory: it costs nothing
    monkeypatch.setattr(memory, "_address_space_headroom", lambda: 10 * 2**30)
    assert memory.should_stream(cfg, memory.torch.float32, cpu, None)
    assert not memory.should_stream(cfg, memory.torch.float32, cpu, False)


# --- 4, 5. non-finite numbers flagged, never blank, never a crash ---


def test_format_frame_tells_not_applicable_from_non_finite():
    df = pd.DataFrame({"k": [0, 1, 2, 3], "v": [np.nan, np.nan, np.inf, -np.inf], "w": [1.5, np.nan, 2, 3]})
    rules = {"v": lambda d: d["k"] == 0}
    text = format_frame(df, rules).to_csv(index=False).splitlines()
    assert text == ["k,v,w", "0,,1.5", "1,nan,nan", "2,inf,2", "3,-inf,3"]
    assert non_finite_counts({"f": df}, {"f": rules}) == {"f": {"all": 4}}


def test_variance_overflow_is_written_nan_counted_and_announced(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["variance", *S, "--sigma", "1e30", "-q", "--out", str(out)])
    assert res.exit_code == 0, res.output  # complete, with non-finite values: exit 0, flagged
    raw = pd.read_csv(out / "variance.csv", keep_default_na=False, dtype=str)
    assert (raw["stream_var"] == "nan").all()  # measured, not blank
    embed = raw[raw["k"] == "0"]
    assert (embed["branch_var"] == "").all()  # the embedding has no branch: not applicable
    doc = config(out)
    assert doc["complete"] is True and doc["non_finite_total"] > 0
    assert set(doc["non_finite"]["variance"]) == {"naive/pre", "scaled/pre", "naive/post", "scaled/post"}
    warnings = [line for line in res.stderr.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 1 and "not finite" in warnings[0] and "variance.csv" in warnings[0]


def test_normal_run_has_no_non_finite_values(tmp_path, monkeypatch):
    figures_built_not_saved(monkeypatch)  # (a healthy figure is rendered by the plot tests)
    out = tmp_path / "run"
    res = runner.invoke(app, ["variance", *S, "-q", "--out", str(out)])
    assert res.exit_code == 0 and "Warning" not in res.stderr
    assert config(out)["non_finite_total"] == 0
    raw = pd.read_csv(out / "summary.csv", keep_default_na=False, dtype=str)
    assert (raw.loc[raw["norm_position"] == "pre", "v_final_normed"] == "").all()


def test_inf_in_the_summary_table_does_not_crash(tmp_path, monkeypatch):
    figures_built_not_saved(monkeypatch)  # (variance's figure of overflowed values: rendered in bf16-huge)
    out = tmp_path / "run"
    M = ["--d-model", "64", "--heads", "2", "--seq-len", "16", "--batch", "2", "--vocab", "64"]
    res = runner.invoke(app, ["variance", "--sigma", "1e5", "--layers", "4", *M, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert " inf " in res.stdout and config(out)["complete"] is True
    assert fmt(float("inf")) == "inf" and fmt(float("-inf")) == "-inf" and fmt(float("nan")) == "-"


def test_max_layer_of_nan_gradients_is_nan_not_zero():
    grads = pd.DataFrame({"tensor": ["down"] * 3, "layer": [0, 1, 2], "grad_norm": [np.nan] * 3})
    assert np.isnan(_tensor_stats(grads, "down", "down")["down_max_layer"])
    grads["grad_norm"] = [1.0, 3.0, 2.0]
    assert _tensor_stats(grads, "down", "down")["down_max_layer"] == 1


# --- 6. accepted input never ends in a ZeroDivisionError ---

TINY_CHECK = [*S, "--deep-layers", "3", "--head-dims", "8"]


@pytest.mark.parametrize(
    "args",
    [
        ["variance", *S, "--sigma", "1e-30"],
        ["variance", *S, "--embed-std", "1e-30"],
        ["variance", *S, "--dtype", "bfloat16", "--sigma", "1e6", "--layers", "4"],
        ["attention-scale", *S[4:10], "--head-dims", "8", "--sigma", "1e30"],
        ["check", *TINY_CHECK, "--sigma", "1e30"],
        ["variance", *S, "--d-model", "1", "--heads", "1", "--positions", "none", "--norm", "layernorm"],
        ["depth-sweep", *S[2:], "--layers", "1,2", "--seeds", "1", "--sigma", "1e-30"],
        ["grad-norms", *S, "--dtype", "bfloat16", "--sigma", "1e6"],
    ],
    ids=["sigma-tiny", "embed-tiny", "bf16-huge", "attn-huge", "check-huge", "d1", "sweep-tiny", "grad-bf16"],
)
def test_vanishing_or_overflowing_numbers_are_flagged_not_a_traceback(tmp_path, monkeypatch, request, args):
    if request.node.callspec.id in ("embed-tiny", "d1"):
        # variance's figure of vanished values is rendered in sigma-tiny (and of overflowed
        # ones in bf16-huge): here it is built, not rendered
        figures_built_not_saved(monkeypatch)
    out = tmp_path / "run"
    res = runner.invoke(app, [*args, "-q", "--out", str(out)])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code == (1 if args[0] == "check" else 0), res.output  # check: its claims fail
    doc = config(out)
    assert doc["complete"] is True and doc["non_finite_total"] > 0


# --- 7. a full disk or a vanished folder ---


def test_disk_full_while_writing_the_plot_claims_nothing(tmp_path, monkeypatch, capsys):
    out, real = tmp_path / "run", os.replace

    def replace(src, dst):
        if str(dst).endswith(".png"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(rundir.os, "replace", replace)
    code = run_fake(out, lambda progress, on_partial: ExperimentResult({"rows": frame(2)}, {}),
                    Outputs(figures=lambda r: {"a": _figure()}))  # fmt: skip
    assert code == 1
    assert not (out / "a.png").exists() and not [p for p in out.iterdir() if p.name.startswith(".")]
    assert config(out)["complete"] is False
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and str(out) in err[0]


def test_folder_deleted_mid_run_is_one_line_exit_1(tmp_path, capsys, monkeypatch):
    import shutil

    out, now = tmp_path / "run", fake_clock(monkeypatch)

    def experiment(progress, on_partial):
        on_partial(lambda: ExperimentResult({"rows": frame(1)}, {}, False))
        shutil.rmtree(out)
        now[0] += 1  # the next write is due
        on_partial(lambda: ExperimentResult({"rows": frame(2)}, {}, False))
        raise AssertionError("the write should have failed")

    assert run_fake(out, experiment) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: run incomplete, cannot write")


# --- 9. smaller cases ---


def test_huge_depth_range_is_refused_before_it_is_built():
    """A list of 1e9 depths would be 8+ GB: the range is counted, never built (the call
    allocates next to nothing)."""
    import tracemalloc

    tracemalloc.start()
    try:
        res = runner.invoke(app, ["depth-sweep", *S[2:], "--layers", "1:1000000000"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert_one_line_error(res, "--layers")
    assert peak < 64 * 2**20, peak


def test_repeated_head_size_is_refused(tmp_path):
    res = runner.invoke(app, ["attention-scale", "--head-dims", "16,16", "--out", str(tmp_path / "r")])
    assert_one_line_error(res, "--head-dims", tmp_path / "r")


@pytest.mark.parametrize("command", ["grad-norms", "depth-sweep", "check"])
@pytest.mark.parametrize("bad", [["--vocab", "1"], ["--seq-len", "1"]])
def test_gradient_input_errors_leave_no_folder_and_no_blank_line(tmp_path, monkeypatch, command, bad):
    monkeypatch.chdir(tmp_path)
    args = [*S, *bad] if command != "depth-sweep" else [*S[2:], *bad]
    res = runner.invoke(app, [command, *args])
    assert_one_line_error(res, bad[0])
    assert not res.stderr.startswith("\n")
    assert not (tmp_path / "results").exists()  # not even an empty results/<command>/


def test_a_bad_input_found_during_the_run_removes_the_claimed_folders(tmp_path, monkeypatch):
    from tinit.model.config import ConfigError

    monkeypatch.chdir(tmp_path)

    def experiment(progress, on_partial):
        raise ConfigError("seq_len", "refused by the experiment")

    with pytest.raises(typer.BadParameter):
        execute("fake", options(None), experiment, Outputs())
    assert not (tmp_path / "results").exists()


def test_layers_import_only_downwards():
    """tinit.results never imports tinit.experiments, and no command module imports
    another command module (shared pieces live in cli/common.py, cli/runner.py)."""
    import ast

    commands = {c.body.__module__.rsplit(".", 1)[1] for c in COMMANDS}

    def imports(path: Path) -> set[str]:
        tree = ast.parse(path.read_text())
        return {(n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}  # fmt: skip

    for path in (ROOT / "tinit" / "results").glob("*.py"):
        assert not [m for m in imports(path) if "experiments" in m], path.name
    for name in commands:
        found = imports(ROOT / "tinit" / "cli" / f"{name}.py")
        assert not [m for m in found if m.lstrip(".") in commands], name
