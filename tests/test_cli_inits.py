"""Guards the catalogue's command line: `tinit inits` and `tinit inits NAME`, `--init`
lists and `all`, `--norm-position`, `--init-file` (a whitelist parser, errors naming the
file and the role, exit 2), the README's catalogue table against the data, and the
reference page's columns and --init-file example."""

import math

import pandas as pd
import pytest
from helpers import (
    ROOT,
    assert_one_line_error,
    figures_built_not_saved,
    final_result_only,
    reference_page,
    tiny,
)
from typer.testing import CliRunner

from tinit.cli import app
from tinit.experiments.measure.inits import INITS_COLUMNS, STDS_COLUMNS, catalogue_markdown
from tinit.model.catalogue import CATALOGUE
from tinit.model.formula import Formula, FormulaError

runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_png(monkeypatch):
    """Every run here is asserted on its CSVs, config.json and exit code: its figures are
    built, not rendered (tests/test_reader_rules.py draws every command's, variance and
    grad-norms of every scheme and `inits NAME` among them), and no result so far is
    re-assembled after each unit (30 of them for `--init all`; tests/test_run_promises.py
    and test_hostile_train.py hold the partial results to their rules)."""
    figures_built_not_saved(monkeypatch)
    final_result_only(monkeypatch)


TINY = tiny(2)  # the tiny model at 2 layers


