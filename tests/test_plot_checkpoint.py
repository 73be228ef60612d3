"""The checkpoint figures draw what they say: each saved step's law beside its stream."""

import numpy as np
import pandas as pd
import pytest

from tinit.results.plot_checkpoint import plot_spectral, plot_stream_over_steps


def _variance() -> pd.DataFrame:
    rows = []
    # step 0: the stream is the law; step 100: the stream is twice its law at every k > 0
    for step, law, meas in (
        (0, [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]),
        (100, [2.0, 6.0, 10.0], [2.0, 12.0, 20.0]),
    ):
        for k in range(3):
            rows.append({"run": "r", "step": step, "k": k, "stream_var": meas[k], "pred_cumulative": law[k]})
    return pd.DataFrame(rows)


def _panels_and_key(fig):
    """The figure's drawn panels, and its key's labels (the legend in the row under them)."""
    panels = [a for a in fig.axes if a.get_visible() and a.axison]
    key = next(a for a in fig.axes if not a.axison and a.get_legend() is not None)
    return panels, [t.get_text() for t in key.get_legend().get_texts()]


def test_stream_over_steps_draws_each_steps_law_normalised_by_its_own_v0():
    fig = plot_stream_over_steps(_variance())
    (ax,), labels = _panels_and_key(fig)
    curves = {tuple(np.round(line.get_ydata(), 9)) for line in ax.get_lines() if len(line.get_ydata())}
    # measured v_k/v0 and law/v0 at each step (v0: 1 at step 0, 2 at step 100)
    assert curves == {(1.0, 2.0, 3.0), (1.0, 6.0, 10.0), (1.0, 3.0, 5.0)}
    assert labels == ["step 0", "step 100", "law at that step"]


def test_post_norm_jump_at_the_first_norm_is_marked():
    """A post-norm stream: v_k / v0 is ~1 before the first norm (k = 0, 1) and ~2,560 after
    it (the norm lifting a 0.02-std embedding, v0 = 3.9e-4, to ~1). The axis is the normed
    stream's; k = 0, 1 are triangles at its bottom edge (gid "clipped", as variance.png's),
    the key names them and the note gives the jump. A pre-norm run beside it: none."""
    v0, rows = 3.9e-4, []
    for run, pos in (("p", "post"), ("q", "pre")):
        for k in range(7):
            v = (v0 * (1 + 0.01 * k) if k < 2 else 1.0 + 0.001 * k) if pos == "post" else v0 * (1 + 0.1 * k)
            rows.append({"run": run, "step": 0, "k": k, "stream_var": v, "pred_cumulative": v,
                         "norm_position": pos, "init": "naive", "n_layers": 3})  # fmt: skip
    fig = plot_stream_over_steps(pd.DataFrame(rows))
    (post, pre), labels = _panels_and_key(fig)
    lo, hi = post.get_ylim()
    assert 1.0 < lo and hi < 1.1 * 1.006 / v0  # the normed stream's range: k >= 2 only
    marks = [line for line in post.get_lines() if line.get_gid() == "clipped"]
    assert marks and all(set(m.get_xdata()) <= {0, 1} and set(m.get_ydata()) == {lo} for m in marks)
    assert {0, 1} <= {x for m in marks for x in m.get_xdata()}
    assert not [line for line in pre.get_lines() if line.get_gid() == "clipped"]
    assert "post-norm k = 0, 1: below the axis" in labels
    note = " ".join(t.get_text() for t in fig.texts if t.get_gid() == "footnote").replace("\n", " ")
    assert f"p x{1.002 / v0:,.0f}" in note and "triangles" in note
    assert "after the first norm" in post.get_xlabel() and "norm" not in pre.get_xlabel()


def test_spectral_marks_a_lone_first_point():
    drift = pd.DataFrame(
        [
            {"run": "r", "step": s, "layer": -1, "role": "embed", "spectral_norm": v}
            for s, v in ((0, 0.5), (9, 4.0))
        ]
    )
    fig = plot_spectral(drift)
    (ax,) = [a for a in fig.axes if a.get_visible()]
    marked = {float(line.get_ydata()[0]): line.get_marker() for line in ax.get_lines()}
    assert marked[0.5] not in (None, "None", "") and marked[4.0] not in (None, "None", "")


def _one_hf_checkpoint() -> tuple[pd.DataFrame, pd.DataFrame]:
    """The frames of `audit --checkpoint HF_FOLDER`: one checkpoint, no training step
    (empty), no init known (rel_change empty)."""
    nan = float("nan")
    rows = [
        {"run": "gpt2", "step": nan, "k": k, "stream_var": v, "pred_cumulative": v}
        for k, v in ((0, 1), (1, 2))
    ]
    variance = pd.DataFrame(rows)
    drift = pd.DataFrame(
        [
            {"run": "gpt2", "step": nan, "layer": layer, "role": role, "shape": "8x8", "rel_change": nan,
             "spectral_norm": 0.5 + layer}
            for layer in (0, 1)
            for role in ("q", "down")
        ]
    )  # fmt: skip
    return variance, drift


def test_an_unstepped_checkpoint_says_what_it_shows():
    """A Hugging Face checkpoint has no step and no init: no drift figure (empty axes
    titled "steps None" were drawn), said in one line; the others say "as saved"."""
    from tinit.results.plot_checkpoint import drift_runs, no_drift_line, plot_drift

    variance, drift = _one_hf_checkpoint()
    assert drift_runs(drift) == []
    line = no_drift_line(drift)
    assert line.startswith("Drift: no drift.png for gpt2:") and "init is not known" in line
    with pytest.raises(ValueError):
        plot_drift(drift)
    fig = plot_spectral(drift)
    (ax,) = [a for a in fig.axes if a.get_visible()]
    assert ax.get_title() == "gpt2\nas saved (no training step)"
    assert len(ax.get_lines()) == 2  # q and down, each at its two layers
    fig = plot_stream_over_steps(variance)
    _, labels = _panels_and_key(fig)
    assert labels == ["as saved (no training step)", "law (from its branch variances)"]
    texts = " ".join(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))
    assert "None" not in texts and "the checkpoint as saved" in texts


def test_drift_draws_only_runs_whose_init_is_known():
    """A tinit run (init known) beside nothing else: one panel, titled by its one step."""
    from tinit.results.plot_checkpoint import drift_runs, no_drift_line, plot_drift

    drift = pd.DataFrame(
        [
            {"run": "r", "step": s, "layer": 0, "role": "q", "shape": "8x8", "rel_change": 0.1 * s,
             "spectral_norm": 0.5}
            for s in (0, 4)
        ]
    )  # fmt: skip
    assert drift_runs(drift) == ["r"] and no_drift_line(drift) is None
    fig = plot_drift(drift)
    (ax,) = [a for a in fig.axes if a.get_visible()]
    assert ax.get_title() == "r\nstep 4"
