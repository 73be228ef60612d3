"""Issue 30, "a user's scheme is lost or wrong": each case reproduced with the real
command. Case 3: any TOML scheme crashed `train` and `lr-sweep` (internal KeyError:
unknown init scheme), in `sweep lr-sweep` points and in `run_train` too. Case 4:
--init-file was ignored by coord-check and lr-sweep, and `--init X --init-file F`
dropped F everywhere. Case 5: `[optimizer.<group>]` formulas were checked at three
fixed shapes, not the run's: `(L-2)^2` trained with lr 0 at --layers 2, `tied - 0.5`
gave a negative lr with --untie, `1/(d-32)` stopped at d = 32 with a FormulaError."""

import itertools
import json
from pathlib import Path

import pandas as pd
import pytest
from helpers import assert_one_line_error, figures_built_not_saved, final_result_only
from typer.testing import CliRunner

from tinit.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_png(monkeypatch):
    """Every test here asserts on a finished run's CSVs, config.json and exit code: its
    figures are built, not rendered (tests/test_reader_rules.py draws every command's),
    and no result so far is re-assembled after each unit (tests/test_run_promises.py and
    test_hostile_train.py hold the partial results to their rules)."""
    figures_built_not_saved(monkeypatch)
    final_result_only(monkeypatch)


#: the in-process sweeps' workers come from one preloaded fork server (conftest)
pytestmark = pytest.mark.usefixtures("shared_fork_server")


M = ["--d-model", "32", "--heads", "2", "--seq-len", "16", "--batch", "2", "--vocab", "64"]
SHORT = ["--layers", "2", "--steps", "2", "--eval-every", "1", "--eval-batches", "1"]
_names = itertools.count()

#: A scheme with an init rule and an optimizer rule: muP's hidden-matrix lr d0/d.
OPT_OK = '[roles]\no = "sigma / sqrt(2 * L)"\n[optimizer.hidden_matrix]\nlr = "d0 / d"\n'


def scheme_file(tmp_path: Path, body: str) -> tuple[str, str]:
    """(path, name) of a scheme file with a fresh name."""
    name = f"user{next(_names)}"
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\n{body}')
    return str(path), name


def ok(res) -> None:
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output and "internal error" not in res.output


# --- case 3: a user's scheme trains, with its optimizer rules -----------------------


def test_train_runs_a_user_scheme_with_its_optimizer_rules(tmp_path):
    path, name = scheme_file(tmp_path, OPT_OK)
    out = tmp_path / "run"
    argv = ["train", *M, *SHORT, "--pre-norm", "--init", name, "--init-file", path]
    ok(runner.invoke(app, [*argv, "-q", "-o", str(out)]))
    groups = json.loads((out / "config.json").read_text())["param_groups"]
    (run,) = groups.values()
    lr = {g["name"]: g["lr"] for g in run}
    # the file's rule d0 / d at --base-width 256 (the default) and d = 32, of --lr 1e-2
    assert lr["hidden_matrix"] == pytest.approx(1e-2 * 256 / 32)
    assert lr["embedding"] == pytest.approx(1e-2)
    assert set(pd.read_csv(out / "runs.csv")["init"]) == {name}


def test_lr_sweep_runs_a_user_scheme(tmp_path):
    path, name = scheme_file(tmp_path, OPT_OK)
    out = tmp_path / "run"
    args = ["lr-sweep", *M, *SHORT, "--lr", "1e-2,3e-2", "--pre-norm", "--init", name, "--init-file", path]
    ok(runner.invoke(app, [*args, "-q", "-o", str(out)]))
    runs = pd.read_csv(out / "runs.csv")
    assert set(runs["init"]) == {name} and len(runs) == 2


def test_sweep_lr_sweep_points_run_a_user_scheme(tmp_path):
    path, name = scheme_file(tmp_path, OPT_OK)
    out = tmp_path / "swept"
    args = ["sweep", "--workers", "1", "lr-sweep", *M, *SHORT, "--lr", "1e-2,3e-2", "--pre-norm",
            "--init-file", path]  # fmt: skip
    ok(runner.invoke(app, [*args, "-q", "-o", str(out)]))
    assert set(pd.read_csv(out / "runs.csv")["init"]) == {name}


