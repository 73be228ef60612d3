"""Memory flat in configurations, points and depth: nothing of a configuration
outlives it. Several configurations and depths run in one process; after each, the
live tensors (every torch tensor the garbage collector can reach) must be what they
were before the first (none made since still alive), and the resident memory must not
grow with the number run.

The sizes make a leak visible: before the fix, every gradient configuration left its
streams, their gradients and through the graph its weights behind (~25 MB per
configuration here, against a tolerance of a few MB)."""

import dataclasses
import functools
import gc
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from tinit.experiments import memory
from tinit.experiments.measure.depth_sweep import run_depth_sweep
from tinit.experiments.measure.grad_norms import run_grad_norms
from tinit.experiments.memory import (
    _per_token_upper,
    backward_bound,
    block_bytes,
    gradient_pass_bounds,
    gradient_pass_bytes,
    rss_mib,
)
from tinit.model.config import InitConfig, ModelConfig, RunConfig

MODEL = ModelConfig(n_layers=8, d_model=128, n_heads=2, vocab_size=256, max_seq_len=64)
RUN = RunConfig(batch=4, seq_len=64, device="cpu")


@contextmanager
def made_from_now_on():
    """While inside, the collector sees only the objects made since it was entered: those
    alive then are frozen (gc.freeze: kept, and never scanned again), so that a count of
    live tensors is a count of those made since that still live, and a collection and a
    count cost milliseconds instead of 0.3 s each (the objects of torch's compiler and
    sympy, imported by the meta-device counts, are most of the 300,000)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def settled() -> tuple[int, float]:
    """After a full collection: (live tensors the collector can reach, resident MiB).
    The large-width prediction's Gauss-Hermite tables (tinit.mf.kernels, an lru_cache of
    at most 4 small tables, made on first use) are emptied first: constants of the
    process, not a configuration's; without this the count depended on whether an earlier
    test in the process had made them (this file alone failed, the whole suite passed)."""
    from tinit.mf.kernels import _hermite_table

    _hermite_table.cache_clear()
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor)), rss_mib()


@pytest.mark.parametrize("stream", [False, True], ids=["built", "layer-wise"])
def test_grad_norms_leaves_nothing_behind(stream):
    run = dataclasses.replace(RUN, stream=stream)
    # both placements (their backward paths differ); one scheme: another scheme's
    # configuration runs the same code with other stds
    grid = {"inits": ("naive",), "norm_positions": ("pre", "post")}
    rss, tensors = [], []
    with made_from_now_on():
        before, _ = settled()
        run_grad_norms(MODEL, InitConfig(), run, **grid)  # warm: allocator pools, first-call caches
        for _ in range(2):  # 2 configurations each: a leak shows from one run to the next
            run_grad_norms(MODEL, InitConfig(), run, batches=2, **grid)
            t, r = settled()
            tensors.append(t)
            rss.append(r)
    assert tensors == [before] * 2
    # one configuration's backward holds this much; a leak of it per run would show
    held = gradient_pass_bytes(MODEL, InitConfig(), RUN.batch, RUN.seq_len, torch.float32) / 2**20
    assert held > 15
    assert rss[-1] - rss[0] < held / 3, (rss, held)


def test_depth_sweep_memory_flat_in_points_and_depth():
    """Depths 2 and 16, one seed, gradients on: the live tensors after every point are
    those before the sweep, and the resident memory after the last point is within
    10% of the first (docs/performance.md's target; the deepest backward here holds ~50 MB).
    (One seed and one scheme, both placements (their backward paths differ): a second seed
    re-ran the same shapes, 37 s in all; a point of another seed or scheme is the same code
    as another point, with other draws.)"""
    after: list[tuple[int, float]] = []

    def on_partial(so_far):  # after each point (nothing built: the writer's decision)
        after.append(settled())

    model = dataclasses.replace(MODEL, n_layers=16)
    with made_from_now_on():
        before, _ = settled()
        res = run_depth_sweep(model, InitConfig(), RUN, layers=(2, 16), seeds=1, inits=("naive",),
                              grads=True, on_partial=on_partial)  # fmt: skip
    assert res.complete and len(after) == 4  # a point per (L, placement)
    assert [t for t, _ in after] == [before] * 4
    rss = [r for _, r in after]
    held = gradient_pass_bytes(model, InitConfig(), RUN.batch, RUN.seq_len, torch.float32) / 2**20
    assert held > 40  # what one leaked configuration at L = 16 would add
    assert rss[-1] <= 1.10 * rss[0] and rss[-1] - rss[0] < held / 2, rss
    # config.json's figure: resident memory after each point (named as a sweep's point folder)
    names = [f"L{L}-seed0-naive-{p}" for L in (2, 16) for p in ("pre", "post")]
    assert sorted(res.meta["rss_mib"]) == sorted(names)


PEAK_SCRIPT = """
import json, sys, torch
from tinit.experiments import memory
from tinit.experiments.measure.grad_norms import run_grad_norms
from tinit.experiments.memory import peak_rss_own_mib, rss_mib
from tinit.model.config import InitConfig, ModelConfig, RunConfig
torch.set_num_threads(1)
peaks = []
for position, L, d, batch in json.loads(sys.argv[1]):
    shape = dict(d_model=d, n_heads=d // 64, vocab_size=256, max_seq_len=64)
    run = RunConfig(batch=batch, seq_len=64, device="cpu", stream=False)
    run_grad_norms(ModelConfig(n_layers=1, **shape), InitConfig(), run, inits=("naive",),
                   norm_positions=("pre",))  # first-call costs
    base = rss_mib()
    with open("/proc/self/clear_refs", "w") as f:  # the peak (VmHWM) starts again from now
        f.write("5")
    cfg = ModelConfig(n_layers=L, **shape)
    run_grad_norms(cfg, InitConfig(), run, inits=("naive",), norm_positions=(position,))
    peaks.append(peak_rss_own_mib() - base)  # not ru_maxrss: it keeps the parent's (pytest's) size
print(json.dumps(peaks))
"""
PEAK_CASES = {"activations": ("pre", 8, 192, 8), "weights": ("post", 4, 512, 2)}


@pytest.fixture(scope="module")
def measured_peaks() -> dict[str, float]:
    """Each case's peak resident memory above what the process held before its backward,
    both cases in one fresh process (its peak reset before each: /proc/self/clear_refs)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_ARENA_MAX": "1"}
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, json.dumps(list(PEAK_CASES.values()))],
                         capture_output=True, text=True, check=True, timeout=120, env=env)  # fmt: skip
    return dict(zip(PEAK_CASES, json.loads(out.stdout.splitlines()[-1]), strict=True))


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="resets the peak through /proc")
@pytest.mark.parametrize("case", list(PEAK_CASES))
def test_the_streaming_decision_counts_what_the_backward_keeps(measured_peaks, case):
    """The bytes a built backward holds, estimated before anything is allocated, against
    what the operating system saw: the peak resident memory of a fresh process running
    that backward, above what it held before (glibc told to map every tensor of 64 KiB
    or more on its own and to keep one arena, so that the resident memory is what is
    allocated). With many tokens the saved activations are most of it (the old decision
    counted weights x 3); with few, the weights and their gradients."""
    position, layers, d, batch = PEAK_CASES[case]
    cfg = ModelConfig(n_layers=layers, d_model=d, n_heads=d // 64, vocab_size=256, max_seq_len=64,
                      norm_position=position)  # fmt: skip
    weights, saved = block_bytes(cfg, InitConfig(), batch, 64, torch.float32)
    est = gradient_pass_bytes(cfg, InitConfig(), batch, 64, torch.float32) / 2**20
    measured = measured_peaks[case]
    assert 0.9 < est / measured < 1.2, (est, measured)
    if position == "pre":
        assert saved > 3 * weights and 3 * layers * weights / 2**20 < 0.5 * measured
    run = RunConfig(batch=batch, seq_len=64, device="cpu")
    res = run_grad_norms(cfg, InitConfig(), run, inits=("naive",), norm_positions=(position,))
    assert res.meta["streamed"] is False
    assert est / 2**10 <= res.meta["built_backward_gib"] <= 1.25 * est / 2**10


