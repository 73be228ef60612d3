"""Guards what a reader sees (issue 30, the new user's findings), each against numbers
that do not come from the code under test:

- audit's terminal gives the stream's answer (v_0, v_2L, their ratio, the law from the
  measured branch variances), computed here from its own variance.csv; it names a
  scheme as the user did (gpt2, not scaled), and its variance.png draws no
  "closed form" line, for none was computed; the figure defines the law's a and g;
- check's figure states the same gap as its table's err (measured / law - 1);
- train with two schemes pairs them by seed (compare.csv against a paired mean, SE and
  t interval computed here from runs.csv), and at one depth draws no final_vs_depth.png;
- the variance table's second error prints "=" where it equals the first, and says why;
- lr-sweep's one-seed "not resolved" says why (t at 1 degree of freedom);
- params.png gives one colour one meaning;
- a summary written to a file keeps each row whole (no label split over lines);
- options.md says which commands take --preset and --dtype, as the app does.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
import pytest
from helpers import figures_built_not_saved
from typer.testing import CliRunner

from tinit.cli import app

ROOT = Path(__file__).resolve().parents[1]
MODELS = str(Path(__file__).resolve().parent / "audit_models.py")
S = ["--d-model", "32", "--heads", "2", "--seq-len", "16", "--batch", "2"]
#: Student-t two-sided 95% quantiles (a printed table's values, not tinit's bisection).
T975 = {1: 12.706204736174707, 2: 4.302652729749464, 3: 3.182446305284263, 4: 2.7764451051977987}
runner = CliRunner()


def _capture(monkeypatch, render: bool = True) -> dict:
    """The figures a command saves, by stem (the runner imports save_figure when it draws);
    ``render`` False: built, not rendered, their files made empty (as
    :func:`helpers.figures_built_not_saved`), for tests that read the figure's artists."""
    from tinit.results import plots

    figures, real = {}, plots.save_figure

    def save(fig, run_dir, stem, formats=("png",)):
        figures[stem] = fig
        if render:
            return real(fig, run_dir, stem, formats)
        paths = [Path(run_dir) / f"{stem}.{fmt}" for fmt in formats]
        for path in paths:
            path.touch()
        return paths

    monkeypatch.setattr(plots, "save_figure", save)
    return figures


