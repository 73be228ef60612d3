"""The progress callbacks move through every phase, one step at a time: the grad-norms
backward pass ticks once per block (it used to jump from L to 2L at the end)."""

import dataclasses

import pytest

from tinit.experiments.measure.grad_norms import run_grad_norms


@pytest.mark.parametrize("stream", [False, True])
def test_grad_norms_backward_ticks_per_block(tiny_model, tiny_init, tiny_run, stream):
    calls = []
    run = dataclasses.replace(tiny_run, stream=stream)
    run_grad_norms(tiny_model, tiny_init, run, inits=("naive",), norm_positions=("pre", "post"),
                   progress=lambda done, total: calls.append((done, total)))  # fmt: skip
    L = tiny_model.n_layers
    total = 2 * 2 * L  # 2 configurations x (forward + backward) x L blocks, one batch
    assert [d for d, _ in calls] == list(range(1, total + 1))
    assert {t for _, t in calls} == {total}