CASES = [
    {}, {"norm_position": "post"}, {"norm_position": "sandwich"}, {"norm_position": "reordered"},
    {"norm_position": "none"}, {"ffn": "gelu"}, {"positions": "learned"}, {"n_kv_heads": 1},
    {"qk_norm": True}, {"branch": "gaussian"}, {"norm": "layernorm", "bias": True},
]  # fmt: skip


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
@pytest.mark.parametrize("scheme", ["naive", "rezero", "nanochat", "gemma2", "gemma3", "magneto"])
def test_the_bound_that_decides_holds_the_count_closely(kw, scheme, monkeypatch):
    """The decision's figure, from shapes alone (counting imports torch's compiler: a
    second and 70 MB of a process), is never below the bytes a block's forward saves as
    counted on the meta device, and at most a quarter above, in every placement, FFN,
    position kind, norm, QK-norm, GQA, gain and x0 mix, and the architectures the schemes
    bring (relu^2 and GeGLU FFNs, soft-capped attention, (1 + w) norms, sub-LN); the whole backward's bounds
    hold the whole count between them, in float32, bfloat16 and float64."""
    # (a count is a function of its arguments: float32's, made here, is not made again by
    # gradient_pass_bytes; each count is a meta-device forward, most of this test's time)
    monkeypatch.setattr(memory, "block_bytes", functools.cache(memory.block_bytes))
    cfg = dataclasses.replace(MODEL, **kw)
    ini = InitConfig(scheme=scheme)
    _, saved = memory.block_bytes(cfg, ini, 4, 64, torch.float32)
    upper = 4 * 64 * _per_token_upper(cfg, ini, 64) * 4
    assert saved <= upper <= 1.25 * saved, (saved, upper)
    for dtype in (torch.bfloat16, torch.float64, torch.float32):
        low, high = gradient_pass_bounds(cfg, ini, 4, 64, dtype)
        assert low <= gradient_pass_bytes(cfg, ini, 4, 64, dtype) <= high, dtype
    assert backward_bound([(cfg, ini), (MODEL, InitConfig())], 4, 64, torch.float32) == max(
        high, gradient_pass_bounds(MODEL, InitConfig(), 4, 64, torch.float32)[1]
    )