def _texts(fig) -> str:
    parts = [t.get_text() for t in fig.texts]
    for ax in fig.get_axes():
        leg = ax.get_legend()
        if leg is not None:
            parts += [t.get_text() for t in leg.get_texts()]
    for sub in getattr(fig, "subfigs", []):
        parts += [t.get_text() for leg in sub.legends for t in leg.get_texts()]
    parts += [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    return " ".join(" ".join(parts).split())  # (notes are wrapped to the figure's width)


# --- audit -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    out = tmp_path_factory.mktemp("audit") / "run"
    with pytest.MonkeyPatch.context() as mp:
        # the artists are read; audit's PNGs: tests/test_audit_module.py's test_cli_exit_codes_and_report
        figures = _capture(mp, render=False)
        args = [
            "audit",
            "--module",
            f"{MODELS}:tinit_model",
            "--init",
            "gpt2",
            "--seq-len",
            "8",
            "--batch",
            "2",
        ]
        res = runner.invoke(app, [*args, "--no-grads", "--out", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    return res.stdout, out, figures


def test_audit_terminal_gives_the_stream_answer(audited):
    from tinit.results.tables import fmt

    stdout, out, _ = audited
    var = pd.read_csv(out / "variance.csv")
    assert list(dict.fromkeys(var["init"])) == ["as-built", "gpt2"]
    for init, g in var.groupby("init", sort=False):
        g = g.sort_values("k")
        v0, v2l = float(g["stream_var"].iloc[0]), float(g["stream_var"].iloc[-1])
        law = v0 + float(g["branch_var"].iloc[1:].sum())  # pre-norm, a = g = 1: v0 + sum s_k^2
        L = int(g["layer"].max()) + 1
        line = next(ln for ln in stdout.splitlines() if ln.startswith(f"Stream ({init}, L={L})"))
        assert f"v_0 = {fmt(v0)}" in line and f"v_2L = {fmt(v2l)}" in line, line
        assert f"({fmt(v2l / v0, 3)} x v_0)" in line, line
        assert f"predicts {fmt(law)} ({100 * (v2l / law - 1):+.1f}%" in line, line
    # after the weight verdict, as its answer's second half
    assert stdout.index("PASS") < stdout.index("Stream (as-built")


def test_audit_names_the_scheme_as_the_user_did(audited):
    stdout, out, _ = audited
    assert "scaled" not in stdout
    assert list(pd.read_csv(out / "summary.csv")["init"]) == ["as-built", "gpt2"]
    assert json.loads((out / "config.json").read_text())["scheme"] == "gpt2"
    assert "scheme `gpt2`" in (out / "audit.md").read_text()


def test_audit_variance_draws_no_closed_form(audited):
    _, _, figures = audited
    fig = figures["variance"]
    gids = [ln.get_gid() or "" for ax in fig.get_axes() for ln in ax.get_lines()]
    assert any(g.startswith("theory:") for g in gids)  # the law from the measured s_k^2 is drawn
    assert not any(g.startswith("closed:") for g in gids), gids
    text = _texts(fig)
    assert "closed form" not in text.replace("no closed form drawn", "").replace("closed form;", ""), text
    assert "no closed form drawn" in text
    assert "a = stream multiplier" in text and "g = branch multiplier" in text


# --- check -------------------------------------------------------------------------------


def test_check_figure_states_the_tables_gap():
    """The table's err is measured / theory - 1; the figure's note gave law / measured
    - 1 (-19.42% in the table, +24% in the figure for the same gap)."""
    from tinit.results.report_check import check_table, plot_check_variance

    k = np.arange(5)
    variance = pd.DataFrame({"branch": "model", "init": "naive", "n_layers": 2, "k": k,
                             "stream_var": [1.0, 0.95, 0.9, 0.85, 0.8], "pred_cumulative": 1.0,
                             "cov_z": 0.0})  # fmt: skip
    fig = plot_check_variance(variance, 0.01)
    text = _texts(fig)
    assert "-20.00%" in text and "+25" not in text, text  # 0.8 / 1.0 - 1
    row = {"item": "a", "claim": "c", "measured": 0.8, "theory": 1.0, "rel_err": 0.8 / 1.0 - 1}
    check = pd.DataFrame([{**row, "passed": True, "criterion": "", "caveat": ""}])
    assert check_table(check, "t").columns[4]._cells[0] == "-20.00%"


# --- train -------------------------------------------------------------------------------


TRAIN = ["train", *S, "--vocab", "64", "--steps", "6", "--eval-every", "3", "--eval-batches", "1",
         "--pre-norm", "--lr", "1e-2", "--warmup", "0"]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "run"
    with pytest.MonkeyPatch.context() as mp:
        figures = _capture(mp)
        args = [*TRAIN, "--layers", "2", "--init", "naive,gpt2,zero-out", "--seeds", "3"]
        res = runner.invoke(app, [*args, "--out", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    return res.stdout, out, figures


def test_train_pairs_schemes_by_seed(trained):
    stdout, out, _ = trained
    runs = pd.read_csv(out / "runs.csv")
    cmp = pd.read_csv(out / "compare.csv")
    assert list(cmp["init"]) == ["gpt2", "zero-out"] and set(cmp["baseline"]) == {"naive"}
    base = runs[runs["init"] == "naive"].set_index("seed")["final_eval_loss"]
    for r in cmp.itertuples(index=False):
        other = runs[runs["init"] == r.init].set_index("seed")["final_eval_loss"]
        d = np.array([other[s] - base[s] for s in sorted(base.index)])
        n = len(d)
        mean, se = d.sum() / n, math.sqrt(((d - d.sum() / n) ** 2).sum() / (n - 1) / n)
        assert r.pairs == n == 3
        # runs.csv holds 9 significant digits of losses near 3: each d is known to ~1e-8
        close = {"rel": 0, "abs": 2e-8}
        assert r.diff_mean == pytest.approx(mean, **close)
        assert r.diff_se == pytest.approx(se, **close)
        assert r.ci_low == pytest.approx(mean - T975[n - 1] * se, abs=T975[n - 1] * 2e-8)
        assert r.ci_high == pytest.approx(mean + T975[n - 1] * se, abs=T975[n - 1] * 2e-8)
        lo, hi = mean - T975[n - 1] * se, mean + T975[n - 1] * se
        assert r.verdict == ("lower" if hi < 0 else "higher" if lo > 0 else "no difference resolved")
        row = next(ln for ln in stdout.splitlines() if ln.startswith(f"{r.init} ") and " naive " in ln)
        assert r.verdict in row, row
    assert "excludes 0" in stdout  # the criterion, printed with the verdicts


def test_train_at_one_depth_draws_no_final_vs_depth(trained):
    _, out, figures = trained
    assert "final_vs_depth" not in figures and not (out / "final_vs_depth.png").exists()
    assert "loss_curves" in figures
    assert json.loads((out / "config.json").read_text())["complete"] is True


def test_train_one_scheme_or_one_seed(tmp_path, monkeypatch):
    """One configuration: no comparison, and its table row named by what it is (it was
    "run"). Four: every panel of variance_during_training.png labels its own k axis (the
    first had none, the panel under it had)."""
    figures = _capture(monkeypatch, render=False)  # (the trained fixture renders the training PNGs)
    out = tmp_path / "one"
    res = runner.invoke(
        app, [*TRAIN, "--layers", "2", "--init", "gpt2", "--out", str(out)], env={"COLUMNS": "200"}
    )
    assert res.exit_code == 0, res.output
    assert not (out / "compare.csv").exists()
    lines = res.stdout.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["config", "seeds"])
    row = lines[header + 2]  # (under the header's rule)
    assert row.split("  ")[0] == "gpt2, pre-norm, L=2", row
    out = tmp_path / "two"
    res = runner.invoke(app, [*TRAIN, "--init", "naive,gpt2", "--layers", "1,2", "--out", str(out)],
                        env={"COLUMNS": "200"})  # fmt: skip
    assert res.exit_code == 0, res.output
    cmp = pd.read_csv(out / "compare.csv", keep_default_na=False)
    assert list(cmp["verdict"]) == ["too few seeds"] * 2 and list(cmp["diff_se"]) == ["", ""]
    assert (out / "final_vs_depth.png").is_file()  # two depths: drawn
    panels = [a for a in figures["variance_during_training"].axes if a.get_visible() and a.axison]
    assert len(panels) == 4 and all(a.get_xlabel() == "addition k (0: embedding)" for a in panels)


# --- variance table, lr-sweep note, params colours -----------------------------------------


def test_variance_table_says_when_the_two_errors_are_one(tmp_path, monkeypatch):
    figures_built_not_saved(monkeypatch)  # (the table is read; variance.png: test_cli_variance.py)
    out = tmp_path / "v"
    res = runner.invoke(app, ["variance", "--layers", "2", *S, "--out", str(out)], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    summ = pd.read_csv(out / "summary.csv")
    for r in summ.itertuples(index=False):
        closed = f"{100 * (r.v_final / r.pred_closed_final - 1):+.2f}%"
        cumul = f"{100 * (r.v_final / r.pred_cumulative_final - 1):+.2f}%"
        cells = next(ln for ln in res.stdout.splitlines() if ln.startswith(f"{r.init}/{r.norm_position} "))
        cells = cells.split()
        assert cells[5] == closed
        assert cells[6] == ("=" if closed == cumul else cumul), cells
    assert (summ["norm_position"] == "pre").any()
    assert "=: as err" in " ".join(res.stdout.split())


def test_lr_sweep_one_seed_says_why_not_resolved():
    from tinit.experiments.training.lr_sweep import lr_drift

    optima = pd.DataFrame({"init": "gpt2", "norm_position": "pre", "warmup": 30, "d_model": 48, "seed": 0,
                           "n_layers": [2, 4, 8], "log2_lr_opt": [-6.1, -6.2, -6.1],
                           "interior": True})  # fmt: skip
    row = lr_drift(optima).iloc[0]
    assert row["verdict"] == "not resolved" and row["se_method"] == "regression"
    assert "one seed" in row["note"] and f"t = {T975[1]:.3g}" in row["note"] and "--seeds 3" in row["note"]


def test_params_figure_one_colour_one_meaning(monkeypatch, tmp_path):
    figures = _capture(monkeypatch, render=False)  # (params.png: test_params.py renders it)
    res = runner.invoke(app, ["params", "--out", str(tmp_path / "p"), "-q"])
    assert res.exit_code == 0, res.output
    fig = figures["params"]
    meaning: dict[str, str] = {}
    legends = [leg for sub in fig.subfigs for leg in sub.legends]
    for leg in legends:
        for handle, text in zip(leg.legend_handles, leg.get_texts(), strict=True):
            if hasattr(handle, "get_facecolor") and not hasattr(handle, "get_xdata"):
                color = mpl.colors.to_hex(handle.get_facecolor())
                label = text.get_text().split(" (")[0]
                assert meaning.setdefault(color, label) == label, (color, meaning[color], label)
    assert len(meaning) >= 4


# --- a summary written to a file -------------------------------------------------------------


def test_summary_in_a_file_keeps_rows_whole(tmp_path, monkeypatch):
    """With stdout a file and $COLUMNS unset, rich laid tables out at 80 columns and a
    long claim wrapped over three lines; every claim is now on its row's line. Run in
    this process: CliRunner's output, like a file, is not a terminal (rich's Console
    decides the width from that and $COLUMNS alone: tinit.results.tables.output_console),
    and the figures are built, not rendered (the printed text is what is read)."""
    figures_built_not_saved(monkeypatch)
    out = tmp_path / "c"
    res = runner.invoke(app, ["check", "--layers", "2", "--deep-layers", "4", *S, "--out", str(out)],
                        env={"COLUMNS": None})  # fmt: skip
    assert res.exit_code in (0, 1), res.output  # check's verdict may fail at tiny sizes
    printed = res.stdout
    claims = pd.read_csv(out / "check.csv")["claim"]
    lines = printed.splitlines()
    for claim in claims:
        assert any(claim in ln for ln in lines), (claim, printed)


# --- options.md --------------------------------------------------------------------------------


def test_options_page_says_who_takes_preset_and_dtype():
    import typer

    page = (ROOT / "docs" / "reference" / "options.md").read_text()
    commands = typer.main.get_command(app).commands
    for option in ("--preset", "--dtype"):
        row = re.search(rf"^\| `{option}` \| [^|]* \| ([^|]+) \|", page, re.M)
        assert row, option
        listed = {c.strip().split(" (")[0] for c in row.group(1).split(",")}
        takes = {name for name, c in commands.items() if name != "sweep"
                 and option in {o for p in c.params for o in getattr(p, "opts", [])}}  # fmt: skip
        assert listed == takes, (option, listed ^ takes)
    assert "Every command takes `--preset" not in page