def test_run_train_takes_a_user_scheme(tmp_path):
    """The library: run_train with the scheme carried by the InitConfig."""
    from tinit.experiments.training.data import load_data
    from tinit.experiments.training.grid import TrainGrid
    from tinit.experiments.training.train import run_train
    from tinit.experiments.training.trainer import TrainConfig
    from tinit.model.config import InitConfig, ModelConfig, RunConfig
    from tinit.model.scheme_file import load_scheme

    path, name = scheme_file(tmp_path, OPT_OK)
    scheme = load_scheme(path)
    data = load_data("markov", vocab=64, seq_len=16, batch=2, seed=0, eval_batches=1)
    r = run_train(TrainGrid(ModelConfig(n_layers=2, d_model=32, n_heads=2, vocab_size=64),
                            InitConfig(schemes=(scheme,)), RunConfig(device="cpu", seq_len=16, batch=2),
                            TrainConfig(steps=2, eval_every=1), data, [name], ["pre"], [2], [0]))  # fmt: skip
    assert r.complete and set(r["runs"]["init"]) == {name}
    hidden = next(g for g in r.meta["param_groups"][f"{name}/pre"] if g["name"] == "hidden_matrix")
    assert hidden["lr"] == pytest.approx(TrainConfig().lr * 256 / 32)


def test_a_user_schemes_zero_matrix_has_no_update_ratio_at_step_1_not_a_nan(tmp_path):
    """||W_before|| of a zero-initialised W_O is 0: step 1's ratio is not applicable (an
    empty cell), as for the catalogue's zero-out, not a flagged non-finite value."""
    path, name = scheme_file(tmp_path, '[roles]\no = { dist = "zero" }\n')
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", *M, *SHORT, "--pre-norm", "--init-file", path, "-q", "-o", str(out)])
    ok(res)
    assert "not finite" not in res.output
    assert json.loads((out / "config.json").read_text())["non_finite_total"] == 0
    r = pd.read_csv(out / "update_ratios.csv", keep_default_na=False, dtype=str)
    first = r[(r["step"] == "1") & r["tensor"].eq("o")]
    assert len(first) == 2 and (first["update_ratio"] == "").all()


# --- case 4: --init-file is never dropped ------------------------------------------

#: Each command that takes --init and --init-file, at a tiny size, and the CSV naming
#: the scheme of every row.
COMMANDS = {
    "variance": (["variance", *M, "--layers", "2", "--pre-norm"], "variance.csv"),
    "grad-norms": (["grad-norms", *M, "--layers", "2", "--pre-norm"], "grad_norms.csv"),
    "depth-sweep": (
        [
            "depth-sweep",
            *M,
            "--layers",
            "2,3",
            "--seeds",
            "1",
            "--transfer-from",
            "2",
            "--pre-norm",
            "--no-grads",
        ],
        "depth_sweep.csv",
    ),  # fmt: skip
    "train": (["train", *M, *SHORT, "--pre-norm"], "runs.csv"),
    "lr-sweep": (["lr-sweep", *M, *SHORT, "--lr", "1e-2,3e-2", "--pre-norm"], "runs.csv"),
    "coord-check": (
        [
            "coord-check",
            "--d-model",
            "16,32",
            "--heads",
            "2",
            "--seq-len",
            "8",
            "--batch",
            "2",
            "--vocab",
            "16",
            "--layers",
            "2",
            "--steps",
            "1",
            "--seeds",
            "1",
        ],
        "coord_check.csv",
    ),  # fmt: skip
}


def schemes_run(tmp_path: Path, command: str, *args: str) -> set[str]:
    argv, csv = COMMANDS[command]
    out = tmp_path / f"run{next(_names)}"
    ok(runner.invoke(app, [*argv, *args, "-q", "-o", str(out)]))
    return set(pd.read_csv(out / csv)["init"])


@pytest.mark.parametrize("command", list(COMMANDS))
def test_init_and_init_file_run_both(tmp_path, command):
    """`--init gpt2 --init-file F`: gpt2 and F's scheme (F was dropped in every command)."""
    path, name = scheme_file(tmp_path, '[roles]\no = "sigma / sqrt(L)"\n')
    assert schemes_run(tmp_path, command, "--init", "gpt2", "--init-file", path) == {"gpt2", name}


@pytest.mark.parametrize("command", ["coord-check", "lr-sweep"])
def test_init_file_alone_runs_its_scheme_whatever_the_default(tmp_path, command):
    """coord-check (default gpt2,mup) and lr-sweep (default scaled) ran their defaults."""
    path, name = scheme_file(tmp_path, '[roles]\no = "sigma / sqrt(L)"\n')
    assert schemes_run(tmp_path, command, "--init-file", path) == {name}


def test_init_naming_the_file_keeps_its_order(tmp_path):
    from tinit.cli.configs import Options

    path, name = scheme_file(tmp_path, "")
    named = Options({"init": f"{name},naive", "init_file": Path(path)})
    assert named.inits == (name, "naive")
    assert Options({"init": "gpt2", "init_file": Path(path)}).inits == ("gpt2", name)
    assert Options({"init": "both", "init_file": Path(path)}).inits == (name,)


