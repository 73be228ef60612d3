"""What a run records about its own cost: seconds and peak memory per configuration
(config.json) and the one-line summary on the terminal."""

import json

import pytest
import torch
from helpers import figures_built_not_saved
from typer.testing import CliRunner

from tinit.cli import app
from tinit.experiments import driver
from tinit.experiments.driver import Meter, peak_rss_mib
from tinit.experiments.measure.depth_sweep import run_depth_sweep
from tinit.experiments.measure.variance import run_variance
from tinit.results.tables import cost_line


def test_cpu_meter_records_seconds_and_process_peak():
    meter = Meter(torch.device("cpu"))
    meter.start()
    x = torch.ones(256, 256) @ torch.ones(256, 256)
    meter.stop("a")
    meta = {}
    meter.record(meta)
    assert float(x[0, 0]) == 256
    assert set(meta) == {"seconds", "peak_rss_mib", "rss_mib"}
    # resident now <= the peak (the kernel's counters lag by a few pages: 1% slack)
    assert 10 < meta["rss_mib"]["a"] <= 1.01 * meta["peak_rss_mib"]
    assert meta["seconds"]["a"] > 0
    # the process holds at least torch: tens of MiB, and never more than the machine
    assert 10 < meta["peak_rss_mib"] <= peak_rss_mib()


def test_no_resource_module_means_no_rss_figure(monkeypatch):
    """Windows has no `resource`: the run still finishes, and claims no RSS figure."""
    import builtins

    real_import = builtins.__import__

    def no_resource(name, *args, **kwargs):
        if name == "resource":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_resource)
    monkeypatch.setattr(driver, "peak_rss_own_mib", lambda: None)  # nor /proc
    assert peak_rss_mib() is None
    meter, meta = Meter(torch.device("cpu")), {}
    meter.record(meta)
    assert meta["peak_rss_mib"] is None
    assert cost_line({**meta, "device": "cpu", "seconds": {"x": 1.0}}) == "Measured on cpu: 1.0 s"


class FakeAllocator:
    """Stands in for torch.cuda's peak counter: allocations raise it, a reset lowers it."""

    def __init__(self, monkeypatch):
        self.current = self.peak = 0
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: self.reset())
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: self.peak)

    def reset(self):
        self.peak = self.current

    def alloc(self, gib):
        self.current += gib * 2**30
        self.peak = max(self.peak, self.current)

    def free(self, gib):
        self.current -= gib * 2**30


def test_cuda_meter_peak_per_configuration(monkeypatch):
    mem = FakeAllocator(monkeypatch)
    meter = Meter(torch.device("cuda"))
    meter.start()
    mem.alloc(5)
    mem.free(5)
    meter.stop("big")
    meter.start()
    mem.alloc(1)
    meter.stop("small")
    meta = {}
    meter.record(meta)
    assert meta["peak_gpu_memory_gib"] == {"big": 5.0, "small": 1.0}


def test_cuda_meter_takes_inner_peaks_across_their_resets(monkeypatch):
    """A span that runs whole experiments (depth-sweep, check) must not report only
    the last inner configuration's peak: the inner meters reset the counter."""
    mem = FakeAllocator(monkeypatch)
    outer, inner = Meter(torch.device("cuda")), Meter(torch.device("cuda"))
    outer.start()
    inner.start()
    mem.alloc(7)
    mem.free(7)
    inner.stop("first")
    inner.start()  # resets: the allocator alone no longer knows about the 7 GiB
    mem.alloc(2)
    mem.free(2)
    inner.stop("second")
    inner_meta = {}
    inner.record(inner_meta)
    outer.stop("span", [inner_meta])
    meta = {}
    outer.record(meta)
    assert meta["peak_gpu_memory_gib"]["span"] == 7.0


def test_cost_line_names_device_time_and_memory():
    meta = {
        "device": "cuda:0", "device_name": "NVIDIA H200", "run": {"dtype": "bfloat16"}, "streamed": True,
        "seconds": {"naive/pre": 0.5, "scaled/pre": 0.25},
        "peak_gpu_memory_gib": {"naive/pre": 5.5, "scaled/pre": 5.25}, "peak_rss_mib": 900.4,
    }  # fmt: skip
    line = cost_line(meta, width=200)  # (at the terminal's width it breaks between values)
    assert line == (
        "Measured on cuda:0 (NVIDIA H200), bfloat16, streamed: 0.8 s in 2 parts "
        "(longest: naive/pre 0.50 s); peak GPU memory 5.50 GiB; peak process memory 900 MiB"
    )
    assert cost_line({"device": "cpu"}) is None
    one = cost_line({"device": "cpu", "run": {"dtype": "float32"}, "seconds": {"x": 2.0}})
    assert one == "Measured on cpu, float32: 2.0 s"


def test_experiments_record_cost(tiny_model, tiny_run):
    res = run_variance(tiny_model, run=tiny_run, inits=("naive",), norm_positions=("pre", "post"))
    assert set(res.meta["seconds"]) == {"naive/pre", "naive/post"}
    assert res.meta["peak_rss_mib"] > 0
    assert "peak_gpu_memory_gib" not in res.meta  # a CPU run claims no GPU figure
    sweep = run_depth_sweep(tiny_model, run=tiny_run, layers=[1, 2], seeds=1, grads=False)
    # a point per (L, seed, scheme, placement), timed under its sweep folder's name
    assert set(sweep.meta["seconds"]) == {f"L{L}-seed0-{i}-{p}" for L in (1, 2) for i in ("naive", "scaled")
                                          for p in ("pre", "post")}  # fmt: skip


@pytest.mark.parametrize("command", ["variance", "grad-norms"])
def test_cli_prints_cost_and_writes_it(tmp_path, monkeypatch, command):
    figures_built_not_saved(monkeypatch)  # (the cost printed is the measurement's)
    out = tmp_path / "run"
    args = [command, "--layers", "2", "--d-model", "32", "--heads", "2", "--batch", "2", "--seq-len", "8"]
    res = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "Measured on cpu" in res.output and "peak process memory" in res.output
    meta = json.loads((out / "config.json").read_text())
    assert len(meta["seconds"]) == 4 and meta["peak_rss_mib"] > 0