def test_inits_writes_the_catalogue(tmp_path):
    res = runner.invoke(app, ["inits", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(tmp_path / "a" / "inits.csv")
    assert list(df.columns) == INITS_COLUMNS
    assert list(df["name"]) == list(CATALOGUE)
    assert df.set_index("name").loc["gpt2", "aliases"] == "scaled"


def test_inits_name_writes_stds_per_role_and_layer(tmp_path):
    out = tmp_path / "b"
    args = ["inits", "depth-init", "--layers", "4", "--d-model", "64", "--out", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out / "init_stds.csv")
    assert list(df.columns) == STDS_COLUMNS
    o = df[df["role"] == "o"].set_index("layer")["std"]
    assert list(o.index) == [0, 1, 2, 3]
    for layer, std in o.items():  # torchtitan: 0.02 / sqrt(2 (layer_id + 1))
        assert std == pytest.approx(0.02 / math.sqrt(2 * (layer + 1)))
    assert set(df.loc[df["role"] == "q", "distribution"]) == {"trunc"}
    assert set(df.loc[df["role"] == "q", "bound"]) == {2.0}


def test_bad_scheme_names_are_one_line_errors(tmp_path):
    res = runner.invoke(app, ["inits", "nope", "--out", str(tmp_path / "c")])
    assert_one_line_error(res, "NAME", tmp_path / "c")
    res = runner.invoke(app, ["variance", *TINY, "--init", "naive,nope", "--out", str(tmp_path / "d")])
    assert_one_line_error(res, "--init", tmp_path / "d")
    args = ["variance", *TINY, "--norm-position", "pre,middle", "--out", str(tmp_path / "e")]
    res = runner.invoke(app, args)
    assert_one_line_error(res, "--norm-position", tmp_path / "e")


def test_variance_all_schemes_one_row_each(tmp_path):
    out = tmp_path / "all"
    res = runner.invoke(app, ["variance", *TINY, "--init", "all", "--pre-norm", "--out", str(out)])
    assert res.exit_code == 0, res.output
    s = pd.read_csv(out / "summary.csv")
    assert list(s["init"]) == list(CATALOGUE) and set(s["norm_position"]) == {"pre"}
    v = pd.read_csv(out / "variance.csv")
    assert (v.groupby("init")["k"].max() == 4).all()  # every one of the 2L additions, every scheme


def test_norm_position_list_runs_every_placement(tmp_path):
    out = tmp_path / "np"
    placements = "sandwich,reordered,none"
    args = ["variance", *TINY, "--init", "naive", "--norm-position", placements, "--out", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    v = pd.read_csv(out / "variance.csv")
    assert list(dict.fromkeys(v["norm_position"])) == ["sandwich", "reordered", "none"]
    assert (v.groupby("norm_position")["k"].nunique() == 5).all()


def test_formula_whitelist():
    assert Formula("sigma / sqrt(2 * L)")(sigma=0.02, L=8) == pytest.approx(0.005)
    assert Formula("2 ^ 3 * d")(d=2) == 16  # ^ is power, with power's precedence
    assert Formula("(9 * L)^(-1/4)")(L=1) == pytest.approx(9**-0.25)
    for bad in ("__import__('os')", "sigma.real", "[1][0]", "x", "sigma if L else 1", "open", "1 < 2",
                "lambda: 1", "sigma +"):  # fmt: skip
        with pytest.raises(FormulaError):
            Formula(bad)
    with pytest.raises(FormulaError):
        Formula("1 / (L - 1)")(L=1)
    with pytest.raises(FormulaError):
        Formula("log(0 * L)")(L=1)


def _write(tmp_path, text):
    path = tmp_path / "my.toml"
    path.write_text(text)
    return path


def test_init_file_scheme_runs_and_matches_its_formula(tmp_path):
    path = _write(tmp_path, 'name = "halfway"\n[roles]\no = "sigma / sqrt(2 * (l + 1))"\n'
                            'down = { std = "0", dist = "zero" }\n')  # fmt: skip
    out = tmp_path / "run"
    res = runner.invoke(app, ["inits", "--init-file", str(path), "--layers", "3", "--out", str(out)])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out / "init_stds.csv")
    o = df[df["role"] == "o"].set_index("layer")["std"]
    assert [o[i] for i in range(3)] == pytest.approx([0.02 / math.sqrt(2 * (i + 1)) for i in range(3)])
    assert set(df.loc[df["role"] == "down", "distribution"]) == {"zero"}
    out2 = tmp_path / "var"
    res = runner.invoke(app, ["variance", *TINY, "--init-file", str(path), "--pre-norm", "--out", str(out2)])
    assert res.exit_code == 0, res.output
    assert list(pd.read_csv(out2 / "summary.csv")["init"]) == ["halfway"]


@pytest.mark.parametrize(
    "text,words",
    [
        ('name = "a1"\n[roles]\no = "sigma / sqrt(2 * L"\n', ["role o", "does not parse"]),
        ('name = "a2"\n[roles]\no = "sigma * depth"\n', ["role o", "unknown variable 'depth'"]),
        ('name = "a3"\n[roles]\no = "-sigma"\n', ["role o", "negative"]),
        ('name = "a4"\n[roles]\ndown = "1 / (L - 1)"\n', ["role down"]),
        ("name = \"a5\"\n[roles]\no = \"__import__('os').system('true')\"\n", ["role o"]),
        ('name = "a6"\n[roles]\nwq = "sigma"\n', ["role wq", "unknown role"]),
        ('name = "naive"\n', ["name", "taken by the catalogue"]),
        ("name = \n", ["not valid TOML"]),
    ],
)
def test_init_file_errors_name_the_file_and_the_role(tmp_path, text, words):
    path = _write(tmp_path, text)
    res = runner.invoke(app, ["variance", *TINY, "--init-file", str(path), "--out", str(tmp_path / "x")])
    assert_one_line_error(res, "--init-file", tmp_path / "x")
    line = res.stderr.strip()
    assert str(path) in line
    for w in words:
        assert w in line, line


def test_readme_catalogue_table_is_the_data():
    assert catalogue_markdown() in (ROOT / "README.md").read_text()


def test_reference_documents_the_csvs_placements_and_the_init_file():
    page = reference_page("inits")
    flat = " ".join(page.split())
    assert "`inits.csv` columns: `" + ", ".join(INITS_COLUMNS) + "`" in flat
    assert "`init_stds.csv`" in page
    for col in STDS_COLUMNS:
        assert f"`{col}`" in page, col
    assert "--init-file" in page and "[roles]" in page and "| `sandwich` |" in page


def test_every_scheme_writes_no_nan_in_a_healthy_depth_sweep():
    """A depth sweep of every scheme at a healthy shape flags no value: the cells some
    schemes leave empty by design (a zero-initialised output's correlation, ReZero's W_down
    gradient ratio, the normalised stream of placements other than post, the fit and
    transfer at two depths) are declared not applicable, so a `nan` in a CSV always means
    a measurement that went wrong. Counted as config.json counts them
    (:func:`non_finite_counts` over the result's frames, the writer's own function), on
    the experiment itself: through the command every point's partial result re-assembled
    and re-wrote every CSV and drew every scheme's panels (52 s). variance and grad-norms
    of every scheme are held to the same rule through the command, config.json and the
    CSVs, by tests/test_reader_rules.py (variance_all, grad_norms_all)."""
    from tinit.experiments.measure.depth_sweep import run_depth_sweep
    from tinit.model.config import InitConfig, ModelConfig, RunConfig
    from tinit.results.rundir import non_finite_counts

    model = ModelConfig(d_model=32, n_heads=2, vocab_size=32, max_seq_len=8)
    every = list(CATALOGUE)  # (not `all`: another test may have registered a user's scheme)
    res = run_depth_sweep(model, InitConfig(), RunConfig(batch=2, seq_len=8, device="cpu"), (1, 2), 1, every)
    assert res.complete and set(res["depth_sweep"]["init"]) == set(every)
    assert res["depth_sweep"]["grad_ratio"].notna().any()  # gradients measured, not skipped
    assert non_finite_counts(res.frames, res.not_applicable) == {}
    assert non_finite_counts(res.frames) != {}  # the empty-by-design cells are there: this can fail


def test_a_scheme_without_closed_form_leaves_its_theory_cells_empty(tmp_path):
    """The documented --init-file scheme declares no depth factor, so it has no closed form:
    depth-sweep leaves its theory cells empty (not applicable) rather than writing nan."""
    import json
    import re

    toml = re.search(r"```toml\n(.*?)```", reference_page("inits"), flags=re.S).group(1)
    init_file = tmp_path / "my_init.toml"
    init_file.write_text(toml)
    shape = ["--d-model", "32", "--heads", "2", "--seq-len", "8", "--batch", "2", "--vocab", "32"]
    out = tmp_path / "run"
    args = ["depth-sweep", "--init-file", str(init_file), "--layers", "1,2", "--seeds", "2", *shape]
    res = runner.invoke(app, [*args, "-q", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "config.json").read_text())["non_finite_total"] == 0
    theory = pd.read_csv(out / "depth_sweep_theory.csv")
    assert theory["theory_v_final"].isna().all()  # empty: there is no closed form to draw