# --- case 5: optimizer formulas at the run's own shape ------------------------------


COORD = ["--d-model", "32,64", "--heads", "2", "--seq-len", "8", "--batch", "2", "--vocab", "16",
         "--layers", "2", "--steps", "1", "--seeds", "1"]  # fmt: skip


def rule(group: str, formula: str) -> str:
    return f'[optimizer.{group}]\nlr = "{formula}"\n'


@pytest.mark.parametrize(
    ("body", "args", "words"),
    [
        (rule("hidden_matrix", "(L-2)^2"), [], "optimizer.hidden_matrix.lr (L-2)^2 is 0 at L=2"),
        (rule("embedding", "tied - 0.5"), ["--untie"], "optimizer.embedding.lr tied - 0.5 is -0.5"),
        (rule("hidden_matrix", "1/(d-32)"), [], "optimizer.hidden_matrix.lr 1/(d-32) is inf at L=2, d=32"),
        ('[optimizer.hidden_matrix]\nweight_decay = "d - 33"\n', [], "weight_decay d - 33 is -1"),
        ('[optimizer.readout]\neps = "d - 32"\n', ["--untie"], "optimizer.readout.eps d - 32 is 0"),
    ],
)
def test_an_optimizer_rule_out_of_range_at_the_runs_shape_is_refused_before_training(
    tmp_path, body, args, words
):
    path, _ = scheme_file(tmp_path, body)
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", *M, *SHORT, *args, "--init-file", path, "-o", str(out)])
    assert_one_line_error(res, "--init-file", out)
    assert words in res.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["lr-sweep", *M, *SHORT, "--lr", "1e-2,3e-2"],
        ["coord-check", *COORD],
        ["sweep", "lr-sweep", *M, *SHORT, "--lr", "1e-2,3e-2"],
        ["sweep", "coord-check", *COORD],
    ],
    ids=["lr-sweep", "coord-check", "sweep-lr-sweep", "sweep-coord-check"],
)  # fmt: skip
def test_every_training_command_checks_the_rules_at_its_shapes(tmp_path, argv):
    """d = 32 is one width of coord-check's list (the FormulaError stopped it part-way)."""
    path, _ = scheme_file(tmp_path, rule("hidden_matrix", "1/(d-32)"))
    out = tmp_path / "run"
    res = runner.invoke(app, [*argv, "--init-file", path, "-o", str(out)])
    assert_one_line_error(res, "--init-file", out)
    assert "optimizer.hidden_matrix.lr 1/(d-32) is inf" in res.stderr


def test_a_rule_the_run_does_not_apply_is_not_refused(tmp_path):
    """--param-rules off trains with one lr: the file's rule is not used, so not refused."""
    path, name = scheme_file(tmp_path, rule("hidden_matrix", "(L-2)^2"))
    out = tmp_path / "off"
    ok(runner.invoke(app, ["train", *M, *SHORT, "--pre-norm", "--param-rules", "off", "--init-file", path,
                           "-q", "-o", str(out)]))  # fmt: skip
    (run,) = json.loads((out / "config.json").read_text())["param_groups"].values()
    assert [g["lr"] for g in run] == pytest.approx([1e-2] * len(run))


def test_run_train_refuses_a_bad_rule_before_any_step(tmp_path):
    from tinit.experiments.training.data import load_data
    from tinit.experiments.training.grid import TrainGrid
    from tinit.experiments.training.train import run_train
    from tinit.experiments.training.trainer import TrainConfig
    from tinit.model.config import ConfigError, InitConfig, ModelConfig, RunConfig
    from tinit.model.scheme_file import load_scheme

    path, name = scheme_file(tmp_path, rule("hidden_matrix", "(L-2)^2"))
    data = load_data("markov", vocab=64, seq_len=16, batch=2, seed=0, eval_batches=1)
    steps = []
    with pytest.raises(ConfigError) as err:
        init = InitConfig(schemes=(load_scheme(path),))
        run = RunConfig(device="cpu", seq_len=16, batch=2)
        grid = TrainGrid(ModelConfig(n_layers=2, d_model=32, n_heads=2, vocab_size=64), init, run,
                         TrainConfig(steps=2, eval_every=1), data, [name], ["pre"], [2], [0])  # fmt: skip
        run_train(grid, progress=lambda done, total: steps.append(done))
    assert err.value.field == "init_file" and "(L-2)^2 is 0 at L=2" in err.value.message
    assert steps == []
