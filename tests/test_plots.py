"""What a reader sees: every figure 7 in wide with every configuration drawn and
distinguishable, axis limits from the measured data (predictions outside clipped and
marked), coinciding curves named; verdicts that state their criterion.

The frames are synthetic, built here by hand, so the expected properties (which
series coincide, which prediction leaves the data's range, which verdict) are known
without running a model."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.lines import Line2D
from rich.console import Console

from tinit.experiments.measure.depth_fits import round_to_inputs, transfer_verdict
from tinit.experiments.measure.depth_sweep import LAW_TOL, TRANSFER_TOL, assemble
from tinit.model.config import ModelConfig
from tinit.results.palette import CONFIG_MARKERS
from tinit.results.plot_depth_sweep import depth_sweep_slope_table, depth_sweep_table, plot_depth_sweep
from tinit.results.plot_grad_norms import grad_norms_table, plot_grad_norms, plot_stream_grads
from tinit.results.plot_params import EQUAL_COLORS, plot_params
from tinit.results.plots import plot_variance
from tinit.results.report_check import check_table
from tinit.results.style import FONT, FULL_WIDTH, coincidences
from tinit.results.tables import fmt

CONFIGS = [("naive", "pre"), ("scaled", "pre"), ("naive", "post"), ("scaled", "post")]


def _lines(fig, prefix: str) -> dict[str, Line2D]:
    out = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            gid = line.get_gid() or ""
            if gid.startswith(prefix):
                out.setdefault(gid[len(prefix) :], line)
    return out


def _footnote(fig) -> str:
    return " ".join(t.get_text() for t in fig.texts if t.get_gid() == "footnote")


def _pixels(fig) -> np.ndarray:
    """The figure as the PNG shows it: RGB, one row of pixels per row."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].astype(int).copy()


def _settled(fig):
    """Draw once so that the constrained layout settles, then keep it: renders that show
    or hide one artist then differ only where that artist is drawn."""
    _pixels(fig)
    fig.set_layout_engine("none")
    return fig


def _drawn_by(fig, gid: str, full: np.ndarray) -> np.ndarray:
    """Where the artists with this gid visibly change the picture (hidden against shown)."""
    artists = [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == gid]
    assert artists, gid
    for a in artists:
        a.set_visible(False)
    without = _pixels(fig)
    for a in artists:
        a.set_visible(True)
    return np.abs(full - without).max(axis=-1) > 40


def _render(table) -> str:
    console = Console(width=100, record=True)
    console.print(table)
    return console.export_text()


