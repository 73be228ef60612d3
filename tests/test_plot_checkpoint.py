"""The checkpoint figures draw what they say: each saved step's law beside its stream."""

import numpy as np
import pandas as pd

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


def test_stream_over_steps_draws_each_steps_law_normalised_by_its_own_v0():
    fig = plot_stream_over_steps(_variance())
    (ax,) = [a for a in fig.axes if a.get_visible()]
    curves = {tuple(np.round(line.get_ydata(), 9)) for line in ax.get_lines() if len(line.get_ydata())}
    # measured v_k/v0 and law/v0 at each step (v0: 1 at step 0, 2 at step 100)
    assert curves == {(1.0, 2.0, 3.0), (1.0, 6.0, 10.0), (1.0, 3.0, 5.0)}
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["step 0", "step 100", "law at that step"]


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