def _variance_frame(L: int = 6) -> pd.DataFrame:
    """Four configurations: naive/pre grows, scaled/pre flat, and the two post-norm
    configurations identical (they must be named as coinciding and drawn apart)."""
    rows = []
    rng = np.random.default_rng(0)
    for init, pos in CONFIGS:
        v0 = 1e-3
        s2 = 1e-3 if init == "naive" else 1e-3 / (2 * L)
        v = v0
        for k in range(2 * L + 1):
            layer, sub = (-1, "embed") if k == 0 else ((k - 1) // 2, "attn" if k % 2 else "ffn")
            b = math.nan if k == 0 else s2 * (1 + 0.01 * rng.standard_normal()) if pos == "pre" else 1e-4
            if pos == "post":
                stream = v0 if k == 0 else 1.0 + 1e-4
            else:
                v = v0 if k == 0 else v + b
                stream = v
            rows.append({
                "init": init, "norm_position": pos, "n_layers": L, "seed": 0, "k": k, "layer": layer,
                "sublayer": sub, "stream_var": stream, "branch_var": b, "cross_corr": 0.0,
                "stream_var_rel": stream / v0, "pred_cumulative": stream * 1.01, "pred_closed": stream * 1.02,
                "stream_var_normed": math.nan,
            })  # fmt: skip
    return pd.DataFrame(rows)


def test_variance_plot_shows_every_configuration_apart():
    fig = plot_variance(_variance_frame(), "title")
    assert fig.get_figwidth() == pytest.approx(FULL_WIDTH)
    measured, theory = _lines(fig, "measured:"), _lines(fig, "theory:")
    assert set(measured) == {f"{i}/{p}" for i, p in CONFIGS} == set(theory)
    # the identical post-norm configurations: distinct markers, and named in the note
    assert measured["naive/post"].get_marker() != measured["scaled/post"].get_marker()
    assert "naive/post and scaled/post lie on top of each other" in _footnote(fig)
    # theory is told apart from measurement by its line style
    for name in measured:
        assert measured[name].get_linestyle() != theory[name].get_linestyle()
    keys = []
    for ax in fig.axes:
        if not ax.axison:  # the rows that hold the legends: line styles, then the configurations
            keys.append({t.get_text() for t in ax.get_legend().get_texts()})
            continue
        assert ax.get_xlabel() and ax.get_ylabel()
        assert ax.title.get_fontsize() >= FONT
    assert keys[-1] == {f"{i} init, {p}-norm" for i, p in CONFIGS}
    assert "measured" in keys[0] and any(t.startswith("law") for t in keys[0])
    # where the law lies on its measurement (pre-norm here), its dashes stay visible on the band
    full = _pixels(_settled(fig))
    for name in ("naive/pre", "scaled/pre"):
        on_band = _drawn_by(fig, f"theory:{name}", full) & _drawn_by(fig, f"measured:{name}", full)
        assert on_band.sum() >= 20, (name, on_band.sum())
    # every measured point of a stream panel lies inside its limits
    for line in measured.values():
        lo, hi = line.axes.get_ylim()
        y = np.asarray(line.get_ydata(), dtype=float)
        y = y[np.isfinite(y)]
        assert lo <= y.min() and y.max() <= hi


def test_stream_grads_clips_a_prediction_far_below_the_data():
    k = np.arange(0, 9)
    rows = []
    for init, pos in CONFIGS:
        meas = np.full(len(k), 1e-3) * (1 + 0.1 * (init == "naive"))
        pred = np.full(len(k), 1e-3) if pos == "pre" else 1e-3 * 10.0 ** (-2 * (8 - k))  # down to 1e-19
        for kk, m, p in zip(k, meas, pred, strict=True):
            rows.append({"init": init, "norm_position": pos, "k": kk, "stream_grad_rms": m,
                         "pred_stream_grad_rms": p})  # fmt: skip
    fig = plot_stream_grads(pd.DataFrame(rows), "title")
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    assert lo > 1e-5  # the axis is the data's (1e-3, 1.1e-3), not 16 decades of prediction
    clipped = [ln for ln in ax.get_lines() if ln.get_gid() == "clipped"]
    assert clipped and all(np.allclose(ln.get_ydata(), lo) for ln in clipped)
    assert "leaves the measured range" in _footnote(fig)
    assert set(_lines(fig, "measured:")) == {f"{i}/{p}" for i, p in CONFIGS}


def test_grad_norms_linear_axis_for_a_narrow_range_and_coincidence_named():
    rows = []
    for init, pos in CONFIGS[2:]:
        for t in ("down", "o"):
            for layer in range(12):
                rows.append({"init": init, "norm_position": pos, "tensor": t, "layer": layer,
                             "grad_norm": 4.93e-3 * (1 + 0.003 * (layer % 3))})  # fmt: skip
    fig = plot_grad_norms(pd.DataFrame(rows), "both", "title")
    assert fig.get_figwidth() == pytest.approx(FULL_WIDTH)
    for ax in fig.axes:
        assert ax.get_yscale() == "linear"  # 1% of spread: no log axis
        lo, hi = ax.get_ylim()
        assert lo <= 4.93e-3 and hi >= 4.93e-3 * 1.006
    m = _lines(fig, "measured:")
    assert m["naive/post"].get_marker() == CONFIG_MARKERS[("naive", "post")] != m["scaled/post"].get_marker()
    assert "naive/post and scaled/post" in _footnote(fig)


def _sweep_records(depths=(1, 4, 12, 24), seeds=2) -> list[dict]:
    """naive/pre: v_2L = v0 + 2L s2 with s2 growing 10% per depth step (so the per-depth
    law and the constant-s2 line differ); scaled/pre: flat at v0 + s2 (+0.5%/depth)."""
    recs = []
    for init in ("naive", "scaled"):
        for j, L in enumerate(depths):
            for seed in range(seeds):
                v0 = 1.0 + 0.001 * seed
                s2 = 0.01 * 1.1**j
                if init == "naive":
                    v_final, b = v0 + 2 * L * s2, s2
                else:
                    v_final, b = (v0 + 0.01) * (1 + 0.005 * j + 0.0005 * seed), 0.01 / (2 * L)
                recs.append({
                    "init": init, "norm_position": "pre", "n_layers": L, "seed": seed, "v0": v0,
                    "v_final": v_final, "v_final_rel": v_final / v0, "branch_var_mean": b,
                    "sigma2_rel": b / v0,
                    "pred_closed_final": v0 + 2 * L * b, "rel_err_closed": v_final / (v0 + 2 * L * b) - 1,
                    "max_abs_cross_corr": 0.01, "grad_ratio": math.nan,
                    # the scheme's reference s^2 (naive: s2 itself; gpt2: 2L s^2, its L-free part)
                    "s2_ref_attn": b if init == "naive" else 2 * L * b,
                    "s2_ref_ffn": b if init == "naive" else 2 * L * b, "v_growth": v_final - v0,
                })  # fmt: skip
    return recs


def test_depth_sweep_verdicts_and_figure_agree():
    res = assemble(_sweep_records(), [("naive", "pre"), ("scaled", "pre")], ModelConfig())
    fit, summary = res["depth_sweep_fit"], res["depth_sweep_summary"]
    f = fit.set_index("init")
    assert (fit["transfer_from"] == 12).all() and (fit["transfer_to"] == 24).all()  # 12 swept: 12 -> deepest
    # by hand: scaled v_2L changes by (1 + 0.015)/(1 + 0.01) - 1 ~ +0.5% between 12 and 24: resolved by
    # the two seeds or not, it is far inside 10%; naive roughly doubles
    assert f.loc["scaled", "transfer_ratio"] == pytest.approx(1.015 / 1.01, rel=1e-3)
    assert f.loc["scaled", "transfers"] == "yes" and f.loc["naive", "transfers"] == "no"
    assert f.loc["naive", "law_max_rel_err"] == pytest.approx(0.0, abs=1e-12)  # v_final is the law here
    assert bool(f.loc["naive", "law_holds"])
    assert f.loc["scaled", "theory_slope"] == 0.0  # a flat theory curve: exactly 0, not round-off
    fig = plot_depth_sweep(summary, fit, "title")
    assert fig.get_figwidth() == pytest.approx(FULL_WIDTH)
    theory = _lines(fig, "theory:")
    # the pre-norm panel shows v_2L - v0, and the law is drawn per depth: naive's 2L s2(L)
    # with each depth's own s2
    naive = summary[summary["init"] == "naive"].sort_values("n_layers")
    expected = 2 * naive["n_layers"] * naive["branch_var_mean_mean"]
    assert np.allclose(theory["naive/pre"].get_ydata(), expected)
    assert np.allclose(_lines(fig, "measured:")["naive/pre"].get_ydata(), expected)  # v_final is the law
    text = " ".join(t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts())
    assert "naive/pre: ×" in text and "transfers: no" in text
    assert "scaled/pre: ×" in text and "transfers: yes" in text
    for ax in fig.axes:  # integer depth ticks, never "10.0"
        if not ax.axison:  # the legend row
            continue
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert labels and all("." not in s for s in labels)
    out = _render(depth_sweep_table(fit, summary, "t"))
    assert f"≤{TRANSFER_TOL:.0%}" in out and f"≤{LAW_TOL:.0%}" in out and "v(24)/v(12)" in out
    slope = _render(depth_sweep_slope_table(fit, summary, "t"))
    row = next(line for line in slope.splitlines() if line.startswith("scaled/pre"))
    assert row.split()[4] == "0"  # config, slope, ±, se, theory


def test_transfer_verdict_and_rounding_by_hand():
    assert transfer_verdict(1.002, 3e-5) == "yes"  # statistically certain, practically nil
    assert transfer_verdict(1.155, 0.001) == "no"
    assert transfer_verdict(1.09, 0.01) == "unclear"  # 1.09 +- 0.02 straddles 1.10
    assert transfer_verdict(1.09, math.nan) == "yes"  # one seed: the point estimate
    assert round_to_inputs(-3.4e-20, np.array([1.0, 1.0]), np.array([1, 80])) == 0.0
    assert round_to_inputs(0.02, np.array([1.0, 2.6]), np.array([1, 80])) == 0.02


def test_coincidences_by_axis_fraction():
    groups = coincidences({"a": [1.0, 2.0], "b": [1.0, 2.0], "c": [5.0, 9.0]})
    assert groups == [["a", "b"]]


def test_params_plot_for_gpt2_shapes_all_bars_visible():
    params = pd.DataFrame([
        {"tying": t, "component": c, "count": n}
        for t in ("tied", "untied")
        for c, n in (("embedding", 38597376), ("attention", 28348416), ("ffn", 56669184),
                     ("head", 0 if t == "tied" else 38597376))
    ])  # fmt: skip
    ffn = pd.DataFrame({"variant": ["classic FFN at 4d", "SwiGLU at 8d/3 (unrounded)"],
                        "ffn": ["gelu", "swiglu"], "d_ff": [3072, 2048], "weights": [4718592, 4718592],
                        "classic_weights": [4718592] * 2, "ratio": [1.0, 1.0],
                        "equal": [True, True]})  # fmt: skip
    summary = pd.DataFrame([{"total_untied": 162212352, "saved": 38597376, "saved_frac_untied": 0.238}])
    fig = plot_params(params, ffn, summary, "gpt2")
    assert fig.get_figwidth() == pytest.approx(FULL_WIDTH)
    ax = next(a for a in fig.axes if a.get_title().startswith("Gated"))
    widths = [p.get_width() for p in ax.patches]
    # every bar drawn, each a real share of the axis (not an empty panel of -0.04..0.10)
    assert len(widths) == 2 and all(w > 0.4 * ax.get_xlim()[1] for w in widths)
    assert all(p.get_facecolor()[:3] == pytest.approx(_rgb(EQUAL_COLORS[True])) for p in ax.patches)
    legends = fig.subfigs[1].legends  # the FFN panel's
    legend_colors = [h.get_facecolor()[:3] for leg in legends for h in leg.get_patches()]
    assert pytest.approx(_rgb(EQUAL_COLORS[True])) in legend_colors  # the legend shows the bars' colour
    # no entry for a kind of bar that is not drawn (every bar equals the classic count here)
    assert pytest.approx(_rgb(EQUAL_COLORS[False])) not in legend_colors


def test_params_title_says_what_each_share_is_of_and_the_ffn_axis_ends_at_its_bars():
    """check's params.png: the primer's V=128000, d=2048 at L=12 saves V*d = 262,144,000, which
    is 23.2% of that model untied (1,131,464,704) and 17.5% of the 1.5B model the check's
    table quotes: the title gives both, each with what it is a share of (it gave 23.2% "of
    untied" beside a table of 17.5%). The FFN panel's axis ends just past its bars (it ran
    to twice them, 70M for bars of 34M, to make room for text now written beside it)."""
    saved, untied, ref = 128000 * 2048, 1131464704, 1.5e9
    params = pd.DataFrame([{"tying": t, "component": c, "count": n} for t in ("tied", "untied")
                           for c, n in (("embedding", saved), ("ffn", untied - 2 * saved),
                                        ("head", 0 if t == "tied" else saved))])  # fmt: skip
    ffn = pd.DataFrame({"variant": ["classic FFN at 4d", "SwiGLU at 8d/3 rounded up to 64"],
                        "ffn": ["gelu", "swiglu"], "d_ff": [8192, 5504], "weights": [33554432, 33816576],
                        "classic_weights": [33554432] * 2, "ratio": [1.0, 33816576 / 33554432],
                        "equal": [True, False]})  # fmt: skip
    summary = pd.DataFrame([{"total_untied": untied, "saved": saved, "saved_frac_untied": saved / untied,
                             "reference_total": ref, "saved_frac_reference": saved / ref}])  # fmt: skip
    fig = plot_params(params, ffn, summary)
    top = next(a for a in fig.axes if a.get_title().startswith("Tying"))
    first, second = top.get_title().split("\n")
    assert first == "Tying the head saves 262,144,000 parameters:"
    assert second == "23.2% of this model untied (1.13B); 17.5% of a 1.5B model"
    bx = next(a for a in fig.axes if a.get_title().startswith("Gated"))
    assert bx.get_xlim()[1] <= 1.1 * 33816576 / 1e6  # millions, as its label says
    for text in bx.texts:  # the counts: right of the axis, none inside it
        assert text.xy[0] == 1.0 and text.xycoords is not None and text.xycoords != "data"
    assert "33,816,576 (+0.781%)" in " ".join(t.get_text() for t in bx.texts)
    # no reference total (tinit params without one): the share of this model alone
    fig = plot_params(params, ffn, summary.drop(columns=["reference_total", "saved_frac_reference"]))
    top = next(a for a in fig.axes if a.get_title().startswith("Tying"))
    assert top.get_title().endswith("\n23.2% of this model untied (1.13B)")


def _rgb(c: str) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    return to_rgb(c)


def test_check_table_states_criteria_and_explains_a_pass_with_a_large_error():
    check = pd.DataFrame([
        {"item": "c", "claim": "post-norm gain", "measured": 2.3793, "theory": 1.0, "rel_err": 1.3793,
         "passed": True, "criterion": "nearer theory than 1 (log)",
         "caveat": "the prediction leaves out the branch paths", "detail": ""},
        {"item": "d", "claim": "count", "measured": 65540.0, "theory": 2.62144e8, "rel_err": 0.0,
         "passed": True, "criterion": "exact", "caveat": "", "detail": ""},
    ])  # fmt: skip
    out = _render(check_table(check, "t"))
    assert "+137.93%†" in out and "branch paths" in out and "exact" in out
    assert "6.55e4" in out and "2.62e8" in out and "e+" not in out  # one exponent format a column


def test_fmt_one_exponent_style():
    assert fmt(65540.0) == "6.554e4" and fmt(2.62144e8) == "2.621e8" and fmt(0.5) == "0.5"


def test_grad_norms_table_explains_a_huge_meas_over_pred():
    summary = pd.DataFrame([{"init": "naive", "norm_position": "post", "down_ratio_first_last": 1.0,
                             "down_max_min": 1.0, "o_ratio_first_last": 1.0, "o_max_min": 1.0,
                             "stream_grad_ratio": 9.4e5, "pred_stream_grad_ratio": 6.3e-13,
                             "pred_full_stream_grad_ratio": 8.1e5,
                             "full_stream_grad_ratio_err": 0.16}])  # fmt: skip
    out = _render(grad_norms_table(summary, "t"))
    assert "†" in out and "branch paths" in out


@pytest.mark.parametrize("value", ["5", "8"])  # not swept; the deepest itself
def test_transfer_from_must_be_a_swept_depth_below_the_deepest(tmp_path, value):
    from helpers import assert_one_line_error
    from typer.testing import CliRunner

    from tinit.cli import app

    out = tmp_path / "run"
    args = ["depth-sweep", "--layers", "4,8", "--transfer-from", value, "-o", str(out)]
    res = CliRunner().invoke(app, args)
    assert_one_line_error(res, "--transfer-from", out)


def test_depth_sweep_help_states_the_tolerances_the_code_uses():
    from typer.testing import CliRunner

    from tinit.cli import app

    res = CliRunner().invoke(app, ["depth-sweep", "--help"], env={"COLUMNS": "200"})
    text = " ".join(res.output.split())
    assert f"within 1 +- {TRANSFER_TOL:.0%}" in text and f"within {LAW_TOL:.0%}" in text
    assert "12 (--transfer-from)" in text


def test_norms_plot_one_meaning_per_line_style_and_bar_legend_matches():
    from tinit.results.plot_norms import NORM_STYLES, PASS_STYLES, plot_norms

    timing, ratio = [], []
    for impl in ("eager", "functional", "compiled"):
        for p in ("forward", "forward_backward"):
            for rows, d in ((4, 8), (8, 16)):
                for norm in ("rmsnorm", "layernorm"):
                    saved = {"eager": 1.0, "functional": 1.0, "compiled": 0.000244}[impl]
                    saved *= 2 if norm == "layernorm" else 1
                    n_bytes = rows * d * 4
                    timing.append({"norm": norm, "impl": impl, "pass": p, "rows": rows, "d_model": d,
                                   "available": True, "time_ms": 0.1 * (1 + (norm == "layernorm")),
                                   "saved_bytes_extra": saved * n_bytes, "input_bytes": n_bytes})  # fmt: skip
                ratio.append({"impl": impl, "pass": p, "rows": rows, "d_model": d, "time_ratio": 2.0})
    fig = plot_norms(pd.DataFrame(timing), pd.DataFrame(ratio), "t")
    assert fig.get_figwidth() == pytest.approx(FULL_WIDTH)
    ratio_ax, fwd_ax, fb_ax, bar_ax = fig.axes
    # dashed means forward + backward, and nothing else anywhere
    assert PASS_STYLES["forward_backward"] == "--" and "--" not in NORM_STYLES.values()
    for ax in (fwd_ax, fb_ax):
        assert {ln.get_linestyle() for ln in ax.get_lines()} <= {"-", ":"}
    # the smallest bar (compiled, 0.000244) is visible: a log axis reaching below it
    assert bar_ax.get_yscale() == "log" and bar_ax.get_ylim()[0] < 0.000244
    # the bar legend (one legend under the panels) does not claim an implementation's colour for a norm
    impl_rgb = {_rgb(c) for c in ("#9467bd", "#8c564b", "#17becf")}
    assert not any(a.get_legend() for a in fig.axes)  # none inside a panel, covering data
    (legend,) = fig.legends
    for patch in legend.get_patches():
        assert tuple(round(v, 3) for v in patch.get_facecolor()[:3]) not in {
            tuple(round(v, 3) for v in c) for c in impl_rgb}  # fmt: skip


def _attention_frame(inputs=("unit",)) -> pd.DataFrame:
    rows = []
    for name in inputs:
        for scaled in (False, True):
            for dh in (16, 64):
                pred = 1.0 if scaled else float(dh)
                rows.append({"input": name, "scaled": scaled, "head_dim": dh, "logit_var": pred * 1.01,
                             "logit_var_se": 0.01 * pred, "pred_logit_var": pred, "entropy_rel": 0.5,
                             "max_weight": 0.3, "max_weight_uniform": 0.1})  # fmt: skip
    return pd.DataFrame(rows)


@pytest.mark.parametrize("inputs", [("unit",), ("unit", "model")])
def test_attention_scale_plot_names_the_model_input_only_when_drawn(inputs):
    from tinit.results.plot_attention_scale import plot_attention_scale

    fig = plot_attention_scale(_attention_frame(inputs), "t")
    assert fig.get_figwidth() == pytest.approx(FULL_WIDTH)
    label = fig.axes[0].get_xlabel()
    assert ("model input" in label) == ("model" in inputs)
    entries = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert sum("unit q, k" in e for e in entries) == 2
    assert sum("model at init" in e for e in entries) == (2 if "model" in inputs else 0)


def test_check_variance_short_run_drawn_as_markers_on_the_long_one():
    from tinit.results.report_check import plot_check_variance

    rows = []
    for branch, inits in (("model", ("naive", "scaled")), ("gaussian", ("naive",))):
        for init in inits:
            for L in (12, 80) if branch == "model" else (12,):
                for k in range(2 * L + 1):
                    v = 1.0 + 0.01 * k * (1 if init == "naive" else 0.05)
                    rows.append({"branch": branch, "init": init, "n_layers": L, "k": k, "stream_var": v,
                                 "pred_cumulative": v, "cov_z": 0.1})  # fmt: skip
    fig = plot_check_variance(pd.DataFrame(rows), 0.01, "t")
    assert fig.get_figwidth() == pytest.approx(FULL_WIDTH)
    m = _lines(fig, "measured:")
    assert set(m) == {"naive/12", "naive/80", "scaled/12", "scaled/80"}
    assert m["naive/12"].get_linestyle() == "None" and m["naive/12"].get_marker() == "o"
    # the open markers show on the long line: pixels the line paints are white (the
    # markers' faces) once the short run is drawn
    full = _pixels(_settled(fig))
    m["naive/12"].set_visible(False)
    without = _pixels(fig)
    assert ((full.min(axis=-1) > 230) & (without.min(axis=-1) < 150)).sum() >= 10
    assert "share their draws" in _footnote(fig)


# --- placements, the catalogue's schemes, rank collapse, off-scale configurations -------------------


def _config_frame(configs, L: int = 4, rank: bool = True, grow: dict | None = None) -> pd.DataFrame:
    """Hand-built variance rows: v_k = v0 + k s2 (post-norm: 1 after the first norm), with
    s2 per configuration from its index (so no two lie on top of each other); ``grow``: a
    factor per configuration multiplying v_k by factor^k (inf makes it overflow)."""
    rows = []
    grow = grow or {}
    for j, (init, pos) in enumerate(configs):
        v0, s2 = 1e-3, 1e-3 * 1.5**j
        for k in range(2 * L + 1):
            layer, sub = (-1, "embed") if k == 0 else ((k - 1) // 2, "attn" if k % 2 else "ffn")
            v = (1.0 + 0.01 * j if k else v0) if pos == "post" else v0 + k * s2
            f = grow.get((init, pos), 1.0)
            v = v * f**k if math.isfinite(f) else (math.inf if k > L else v)
            rows.append({
                "init": init, "norm_position": pos, "n_layers": L, "seed": 0, "k": k, "layer": layer,
                "sublayer": sub, "stream_var": v, "branch_var": math.nan if k == 0 else s2, "cross_corr": 0.0,
                "stream_var_rel": v / v0, "pred_cumulative": v, "pred_closed": v,
                "stream_var_normed": math.nan,
                **({"cos_sim": min(1.0, 0.1 * k), "res_ratio": 1 / (1 + k)} if rank else {}),
            })  # fmt: skip
    return pd.DataFrame(rows)


def _visible(line) -> bool:
    """The line's finite points all lie inside its axes' y limits."""
    lo, hi = line.axes.get_ylim()
    y = np.asarray(line.get_ydata(), dtype=float)
    y = y[np.isfinite(y)]
    return y.size > 0 and lo <= y.min() and y.max() <= hi and line.get_visible()


def test_variance_plot_has_a_law_panel_per_placement_and_every_line_visible():
    placements = ("pre", "post", "sandwich", "reordered", "none")
    configs = [(i, p) for p in placements for i in ("naive", "scaled")]
    fig = plot_variance(_config_frame(configs), "five placements")
    assert fig.get_figwidth() == pytest.approx(FULL_WIDTH)
    measured = _lines(fig, "measured:")
    assert set(measured) == {f"{i}/{p}" for i, p in configs}
    # one stream panel per placement, each holding exactly its two configurations
    panels = {}
    for name, line in measured.items():
        assert _visible(line), name
        panels.setdefault(line.axes, set()).add(name.split("/")[1])
    assert sorted(len(v) for v in panels.values()) == [1] * 5
    assert {ax.get_title() for ax in panels} >= {"Pre-norm", "Sandwich norm", "No norm"}
    # within a panel the two configurations have different colours; across panels a scheme's
    # placements differ by colour shade or marker
    styles = {n: (line.get_color(), line.get_marker()) for n, line in measured.items()}
    assert len(set(styles.values())) == len(styles)
    # the classic four keep their colours
    assert _rgb(measured["naive/pre"].get_color()) == _rgb("#d62728")
    assert _rgb(measured["scaled/post"].get_color()) == _rgb("#2ca02c")


def test_variance_plot_with_every_catalogue_scheme():
    from tinit.model.catalogue import CATALOGUE

    configs = [(name, "pre") for name in CATALOGUE]
    fig = plot_variance(_config_frame(configs, rank=False), "all schemes")
    measured = _lines(fig, "measured:")
    assert set(measured) == {f"{n}/pre" for n in CATALOGUE}
    assert all(_visible(line) for line in measured.values())
    colours = {_rgb(line.get_color()) for line in measured.values()}
    assert len(colours) == len(CATALOGUE)  # one colour per scheme
    key = [ax for ax in fig.axes if not ax.axison][-1].get_legend()
    assert {t.get_text() for t in key.get_texts()} == set(CATALOGUE)  # one placement: the scheme names
    # several columns: the legend fits under a 7-inch figure (27 schemes; the longest names,
    # deepnet-torchscale and olmo-llama-depth, leave room for three: checked by eye)
    assert key._ncols >= 3
    assert not _lines(fig, "cos_sim:")  # no rank columns, no rank panel
    # the same scheme has the same colour in another figure
    gn = pd.DataFrame([
        {"init": n, "norm_position": "pre", "layer": layer, "tensor": t, "grad_norm": 1.0 + j}
        for j, n in enumerate(CATALOGUE) for layer in range(3) for t in ("down", "o")
    ])  # fmt: skip
    g = _lines(plot_grad_norms(gn, "both"), "measured:")
    for name, line in measured.items():
        assert _rgb(g[name].get_color()) == _rgb(line.get_color()), name


def test_variance_plot_rank_panel_when_the_columns_are_there():
    configs = [("naive", "pre"), ("gpt2", "pre")]
    fig = plot_variance(_config_frame(configs), "rank")
    cos, res = _lines(fig, "cos_sim:"), _lines(fig, "res_ratio:")
    assert set(cos) == set(res) == {"naive/pre", "gpt2/pre"}
    ax = cos["naive/pre"].axes
    assert "Rank collapse" in ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    # the y label names each line by its style, as drawn (it read "cosine (1) / residual
    # ratio (0): collapsed at"); where each means collapse is the legend's
    assert " ".join(ax.get_ylabel().split()) == "cosine (solid) / residual ratio (dash-dot)"
    assert cos["naive/pre"].get_linestyle() == "-" and res["naive/pre"].get_linestyle() == "-."
    lo, hi = ax.get_ylim()
    assert lo <= 0.0 and hi >= 1.0  # both measures' whole range
    assert res["naive/pre"].get_linestyle() != "--"  # dashed means theory in every tinit figure


def test_variance_plot_off_scale_configuration_excluded_and_named():
    configs = [("naive", "pre"), ("gpt2", "pre"), ("deepnet", "pre"), ("mitchell", "pre")]
    frame = _config_frame(configs, L=6, grow={("deepnet", "pre"): math.inf, ("mitchell", "pre"): 100.0})
    fig = plot_variance(frame, "off scale")
    measured = _lines(fig, "measured:")
    ax = measured["naive/pre"].axes
    lo, hi = ax.get_ylim()
    # naive's and gpt2's v_k are at most 1e-3 + 12 * 1.5e-3 = 0.019: the axis is theirs, not
    # mitchell's 100^12 growth (1e21) nor deepnet's overflow
    assert hi < 1.0
    assert _visible(measured["naive/pre"]) and _visible(measured["gpt2/pre"])
    note = _footnote(fig)
    assert "off scale" in note and "deepnet/pre (overflow)" in note and "mitchell/pre (grows past" in note
    key = [a for a in fig.axes if not a.axison][-1].get_legend()
    texts = {t.get_text() for t in key.get_texts()}
    assert {"deepnet init, pre-norm (off scale)", "mitchell init, pre-norm (off scale)"} <= texts
    assert "naive init, pre-norm" in texts


def test_depth_sweep_draws_each_schemes_closed_form_curve_from_the_theory_frame():
    res = assemble(_sweep_records(), [("naive", "pre"), ("scaled", "pre")], ModelConfig())
    summary, fit = res["depth_sweep_summary"], res["depth_sweep_fit"]
    # a hand-made theory frame: naive grows 2L * 0.01 over v0 = 1, scaled stays at 0.01
    depths = np.arange(1, 25)
    theory = pd.DataFrame([{"init": i, "norm_position": "pre", "n_layers": int(L),
                            "theory_v_final": 1 + g, "theory_v_final_rel": 1 + g, "theory_v_growth": g}
                           for i in ("naive", "scaled") for L in depths
                           for g in [0.02 * L if i == "naive" else 0.01]])  # fmt: skip
    fig = plot_depth_sweep(summary, fit, "t", theory)
    closed = _lines(fig, "closed:")
    assert set(closed) == {"naive/pre", "scaled/pre"}
    assert np.allclose(closed["naive/pre"].get_xdata(), depths)
    assert np.allclose(closed["naive/pre"].get_ydata(), 0.02 * depths)
    assert np.allclose(closed["scaled/pre"].get_ydata(), 0.01)
    measured = _lines(fig, "measured:")
    assert closed["naive/pre"].get_linestyle() != measured["naive/pre"].get_linestyle()
    assert "v_{2L} - v_0" in closed["naive/pre"].axes.get_ylabel()
    assert closed["naive/pre"].axes.get_xscale() == "log"  # depths 1..24
    text = " ".join(t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts())
    assert "closed form" in text
    assert not _lines(plot_depth_sweep(summary, fit, "t"), "closed:")  # no frame, no curves


def test_claims_figure_resolves_differences_of_hundredths_of_a_nat():
    """Final losses near the entropy floor differ by a few hundredths of a nat: the claims
    figure's axis must span the data (a bar chart from 0 nats hid them), and every seed's
    loss must be drawn where it was measured."""
    from tinit.results.plot_train import plot_claims

    losses = {"a": (0.851, 0.853), "b": (0.871, 0.902)}
    runs = pd.DataFrame(
        [
            {"configuration": name, "init": "scaled", "norm_position": "pre", "seed": s, "diverged": False,
             "initial_eval_loss": 4.1, "final_eval_loss": loss}
            for name, pair in losses.items() for s, loss in enumerate(pair)
        ]
    )  # fmt: skip
    fig = plot_claims(runs, floor=0.826)
    FigureCanvasAgg(fig).draw()
    (ax,) = [a for a in fig.axes if a.get_title() == "Final loss per claim configuration"]
    lo, hi = ax.get_xlim()
    assert lo > 0.8 and hi < 0.95  # the floor and the data, not 0..1
    drawn = sorted(float(x) for line in ax.lines for x in line.get_xdata() if line.get_marker() == "s")
    assert drawn == pytest.approx(sorted(v for pair in losses.values() for v in pair))


def test_the_rows_quantile_of_coincidences_is_numpys_nanquantile():
    """coincidences' vectorised 80% quantile over each row's non-NaN distances equals
    np.nanquantile exactly (rows with NaNs, rows of one value, rows with none)."""
    import warnings

    from tinit.results.style import _finite_quantile_rows

    rng = np.random.default_rng(7)
    for _ in range(400):
        d = np.abs(rng.standard_normal((int(rng.integers(1, 6)), int(rng.integers(1, 120)))))
        d *= 10 ** rng.uniform(-6, 2)
        d[rng.random(d.shape) < rng.uniform(0, 0.7)] = np.nan
        d[0, :] = np.nan if rng.random() < 0.2 else d[0, :]  # sometimes a row with no distance
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # (numpy's all-NaN warning)
            want = np.nanquantile(d, 0.8, axis=-1)
        assert np.array_equal(_finite_quantile_rows(d, 0.8), want, equal_nan=True)
